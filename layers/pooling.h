// layers/pooling.h: MaxPool2d, AvgPool2d and GlobalAvgPool (NHWC; global pooling gives (N, C)), and the resizing
// layers AdaptiveAvgPool2d (any output size; (N, 1, 1, C) at 1x1, as torch's) and Upsample (nearest, nearest-exact,
// bilinear), as torch.nn has them.
#pragma once

#include "core/check.h"
#include "core/ops.h"
#include "core/profile.h"
#include "layers/module.h"

namespace ringtrain {

class MaxPool2d : public Module {
 public:
  MaxPool2d(int64_t kernel, int64_t stride, int64_t padding = 0)
      : params_{kernel, kernel, stride, stride, padding, padding} {}
  Tensor forward(const Tensor& x) override {
    profile::LayerScope layer(path());
    return max_pool2d(x, params_);
  }
  std::string type_name() const override { return "MaxPool2d"; }

 private:
  Pool2dParams params_;
};

class AvgPool2d : public Module {
 public:
  AvgPool2d(int64_t kernel, int64_t stride, int64_t padding = 0)
      : params_{kernel, kernel, stride, stride, padding, padding} {}
  Tensor forward(const Tensor& x) override { return avg_pool2d(x, params_); }
  std::string type_name() const override { return "AvgPool2d"; }

 private:
  Pool2dParams params_;
};

class GlobalAvgPool : public Module {
 public:
  Tensor forward(const Tensor& x) override { return global_avg_pool(x); }
  std::string type_name() const override { return "GlobalAvgPool"; }
};

class AdaptiveAvgPool2d : public Module {
 public:
  explicit AdaptiveAvgPool2d(int64_t out) : AdaptiveAvgPool2d(out, out) {}
  AdaptiveAvgPool2d(int64_t out_h, int64_t out_w) : out_h_(out_h), out_w_(out_w) {
    RT_CHECK(out_h >= 1 && out_w >= 1, "AdaptiveAvgPool2d: the output size ", out_h, "x", out_w,
             " must be at least 1x1");
  }
  Tensor forward(const Tensor& x) override {
    profile::LayerScope layer(path());
    return adaptive_avg_pool2d(x, out_h_, out_w_);
  }
  std::string type_name() const override { return "AdaptiveAvgPool2d"; }

 private:
  int64_t out_h_, out_w_;
};

// torch.nn.Upsample: a fixed output size or scale factors (UpsampleOptions, core/ops.h), checked at construction.
class Upsample : public Module {
 public:
  explicit Upsample(UpsampleOptions options) : options_(options) {
    const bool sized = options.out_h > 0 || options.out_w > 0, scaled = options.scale_h != 0 || options.scale_w != 0;
    RT_CHECK(sized != scaled, "Upsample: give either an output size or scale factors (", sized ? "both" : "neither",
             " given)");
    RT_CHECK(!options.align_corners || options.mode == UpsampleMode::Bilinear,
             "Upsample: align_corners applies to bilinear upsampling only");
  }
  Tensor forward(const Tensor& x) override {
    profile::LayerScope layer(path());
    return upsample(x, options_);
  }
  std::string type_name() const override { return "Upsample"; }

 private:
  UpsampleOptions options_;
};

}  // namespace ringtrain
