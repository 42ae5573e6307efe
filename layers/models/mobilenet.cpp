// layers/models/mobilenet.cpp: MobileNetV2's inverted residual blocks and the network.
#include "layers/models/mobilenet.h"

#include <cmath>

#include "core/autograd.h"
#include "core/check.h"
#include "core/ops.h"
#include "layers/batchnorm.h"
#include "layers/blocks.h"
#include "layers/conv2d.h"

namespace ringtrain {

int64_t make_divisible(double v, int64_t divisor, int64_t min_value) {
  if (min_value == 0) min_value = divisor;
  int64_t out = std::max(min_value, static_cast<int64_t>(v + static_cast<double>(divisor) / 2) / divisor * divisor);
  if (static_cast<double>(out) < 0.9 * v) out += divisor;
  return out;
}

void init_conv_bn_fan_out(Module& model) {
  NoGradGuard no_grad;
  model.for_each_module([](const Module& m) {
    if (auto* c = dynamic_cast<const Conv2d*>(&m)) {
      const_cast<Conv2d*>(c)->kaiming_normal_fan_out(default_seed(), next_rng_stream());
      if (c->bias().defined()) Tensor(c->bias()).zero_();
    } else if (auto* b = dynamic_cast<const BatchNorm2d*>(&m)) {
      Tensor(b->weight()).fill_(1.0);
      Tensor(b->bias()).zero_();
    }
  });
}

InvertedResidual::InvertedResidual(int64_t in, int64_t out, int64_t stride, int64_t expand_ratio, DType dtype) {
  RT_CHECK(stride == 1 || stride == 2, "InvertedResidual: stride must be 1 or 2, got ", stride);
  const auto hidden = static_cast<int64_t>(std::llround(static_cast<double>(in * expand_ratio)));
  residual_ = stride == 1 && in == out;
  conv_ = register_module("conv", std::make_shared<Sequential>());
  if (expand_ratio != 1)
    conv_->add(conv_norm_activation(in, hidden, {.kernel = 1, .activation = "ReLU6", .dtype = dtype}));
  conv_->add(conv_norm_activation(
      hidden, hidden, {.kernel = 3, .stride = stride, .groups = hidden, .activation = "ReLU6", .dtype = dtype}));
  conv_->add(std::make_shared<Conv2d>(hidden, out, Conv2dOptions{.kernel_h = 1, .kernel_w = 1, .dtype = dtype}));
  conv_->add(std::make_shared<BatchNorm2d>(out, 0.1, 1e-5, dtype));
}

Tensor InvertedResidual::forward(const Tensor& x) {
  Tensor y = conv_->forward(x);
  return residual_ ? add(x, y) : y;
}

MobileNetV2::MobileNetV2(MobileNetV2Options o) {
  RT_CHECK(o.in_channels > 0 && o.num_classes > 0, "MobileNetV2: in_channels (", o.in_channels, ") and num_classes (",
           o.num_classes, ") must be positive");
  RT_CHECK(o.width_mult > 0 && o.dropout >= 0 && o.dropout < 1, "MobileNetV2: width_mult ", o.width_mult,
           " must be > 0 and dropout ", o.dropout, " in [0, 1)");
  struct Stage {
    int64_t t, c, n, s;
  };
  const std::vector<Stage> setting{{1, 16, 1, 1}, {6, 24, 2, 2},  {6, 32, 3, 2}, {6, 64, 4, 2},
                                   {6, 96, 3, 1}, {6, 160, 3, 2}, {6, 320, 1, 1}};
  int64_t in = make_divisible(32 * o.width_mult, 8);
  const int64_t last = make_divisible(1280 * std::max(1.0, o.width_mult), 8);
  features_ = register_module("features", std::make_shared<Sequential>());
  features_->add(
      conv_norm_activation(o.in_channels, in, {.kernel = 3, .stride = 2, .activation = "ReLU6", .dtype = o.dtype}));
  for (const Stage& st : setting) {
    const int64_t out = make_divisible(static_cast<double>(st.c) * o.width_mult, 8);
    for (int64_t i = 0; i < st.n; ++i) {
      features_->add(std::make_shared<InvertedResidual>(in, out, i == 0 ? st.s : 1, st.t, o.dtype));
      in = out;
    }
  }
  features_->add(conv_norm_activation(in, last, {.kernel = 1, .activation = "ReLU6", .dtype = o.dtype}));
  classifier_ = register_module("classifier", std::make_shared<Sequential>());
  classifier_->add(std::make_shared<Dropout>(o.dropout));
  auto fc = std::make_shared<Linear>(last, o.num_classes, Bias::With, o.dtype);
  classifier_->add(fc);
  init_conv_bn_fan_out(*this);
  NoGradGuard no_grad;
  Tensor(fc->weight())
      .copy_(Tensor::normal(fc->weight().shape(), 0.0, 0.01, default_seed(), fc->weight().dtype(), Device::cpu(),
                            next_rng_stream()));
  Tensor(fc->bias()).zero_();
}

Tensor MobileNetV2::head(const Tensor& x) { return classifier_->forward(adaptive_avg_pool2d(x, 1, 1).flatten(1)); }

Tensor MobileNetV2::forward(const Tensor& x) { return head(features_->forward(x)); }

std::vector<Block> MobileNetV2::blocks() {
  std::vector<Block> out;
  for (const Block& b : features_->blocks())
    out.push_back({"features." + b.name, b.modules, b.forward, b.set_recompute});
  out.push_back({"head", {classifier_}, [this](const Tensor& x) { return head(x); }, {}});
  return out;
}

}  // namespace ringtrain
