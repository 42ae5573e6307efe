// layers/models/unet.cpp: the UNet, its blocks and the space-to-depth packing of its chain.
#include "layers/models/unet.h"

#include <algorithm>

#include "core/autograd.h"
#include "core/check.h"
#include "core/ops.h"
#include "core/profile.h"
#include "layers/activation.h"
#include "layers/batchnorm.h"
#include "layers/norm.h"
#include "layers/pooling.h"
#include "layers/recompute.h"

namespace ringtrain {

Tensor space_to_depth(const Tensor& x, int64_t f) {
  if (f == 1) return x;
  RT_CHECK(x.ndim() == 4 && x.size(1) % f == 0 && x.size(2) % f == 0, "space_to_depth: ", x.describe(),
           " is not (N, H, W, C) with H and W multiples of ", f);
  const int64_t n = x.size(0), h = x.size(1) / f, w = x.size(2) / f, c = x.size(3);
  return permute(x.reshape(Shape{n, h, f, w, f, c}), {0, 1, 3, 2, 4, 5}).reshape(Shape{n, h, w, f * f * c});
}

Tensor depth_to_space(const Tensor& x, int64_t f) {
  if (f == 1) return x;
  RT_CHECK(x.ndim() == 4 && x.size(3) % (f * f) == 0, "depth_to_space: ", x.describe(),
           " is not (N, H, W, C) with C a multiple of ", f * f);
  const int64_t n = x.size(0), h = x.size(1), w = x.size(2), c = x.size(3) / (f * f);
  return permute(x.reshape(Shape{n, h, w, f, f, c}), {0, 1, 3, 2, 4, 5}).reshape(Shape{n, h * f, w * f, c});
}

namespace {

std::shared_ptr<Module> norm(int64_t channels, int64_t groups, DType dtype) {
  if (groups > 0) return std::make_shared<GroupNorm>(groups, channels, 1e-5, true, dtype);
  return std::make_shared<BatchNorm2d>(channels, 0.1, 1e-5, dtype);
}

Conv2dOptions conv3x3(DType dtype) { return {.kernel_h = 3, .kernel_w = 3, .padding = 1, .dtype = dtype}; }

// The outc holder: a module with one child named conv (outc.conv.weight).
class OutConv : public Module {
 public:
  explicit OutConv(std::shared_ptr<Conv2d> conv) : conv_(register_module("conv", std::move(conv))) {}
  Tensor forward(const Tensor& x) override { return (*conv_)(x); }
  std::string type_name() const override { return "OutConv"; }

 private:
  std::shared_ptr<Conv2d> conv_;
};

}  // namespace

DoubleConv::DoubleConv(int64_t in, int64_t out, int64_t groups, DType dtype) : batch_norm_(groups == 0) {
  RT_CHECK(groups == 0 || out % groups == 0, "UNet: ", groups, " GroupNorm groups do not divide ", out, " channels");
  double_conv_ = register_module("double_conv", std::make_shared<Sequential>());
  double_conv_->add(std::make_shared<Conv2d>(in, out, conv3x3(dtype)));
  double_conv_->add(norm(out, groups, dtype));
  double_conv_->add(std::make_shared<ReLU>());
  double_conv_->add(std::make_shared<Conv2d>(out, out, conv3x3(dtype)));
  double_conv_->add(norm(out, groups, dtype));
  double_conv_->add(std::make_shared<ReLU>());
}

Tensor DoubleConv::forward(const Tensor& x) {
  Sequential& s = *double_conv_;
  Tensor y = x;
  for (size_t k : {size_t{0}, size_t{3}}) {
    y = s[k](y);
    if (batch_norm_)
      y = static_cast<BatchNorm2d&>(s[k + 1]).forward_relu(y);  // batch norm and its ReLU in one pass
    else
      y = s[k + 2](s[k + 1](y));
  }
  return y;
}

UNetDown::UNetDown(int64_t in, int64_t out, int64_t groups, DType dtype) {
  maxpool_conv_ = register_module(
      "maxpool_conv", std::make_shared<Sequential>(std::initializer_list<std::shared_ptr<Module>>{
                          std::make_shared<MaxPool2d>(2, 2), std::make_shared<DoubleConv>(in, out, groups, dtype)}));
}

UNetUp::UNetUp(int64_t in, int64_t out, int64_t groups, DType dtype) {
  up_ = register_module(
      "up", std::make_shared<ConvTranspose2d>(
                in, in / 2, ConvTranspose2dOptions{.kernel_h = 2, .kernel_w = 2, .stride = 2, .dtype = dtype}));
  conv_ = register_module("conv", std::make_shared<DoubleConv>(in, out, groups, dtype));
}

Tensor UNetUp::forward(const Tensor& x) {
  RT_THROW("UNetUp '", path(), "' takes the upsampled features and the encoder's: call forward(x, skip), not on ",
           x.describe());
}

Tensor UNetUp::forward(const Tensor& x, const Tensor& skip) { return (*conv_)(cat({skip, (*up_)(x)}, -1)); }

UNet::UNet(UNetOptions o) : options_(o) {
  RT_CHECK(o.in_channels > 0 && o.num_classes > 0 && o.width > 0 && o.depth >= 1 && o.depth <= 8 && o.groups >= 0,
           "UNet: in_channels (", o.in_channels, "), num_classes (", o.num_classes, ") and width (", o.width,
           ") must be positive, depth (", o.depth, ") in 1..8, groups (", o.groups, ") >= 0");
  inc_ = register_module("inc", std::make_shared<DoubleConv>(o.in_channels, channels(0), o.groups, o.dtype));
  for (int64_t l = 1; l <= o.depth; ++l)
    downs_.push_back(register_module("down" + std::to_string(l),
                                     std::make_shared<UNetDown>(channels(l - 1), channels(l), o.groups, o.dtype)));
  for (int64_t l = o.depth; l >= 1; --l)
    ups_.push_back(register_module("up" + std::to_string(o.depth - l + 1),
                                   std::make_shared<UNetUp>(channels(l), channels(l - 1), o.groups, o.dtype)));
  outc_ = std::make_shared<Conv2d>(channels(0), o.num_classes,
                                   Conv2dOptions{.kernel_h = 1, .kernel_w = 1, .bias = Bias::With, .dtype = o.dtype});
  outc_holder_ = register_module("outc", std::make_shared<OutConv>(outc_));
  recompute_.assign(static_cast<size_t>(2 * o.depth + 2), false);
}

void UNet::check_input(const Tensor& x) const {
  const int64_t f = int64_t{1} << options_.depth;
  if (x.ndim() != 4 || x.size(3) != options_.in_channels || x.size(1) % f != 0 || x.size(2) % f != 0 || x.size(1) == 0)
    RT_THROW("UNet (depth ", options_.depth, "): input ", x.describe(), " must be (N, H, W, ", options_.in_channels,
             ") with H and W multiples of ", f);
}

Tensor UNet::forward(const Tensor& x) {
  check_input(x);
  if (grad_enabled() && std::find(recompute_.begin(), recompute_.end(), true) != recompute_.end()) {
    // --recompute: the chain, its marked blocks recomputed (each keeps only its packed input).
    Tensor y = x;
    const std::vector<Block> chain = blocks();
    for (size_t i = 0; i < chain.size(); ++i) {
      if (!recompute_[i]) {
        y = chain[i].forward(y);
        continue;
      }
      std::vector<const Module*> modules;
      for (const auto& m : chain[i].modules) modules.push_back(m.get());
      y = recompute(chain[i].forward, y, modules);
    }
    return y;
  }
  std::vector<Tensor> skips{(*inc_)(x)};
  for (auto& down : downs_) skips.push_back((*down)(skips.back()));
  Tensor y = skips.back();
  for (size_t i = 0; i < ups_.size(); ++i) y = ups_[i]->forward(y, skips[skips.size() - 2 - i]);
  return (*outc_holder_)(y);
}

// The chain: at level l (resolution 1 / 2^l) a link holds the current features (channels(l)) followed by the
// features of levels `pending` still to be read, each space-to-depth'ed to level l: concatenated over channels.
namespace {

struct Link {
  int64_t level;
  std::vector<int64_t> pending;  // levels whose features ride along, nearest first
};

}  // namespace

std::vector<Block> UNet::blocks() {
  const int64_t depth = options_.depth;
  auto widths = [this](const Link& k) {
    std::vector<int64_t> w{channels(k.level)};
    for (int64_t p : k.pending) w.push_back(channels(p) << (2 * (k.level - p)));
    return w;
  };
  auto unpack = [widths](const Tensor& packed, const Link& k) {
    std::vector<int64_t> w = widths(k);
    std::vector<Tensor> parts = split(packed, w, -1);
    for (size_t i = 1; i < parts.size(); ++i)
      parts[i] = depth_to_space(parts[i], int64_t{1} << (k.level - k.pending[i - 1]));
    return parts;  // current, then each pending level's features at its own resolution
  };
  auto pack = [](const Tensor& current, const std::vector<Tensor>& skips, const Link& k) {
    std::vector<Tensor> parts{current};
    for (size_t i = 0; i < skips.size(); ++i)
      parts.push_back(space_to_depth(skips[i], int64_t{1} << (k.level - k.pending[i])));
    return parts.size() == 1 ? current : cat(parts, -1);
  };
  std::vector<Block> out;
  // inc: the image -> level 0, nothing pending.
  out.push_back({"inc",
                 {inc_},
                 [this](const Tensor& x) {
                   check_input(x);
                   return inc_->forward(x);
                 },
                 {}});
  // down l: level l - 1 with pending {l - 2 .. 0} -> level l with pending {l - 1 .. 0}.
  for (int64_t l = 1; l <= depth; ++l) {
    Link in{l - 1, {}}, next{l, {}};
    for (int64_t p = l - 2; p >= 0; --p) in.pending.push_back(p);
    for (int64_t p = l - 1; p >= 0; --p) next.pending.push_back(p);
    auto down = downs_[static_cast<size_t>(l - 1)];
    out.push_back({"down" + std::to_string(l),
                   {down},
                   [down, in, next, unpack, pack](const Tensor& x) {
                     std::vector<Tensor> parts = unpack(x, in);
                     std::vector<Tensor> skips{parts[0]};
                     skips.insert(skips.end(), parts.begin() + 1, parts.end());
                     return pack(down->forward(parts[0]), skips, next);
                   },
                   {}});
  }
  // up i: level l with pending {l - 1 .. 0} -> level l - 1 with pending {l - 2 .. 0}.
  for (int64_t i = 1; i <= depth; ++i) {
    const int64_t l = depth - i + 1;
    Link in{l, {}}, next{l - 1, {}};
    for (int64_t p = l - 1; p >= 0; --p) in.pending.push_back(p);
    for (int64_t p = l - 2; p >= 0; --p) next.pending.push_back(p);
    auto up = ups_[static_cast<size_t>(i - 1)];
    out.push_back({"up" + std::to_string(i),
                   {up},
                   [up, in, next, unpack, pack](const Tensor& x) {
                     std::vector<Tensor> parts = unpack(x, in);
                     Tensor y = up->forward(parts[0], parts[1]);
                     return pack(y, std::vector<Tensor>(parts.begin() + 2, parts.end()), next);
                   },
                   {}});
  }
  out.push_back({"outc", {outc_holder_}, [this](const Tensor& x) { return outc_holder_->forward(x); }, {}});
  for (size_t i = 0; i < out.size(); ++i) out[i].set_recompute = [this, i](bool on) { recompute_[i] = on; };
  return out;
}

}  // namespace ringtrain
