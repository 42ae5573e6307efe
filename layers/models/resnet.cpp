// layers/models/resnet.cpp: blocks, stages and the two ResNet stems.
#include "layers/models/resnet.h"

#include "core/autograd.h"
#include "core/check.h"
#include "core/ops.h"
#include "layers/recompute.h"

namespace ringtrain {
namespace {

std::shared_ptr<Conv2d> conv(int64_t in, int64_t out, int64_t k, int64_t stride, int64_t pad, DType dtype) {
  return std::make_shared<Conv2d>(
      in, out, Conv2dOptions{.kernel_h = k, .kernel_w = k, .stride = stride, .padding = pad, .dtype = dtype});
}

// torchvision's init for every convolution of the model.
void he_init(Conv2d& c) { c.kaiming_normal_fan_out(default_seed(), next_rng_stream()); }

void zero_weight(BatchNorm2d& bn) {
  NoGradGuard no_grad;
  Tensor(bn.weight()).zero_();
}

std::shared_ptr<Sequential> make_downsample(int64_t in, int64_t out, int64_t stride, DType dtype) {
  if (stride == 1 && in == out) return nullptr;
  return std::make_shared<Sequential>(std::initializer_list<std::shared_ptr<Module>>{
      conv(in, out, 1, stride, 0, dtype), std::make_shared<BatchNorm2d>(out, 0.1, 1e-5, dtype)});
}

void init_downsample(Sequential* d) {
  if (d) he_init(static_cast<Conv2d&>((*d)[0]));
}

struct ArchSpec {
  std::string name;
  bool cifar;
  bool bottleneck;
  std::vector<int64_t> blocks;
};

const std::vector<ArchSpec>& specs() {
  static const std::vector<ArchSpec> kSpecs{
      {"resnet20", true, false, {3, 3, 3}},      {"resnet32", true, false, {5, 5, 5}},
      {"resnet44", true, false, {7, 7, 7}},      {"resnet56", true, false, {9, 9, 9}},
      {"resnet110", true, false, {18, 18, 18}},  {"resnet18", false, false, {2, 2, 2, 2}},
      {"resnet34", false, false, {3, 4, 6, 3}},  {"resnet50", false, true, {3, 4, 6, 3}},
      {"resnet101", false, true, {3, 4, 23, 3}}, {"resnet152", false, true, {3, 8, 36, 3}},
  };
  return kSpecs;
}

}  // namespace

const std::vector<std::string>& resnet_archs() {
  static const std::vector<std::string> names = [] {
    std::vector<std::string> n;
    for (const auto& s : specs()) n.push_back(s.name);
    return n;
  }();
  return names;
}

BasicBlock::BasicBlock(int64_t in, int64_t planes, int64_t stride, DType dtype) {
  conv1_ = register_module("conv1", conv(in, planes, 3, stride, 1, dtype));
  bn1_ = register_module("bn1", std::make_shared<BatchNorm2d>(planes, 0.1, 1e-5, dtype));
  conv2_ = register_module("conv2", conv(planes, planes, 3, 1, 1, dtype));
  bn2_ = register_module("bn2", std::make_shared<BatchNorm2d>(planes, 0.1, 1e-5, dtype));
  if (auto d = make_downsample(in, planes * kExpansion, stride, dtype)) downsample_ = register_module("downsample", d);
}

void BasicBlock::init_weights(bool zero_init_residual) {
  he_init(*conv1_);
  he_init(*conv2_);
  init_downsample(downsample_.get());
  if (zero_init_residual) zero_weight(*bn2_);
}

Tensor BasicBlock::forward(const Tensor& x) {
  Tensor out = bn1_->forward_relu(conv1_->forward(x));
  Tensor identity = downsample_ ? downsample_->forward(x) : x;
  return bn2_->forward_add_relu(conv2_->forward(out), identity);
}

Bottleneck::Bottleneck(int64_t in, int64_t planes, int64_t stride, DType dtype) {
  conv1_ = register_module("conv1", conv(in, planes, 1, 1, 0, dtype));
  bn1_ = register_module("bn1", std::make_shared<BatchNorm2d>(planes, 0.1, 1e-5, dtype));
  conv2_ = register_module("conv2", conv(planes, planes, 3, stride, 1, dtype));
  bn2_ = register_module("bn2", std::make_shared<BatchNorm2d>(planes, 0.1, 1e-5, dtype));
  conv3_ = register_module("conv3", conv(planes, planes * kExpansion, 1, 1, 0, dtype));
  bn3_ = register_module("bn3", std::make_shared<BatchNorm2d>(planes * kExpansion, 0.1, 1e-5, dtype));
  if (auto d = make_downsample(in, planes * kExpansion, stride, dtype)) downsample_ = register_module("downsample", d);
}

void Bottleneck::init_weights(bool zero_init_residual) {
  he_init(*conv1_);
  he_init(*conv2_);
  he_init(*conv3_);
  init_downsample(downsample_.get());
  if (zero_init_residual) zero_weight(*bn3_);
}

Tensor Bottleneck::forward(const Tensor& x) {
  Tensor out = bn1_->forward_relu(conv1_->forward(x));
  out = bn2_->forward_relu(conv2_->forward(out));
  Tensor identity = downsample_ ? downsample_->forward(x) : x;
  return bn3_->forward_add_relu(conv3_->forward(out), identity);
}

ResNet::ResNet(const std::string& arch, ResNetOptions o) : arch_(arch) {
  const ArchSpec* spec = nullptr;
  for (const auto& s : specs())
    if (s.name == arch) spec = &s;
  if (!spec) {
    std::string valid;
    for (const auto& n : resnet_archs()) valid += (valid.empty() ? "" : ", ") + n;
    RT_THROW("unknown architecture '", arch, "' (expected one of ", valid, ")");
  }
  RT_CHECK(o.in_channels > 0 && o.num_classes > 0, "ResNet: in_channels (", o.in_channels, ") and num_classes (",
           o.num_classes, ") must be positive");
  cifar_ = spec->cifar;
  const int64_t width = cifar_ ? 16 : 64;
  if (cifar_) {
    conv1_ = register_module("conv1", conv(o.in_channels, width, 3, 1, 1, o.dtype));
  } else {
    conv1_ = register_module("conv1", conv(o.in_channels, width, 7, 2, 3, o.dtype));
  }
  bn1_ = register_module("bn1", std::make_shared<BatchNorm2d>(width, 0.1, 1e-5, o.dtype));
  if (!cifar_) maxpool_ = register_module("maxpool", std::make_shared<MaxPool2d>(3, 2, 1));
  int64_t in = width;
  std::vector<std::function<void(bool)>> inits;
  for (size_t stage = 0; stage < spec->blocks.size(); ++stage) {
    const int64_t planes = width << stage;
    const int64_t stride = stage == 0 ? 1 : 2;
    auto seq = std::make_shared<Sequential>();
    for (int64_t b = 0; b < spec->blocks[stage]; ++b) {
      if (spec->bottleneck) {
        auto block = std::make_shared<Bottleneck>(in, planes, b == 0 ? stride : 1, o.dtype);
        inits.push_back([block](bool z) { block->init_weights(z); });
        seq->add(block);
        in = planes * Bottleneck::kExpansion;
      } else {
        auto block = std::make_shared<BasicBlock>(in, planes, b == 0 ? stride : 1, o.dtype);
        inits.push_back([block](bool z) { block->init_weights(z); });
        seq->add(block);
        in = planes * BasicBlock::kExpansion;
      }
    }
    stages_.push_back(register_module("layer" + std::to_string(stage + 1), seq));
  }
  fc_ = register_module("fc", std::make_shared<Linear>(in, o.num_classes, Bias::With, o.dtype));
  he_init(*conv1_);
  for (auto& init : inits) init(o.zero_init_residual);
}

Tensor ResNet::stem(const Tensor& x) {
  auto plain = [conv1 = conv1_.get(), bn1 = bn1_.get(), maxpool = maxpool_.get()](const Tensor& in) {
    Tensor y = bn1->forward_relu(conv1->forward(in));
    return maxpool ? maxpool->forward(y) : y;
  };
  if (!recompute_stem_ || !grad_enabled()) return plain(x);
  std::vector<const Module*> modules{conv1_.get(), bn1_.get()};
  if (maxpool_) modules.push_back(maxpool_.get());
  return recompute(plain, x, modules);
}

Tensor ResNet::forward(const Tensor& x) {
  Tensor y = stem(x);
  for (auto& stage : stages_) y = stage->forward(y);
  return (*fc_)(global_avg_pool(y));
}

std::vector<Block> ResNet::blocks() {
  std::vector<Block> out;
  Block stem{"stem", {conv1_, bn1_}, {}, {}};
  if (maxpool_) stem.modules.push_back(maxpool_);
  stem.forward = [this](const Tensor& x) { return this->stem(x); };
  stem.set_recompute = [this](bool on) { recompute_stem_ = on; };
  out.push_back(std::move(stem));
  for (size_t s = 0; s < stages_.size(); ++s)
    for (const Block& b : stages_[s]->blocks())
      out.push_back({detail::str_cat("layer", s + 1, ".", b.name), b.modules, b.forward, b.set_recompute});
  out.push_back({"head", {fc_}, [fc = fc_](const Tensor& x) { return (*fc)(global_avg_pool(x)); }, {}});
  return out;
}

}  // namespace ringtrain
