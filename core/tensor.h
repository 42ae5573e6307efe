// core/tensor.h: Shape and Tensor. A Tensor is a handle (shared_ptr) to a TensorImpl: a contiguous,
// row-major region of a Storage (offset + shape + dtype) plus autograd metadata. Views (reshape, view,
// slice along the first dim, detach) share the Storage. Activations are NHWC and filters KRSC by
// convention (see docs/ARCHITECTURE.md); the tensor itself is layout-agnostic.
#pragma once

#include <array>
#include <cstdint>
#include <functional>
#include <initializer_list>
#include <memory>
#include <ostream>
#include <span>
#include <string>
#include <vector>

#include "core/allocator.h"
#include "core/device.h"
#include "core/dtype.h"

namespace ringtrain {

inline constexpr int kMaxDims = 8;

class Shape {
 public:
  Shape() = default;
  Shape(std::initializer_list<int64_t> dims);
  explicit Shape(std::span<const int64_t> dims);
  int ndim() const { return ndim_; }
  int64_t operator[](int i) const { return dims_[static_cast<size_t>(i)]; }
  int64_t& operator[](int i) { return dims_[static_cast<size_t>(i)]; }
  int64_t numel() const;
  const int64_t* begin() const { return dims_.data(); }
  const int64_t* end() const { return dims_.data() + ndim_; }
  std::vector<int64_t> vec() const { return {begin(), end()}; }
  bool operator==(const Shape& o) const;
  std::string str() const;  // "[2, 3]"
  // Resolves a possibly negative dimension index, throwing an error that names `what` when out of range.
  int wrap_dim(int dim, const char* what) const;

 private:
  std::array<int64_t, kMaxDims> dims_{};
  int ndim_ = 0;
};
std::ostream& operator<<(std::ostream& os, const Shape& s);

class Tensor;
struct TensorImpl;
struct Node;

// Called once per backward pass when a leaf's gradient for that pass is complete (after accumulation
// into .grad). GradSync uses this seam to launch bucket all-reduces while backward goes on.
using GradReadyHook = std::function<void(Tensor& leaf)>;

struct AutogradMeta {
  bool requires_grad = false;
  std::shared_ptr<Node> grad_fn;         // producer of a non-leaf; null for leaves
  std::weak_ptr<Node> grad_accumulator;  // leaves: the AccumulateGrad node, created on demand
  std::shared_ptr<TensorImpl> grad;      // leaves: accumulated gradient
  std::vector<GradReadyHook> ready_hooks;
};

struct TensorImpl {
  std::shared_ptr<Storage> storage;
  int64_t offset_bytes = 0;
  Shape shape;
  DType dtype = DType::F32;
  std::string name;  // optional label used in error messages (parameter names)
  AutogradMeta autograd;
};

class Tensor {
 public:
  Tensor() = default;  // undefined tensor
  explicit Tensor(std::shared_ptr<TensorImpl> impl) : impl_(std::move(impl)) {}

  // ---- creation (uninitialised, filled, random, from host data)
  static Tensor empty(const Shape& shape, DType dtype = DType::F32, Device device = Device::cpu());
  // CPU tensor in page-locked memory (CUDA builds with a device), for asynchronous copies to the GPU.
  static Tensor empty_pinned(const Shape& shape, DType dtype = DType::F32);
  static Tensor zeros(const Shape& shape, DType dtype = DType::F32, Device device = Device::cpu());
  static Tensor ones(const Shape& shape, DType dtype = DType::F32, Device device = Device::cpu());
  static Tensor full(const Shape& shape, double value, DType dtype = DType::F32, Device device = Device::cpu());
  // Counter-based random values: element i depends only on (seed, stream, i).
  static Tensor uniform(const Shape& shape, double low, double high, uint64_t seed, DType dtype = DType::F32,
                        Device device = Device::cpu(), uint64_t stream = 0);
  static Tensor normal(const Shape& shape, double mean, double stddev, uint64_t seed, DType dtype = DType::F32,
                       Device device = Device::cpu(), uint64_t stream = 0);
  // Copies host values (converted to `dtype`); values.size() must equal shape.numel().
  static Tensor from_vector(const std::vector<double>& values, const Shape& shape, DType dtype = DType::F32,
                            Device device = Device::cpu());
  static Tensor scalar(double value, DType dtype = DType::F32, Device device = Device::cpu());

  // ---- metadata
  bool defined() const { return impl_ != nullptr; }
  const Shape& shape() const;
  int ndim() const { return shape().ndim(); }
  int64_t size(int dim) const;
  int64_t numel() const { return shape().numel(); }
  DType dtype() const;
  Device device() const;
  int64_t nbytes() const { return numel() * dtype_size(dtype()); }
  void* data_ptr() const;
  template <typename T>
  T* data() const {
    return static_cast<T*>(data_ptr());
  }
  bool shares_storage_with(const Tensor& other) const;
  // True when this handle is the only one on the tensor and no other tensor (view, detached handle)
  // shares its memory: writing into it then changes nothing anyone else can see. Autograd uses it to
  // reuse a gradient's memory it was handed (accumulating in place, masking in place).
  bool sole_owner() const;
  // Drops the tensor's memory for every handle of it (a parameter and its module's copy of the handle);
  // views made before keep theirs. Shape, dtype, device and name stay; reading the data afterwards is an
  // error naming the tensor. A pipeline stage releases the weights of the blocks other stages hold.
  void release();
  bool released() const;
  const std::string& name() const;
  Tensor& set_name(std::string name);
  std::string describe() const;  // "f32[2, 3] on cpu" (+ name)
  TensorImpl* impl() const { return impl_.get(); }
  const std::shared_ptr<TensorImpl>& impl_ptr() const { return impl_; }

  // ---- views (share storage; differentiable)
  Tensor reshape(const Shape& shape) const;  // one dim may be -1
  Tensor view(const Shape& shape) const { return reshape(shape); }
  Tensor flatten(int start_dim = 0) const;
  Tensor slice(int64_t begin, int64_t end) const;  // rows [begin, end) of the first dim
  Tensor detach() const;                           // same storage, no autograd history

  // ---- conversion (differentiable for floating dtypes; a no-op returns *this)
  Tensor to(Device device) const;
  Tensor to(DType dtype) const;
  Tensor clone() const;

  // ---- in-place (never recorded by autograd)
  Tensor& fill_(double value);
  Tensor& zero_() { return fill_(0.0); }
  Tensor& copy_(const Tensor& src);                       // same shape; converts dtype and device
  Tensor& add_(const Tensor& other, double alpha = 1.0);  // this += alpha * other (same shape)
  Tensor& mul_(double factor);

  // ---- host access
  std::vector<double> to_vector() const;  // any dtype/device, as doubles
  double item() const;                    // numel() == 1

  // ---- autograd
  bool requires_grad() const;
  Tensor& set_requires_grad(bool enabled = true);  // leaves only
  bool is_leaf() const;
  Tensor grad() const;             // undefined until a backward reached this leaf
  void set_grad(const Tensor& g);  // e.g. a view into a gradient bucket; accumulation then writes into it
  void zero_grad(bool set_to_none = true);
  std::shared_ptr<Node> grad_fn() const;
  void register_ready_hook(GradReadyHook hook);
  // Back-propagates from this tensor (scalar, unless `gradient` is given) into the leaves' .grad.
  void backward(const Tensor& gradient = Tensor(), bool retain_graph = false) const;

 private:
  std::shared_ptr<TensorImpl> impl_;
};

// Prints dtype, shape, device and, for tensors up to `max_elements`, the values (nested brackets).
std::ostream& operator<<(std::ostream& os, const Tensor& t);
std::string to_string(const Tensor& t, int64_t max_elements = 64);

}  // namespace ringtrain
