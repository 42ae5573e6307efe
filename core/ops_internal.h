// core/ops_internal.h (internal: the op files core/ops.cpp, ops_tensor.cpp, ops_nn.cpp): the input checks and
// autocast rule every op shares, defined once in core/ops.cpp.
#pragma once

#include <optional>
#include <vector>

#include "core/tensor.h"

namespace ringtrain::detail {

// The broadcast shape of a and b (NumPy rules); an error naming `op` and both shapes where they do not.
Shape broadcast_shapes(const char* op, const Tensor& a, const Tensor& b);
Shape broadcast_shapes(const char* op, const Shape& a, const Shape& b);
// a and b defined, on one device and of one dtype; errors name `op` and both tensors.
void check_same_device_dtype(const char* op, const Tensor& a, const Tensor& b);
// x defined and floating.
void check_floating(const char* op, const Tensor& x);
// Autocast (core/autocast.h): the dtype conv2d / linear / matmul-like ops of a and b run in, if any.
std::optional<DType> autocast_for(const Tensor& a, const Tensor& b);
Tensor cast_if_defined(const Tensor& t, DType dtype);

using Grads = std::vector<Tensor>;

}  // namespace ringtrain::detail
