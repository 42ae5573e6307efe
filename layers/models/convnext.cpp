// layers/models/convnext.cpp: CNBlock and ConvNeXt.
#include "layers/models/convnext.h"

#include "core/autograd.h"
#include "core/check.h"
#include "core/ops.h"
#include "core/profile.h"
#include "layers/activation.h"
#include "layers/conv2d.h"
#include "layers/linear.h"
#include "layers/norm.h"

namespace ringtrain {
namespace {

struct Variant {
  std::string name;
  std::vector<int64_t> dims, depths;
  double stochastic_depth;
};
const std::vector<Variant>& variants() {
  static const std::vector<Variant> v{{"tiny", {96, 192, 384, 768}, {3, 3, 9, 3}, 0.1},
                                      {"small", {96, 192, 384, 768}, {3, 3, 27, 3}, 0.4},
                                      {"base", {128, 256, 512, 1024}, {3, 3, 27, 3}, 0.5},
                                      {"large", {192, 384, 768, 1536}, {3, 3, 27, 3}, 0.5}};
  return v;
}

constexpr double kNormEps = 1e-6;

// torchvision's init of every convolution and linear layer: trunc_normal(std 0.02) within +-2 (absolute bounds,
// a hundred standard deviations: a plain normal), zero biases.
void init_weights(Module& model) {
  NoGradGuard no_grad;
  model.for_each_module([](const Module& m) {
    const Tensor* w = nullptr;
    const Tensor* b = nullptr;
    if (auto* c = dynamic_cast<const Conv2d*>(&m)) {
      w = &c->weight();
      b = &c->bias();
    } else if (auto* l = dynamic_cast<const Linear*>(&m)) {
      w = &l->weight();
      b = &l->bias();
    }
    if (!w) return;
    Tensor(*w).copy_(
        Tensor::normal(w->shape(), 0.0, 0.02, default_seed(), w->dtype(), Device::cpu(), next_rng_stream()));
    if (b->defined()) Tensor(*b).zero_();
  });
}

}  // namespace

CNBlock::CNBlock(int64_t dim, double layer_scale, double drop_path, DType dtype) : dim_(dim) {
  block_ = register_module("block", std::make_shared<Sequential>());
  block_->add(std::make_shared<Conv2d>(
      dim, dim,
      Conv2dOptions{.kernel_h = 7, .kernel_w = 7, .padding = 3, .groups = dim, .bias = Bias::With, .dtype = dtype}));
  block_->add(std::make_shared<Identity>());  // torchvision's Permute to NHWC: the layout already
  block_->add(std::make_shared<LayerNorm>(dim, kNormEps, true, dtype));
  block_->add(std::make_shared<Linear>(dim, 4 * dim, Bias::With, dtype));
  block_->add(std::make_shared<GELU>());
  block_->add(std::make_shared<Linear>(4 * dim, dim, Bias::With, dtype));
  block_->add(std::make_shared<Identity>());  // and back
  layer_scale_ = register_parameter(
      "layer_scale", Tensor::full(Shape{dim, 1, 1}, layer_scale, dtype == DType::F64 ? DType::F64 : DType::F32));
  stochastic_depth_ = register_module("stochastic_depth", std::make_shared<DropPath>(drop_path));
}

Tensor CNBlock::forward(const Tensor& x) {
  Tensor y = block_->forward(x);
  use_parameters();
  const Tensor scale = layer_scale_.reshape(Shape{dim_});
  y = mul(y, scale.dtype() == y.dtype() ? scale : scale.to(y.dtype()));
  return add((*stochastic_depth_)(y), x);
}

ConvNeXt::ConvNeXt(ConvNeXtOptions o) {
  const Variant* v = nullptr;
  for (const Variant& c : variants())
    if (c.name == o.variant) v = &c;
  RT_CHECK(v, "ConvNeXt: unknown variant '", o.variant, "' (expected tiny, small, base or large)");
  RT_CHECK(o.in_channels > 0 && o.num_classes > 0, "ConvNeXt: in_channels (", o.in_channels, ") and num_classes (",
           o.num_classes, ") must be positive");
  const double sd = o.stochastic_depth >= 0 ? o.stochastic_depth : v->stochastic_depth;
  RT_CHECK(sd <= 1 && o.layer_scale > 0, "ConvNeXt: stochastic depth ", sd, " must be in [0, 1] and layer scale ",
           o.layer_scale, " > 0");
  features_ = register_module("features", std::make_shared<Sequential>());
  auto stem = std::make_shared<Sequential>();
  stem->add(std::make_shared<Conv2d>(
      o.in_channels, v->dims[0],
      Conv2dOptions{.kernel_h = 4, .kernel_w = 4, .stride = 4, .bias = Bias::With, .dtype = o.dtype}));
  stem->add(std::make_shared<LayerNorm>(v->dims[0], kNormEps, true, o.dtype));
  features_->add(stem);
  int64_t total = 0;
  for (int64_t d : v->depths) total += d;
  int64_t id = 0;
  for (size_t s = 0; s < v->dims.size(); ++s) {
    auto stage = std::make_shared<Sequential>();
    for (int64_t i = 0; i < v->depths[s]; ++i, ++id)
      stage->add(std::make_shared<CNBlock>(v->dims[s], o.layer_scale,
                                           sd * static_cast<double>(id) / static_cast<double>(total - 1), o.dtype));
    features_->add(stage);
    if (s + 1 < v->dims.size()) {
      auto down = std::make_shared<Sequential>();
      down->add(std::make_shared<LayerNorm>(v->dims[s], kNormEps, true, o.dtype));
      down->add(std::make_shared<Conv2d>(
          v->dims[s], v->dims[s + 1],
          Conv2dOptions{.kernel_h = 2, .kernel_w = 2, .stride = 2, .bias = Bias::With, .dtype = o.dtype}));
      features_->add(down);
    }
  }
  classifier_ = register_module("classifier", std::make_shared<Sequential>());
  classifier_->add(std::make_shared<LayerNorm>(v->dims.back(), kNormEps, true, o.dtype));
  classifier_->add(std::make_shared<Flatten>(1));
  classifier_->add(std::make_shared<Linear>(v->dims.back(), o.num_classes, Bias::With, o.dtype));
  init_weights(*this);
}

Tensor ConvNeXt::head(const Tensor& x) {
  if (x.ndim() != 4 || x.size(1) < 1 || x.size(2) < 1)
    RT_THROW("ConvNeXt: the features ", x.describe(), " have no pixels left (the input must be at least 32x32)");
  return classifier_->forward(adaptive_avg_pool2d(x, 1, 1));
}

Tensor ConvNeXt::forward(const Tensor& x) {
  if (x.ndim() == 4 && (x.size(1) < 32 || x.size(2) < 32))
    RT_THROW("ConvNeXt: input ", x.describe(), " is smaller than the 32x32 the network's stride of 32 needs");
  return head(features_->forward(x));
}

std::vector<Block> ConvNeXt::blocks() {
  std::vector<Block> out;
  const std::vector<Block> parts = features_->blocks();
  for (size_t i = 0; i < parts.size(); ++i) {
    const bool stage = i % 2 == 1;  // features.1, .3, .5, .7: the CNBlock stages
    auto* seq = dynamic_cast<Sequential*>(parts[i].modules.front().get());
    if (!stage || !seq) {
      out.push_back({"features." + parts[i].name, parts[i].modules, parts[i].forward, parts[i].set_recompute});
      continue;
    }
    for (const Block& b : seq->blocks())
      out.push_back({"features." + parts[i].name + "." + b.name, b.modules, b.forward, b.set_recompute});
  }
  out.push_back({"head", {classifier_}, [this](const Tensor& x) { return head(x); }, {}});
  return out;
}

}  // namespace ringtrain
