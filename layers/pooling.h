// layers/pooling.h: MaxPool2d, AvgPool2d and GlobalAvgPool (NHWC; global pooling gives (N, C)).
#pragma once

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

}  // namespace ringtrain
