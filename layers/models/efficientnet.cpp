// layers/models/efficientnet.cpp: MBConv and EfficientNet.
#include "layers/models/efficientnet.h"

#include <cmath>

#include "core/autograd.h"
#include "core/check.h"
#include "core/ops.h"
#include "layers/blocks.h"
#include "layers/linear.h"
#include "layers/models/mobilenet.h"

namespace ringtrain {
namespace {

struct Variant {
  std::string name;
  double width, depth, dropout;
};
const std::vector<Variant>& variants() {
  static const std::vector<Variant> v{{"b0", 1.0, 1.0, 0.2}, {"b1", 1.0, 1.1, 0.2}, {"b2", 1.1, 1.2, 0.3},
                                      {"b3", 1.2, 1.4, 0.3}, {"b4", 1.4, 1.8, 0.4}, {"b5", 1.6, 2.2, 0.4},
                                      {"b6", 1.8, 2.6, 0.5}, {"b7", 2.0, 3.1, 0.5}};
  return v;
}

}  // namespace

MBConv::MBConv(int64_t in, int64_t out, int64_t kernel, int64_t stride, int64_t expand_ratio, double drop_path,
               DType dtype) {
  RT_CHECK(stride == 1 || stride == 2, "MBConv: stride must be 1 or 2, got ", stride);
  residual_ = stride == 1 && in == out;
  const int64_t expanded = make_divisible(static_cast<double>(in * expand_ratio), 8);
  block_ = register_module("block", std::make_shared<Sequential>());
  if (expanded != in)
    block_->add(conv_norm_activation(in, expanded, {.kernel = 1, .activation = "SiLU", .dtype = dtype}));
  block_->add(conv_norm_activation(
      expanded, expanded,
      {.kernel = kernel, .stride = stride, .groups = expanded, .activation = "SiLU", .dtype = dtype}));
  block_->add(std::make_shared<SqueezeExcitation>(expanded, std::max<int64_t>(1, in / 4), "SiLU", "Sigmoid", dtype));
  block_->add(conv_norm_activation(expanded, out, {.kernel = 1, .activation = "", .dtype = dtype}));
  stochastic_depth_ = register_module("stochastic_depth", std::make_shared<DropPath>(drop_path));
}

Tensor MBConv::forward(const Tensor& x) {
  Tensor y = block_->forward(x);
  if (!residual_) return y;
  return add((*stochastic_depth_)(y), x);
}

EfficientNet::EfficientNet(EfficientNetOptions o) {
  const Variant* v = nullptr;
  for (const Variant& c : variants())
    if (c.name == o.variant) v = &c;
  RT_CHECK(v, "EfficientNet: unknown variant '", o.variant, "' (expected b0 .. b7)");
  RT_CHECK(o.in_channels > 0 && o.num_classes > 0, "EfficientNet: in_channels (", o.in_channels, ") and num_classes (",
           o.num_classes, ") must be positive");
  RT_CHECK(o.stochastic_depth >= 0 && o.stochastic_depth <= 1, "EfficientNet: stochastic depth ", o.stochastic_depth,
           " must be in [0, 1]");
  const double dropout = o.dropout >= 0 ? o.dropout : v->dropout;
  RT_CHECK(dropout < 1, "EfficientNet: dropout ", dropout, " must be below 1");
  auto width = [&](int64_t c) { return make_divisible(static_cast<double>(c) * v->width, 8); };
  auto depth = [&](int64_t n) { return static_cast<int64_t>(std::ceil(static_cast<double>(n) * v->depth)); };
  struct Stage {
    int64_t expand, kernel, stride, in, out, layers;
  };
  const std::vector<Stage> setting{{1, 3, 1, 32, 16, 1},  {6, 3, 2, 16, 24, 2},  {6, 5, 2, 24, 40, 2},
                                   {6, 3, 2, 40, 80, 3},  {6, 5, 1, 80, 112, 3}, {6, 5, 2, 112, 192, 4},
                                   {6, 3, 1, 192, 320, 1}};
  features_ = register_module("features", std::make_shared<Sequential>());
  features_->add(conv_norm_activation(o.in_channels, width(setting[0].in),
                                      {.kernel = 3, .stride = 2, .activation = "SiLU", .dtype = o.dtype}));
  int64_t total = 0;
  for (const Stage& s : setting) total += depth(s.layers);
  int64_t id = 0;
  for (const Stage& s : setting) {
    auto stage = std::make_shared<Sequential>();
    for (int64_t i = 0; i < depth(s.layers); ++i, ++id) {
      const double p = o.stochastic_depth * static_cast<double>(id) / static_cast<double>(total);
      stage->add(std::make_shared<MBConv>(i == 0 ? width(s.in) : width(s.out), width(s.out), s.kernel,
                                          i == 0 ? s.stride : 1, s.expand, p, o.dtype));
    }
    features_->add(stage);
  }
  const int64_t last_in = width(setting.back().out), last = 4 * last_in;
  features_->add(conv_norm_activation(last_in, last, {.kernel = 1, .activation = "SiLU", .dtype = o.dtype}));
  classifier_ = register_module("classifier", std::make_shared<Sequential>());
  classifier_->add(std::make_shared<Dropout>(dropout));
  auto fc = std::make_shared<Linear>(last, o.num_classes, Bias::With, o.dtype);
  classifier_->add(fc);
  init_conv_bn_fan_out(*this);
  NoGradGuard no_grad;
  const double range = 1.0 / std::sqrt(static_cast<double>(o.num_classes));
  Tensor(fc->weight())
      .copy_(Tensor::uniform(fc->weight().shape(), -range, range, default_seed(), fc->weight().dtype(), Device::cpu(),
                             next_rng_stream()));
  Tensor(fc->bias()).zero_();
}

Tensor EfficientNet::head(const Tensor& x) { return classifier_->forward(adaptive_avg_pool2d(x, 1, 1).flatten(1)); }

Tensor EfficientNet::forward(const Tensor& x) { return head(features_->forward(x)); }

std::vector<Block> EfficientNet::blocks() {
  std::vector<Block> out;
  const std::vector<Block> stages = features_->blocks();
  for (size_t i = 0; i < stages.size(); ++i) {
    auto* stage = dynamic_cast<Sequential*>(stages[i].modules.front().get());
    const bool mbconv_stage = stage && i > 0 && i + 1 < stages.size();
    if (!mbconv_stage) {
      out.push_back({"features." + stages[i].name, stages[i].modules, stages[i].forward, stages[i].set_recompute});
      continue;
    }
    for (const Block& b : stage->blocks())
      out.push_back({"features." + stages[i].name + "." + b.name, b.modules, b.forward, b.set_recompute});
  }
  out.push_back({"head", {classifier_}, [this](const Tensor& x) { return head(x); }, {}});
  return out;
}

}  // namespace ringtrain
