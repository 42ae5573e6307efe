// core/tensor.cpp: Shape, Tensor creation, views, conversion, host access and printing.
#include "core/tensor.h"

#include <cmath>
#include <iomanip>
#include <sstream>

#include "core/autograd.h"
#include "core/check.h"
#include "core/dispatch.h"
#include "core/ops.h"

namespace ringtrain {

// ---------------------------------------------------------------------------------------------------
// Shape

Shape::Shape(std::initializer_list<int64_t> dims) : Shape(std::span<const int64_t>(dims.begin(), dims.size())) {}

Shape::Shape(std::span<const int64_t> dims) {
  RT_CHECK(dims.size() <= static_cast<size_t>(kMaxDims), "a tensor has at most ", kMaxDims, " dims, got ", dims.size());
  ndim_ = static_cast<int>(dims.size());
  for (int i = 0; i < ndim_; ++i) {
    RT_CHECK(dims[static_cast<size_t>(i)] >= -1, "negative dimension ", dims[static_cast<size_t>(i)], " in shape");
    dims_[static_cast<size_t>(i)] = dims[static_cast<size_t>(i)];
  }
}

int64_t Shape::numel() const {
  int64_t n = 1;
  for (int i = 0; i < ndim_; ++i) n *= dims_[static_cast<size_t>(i)];
  return n;
}

bool Shape::operator==(const Shape& o) const {
  if (ndim_ != o.ndim_) return false;
  for (int i = 0; i < ndim_; ++i)
    if (dims_[static_cast<size_t>(i)] != o.dims_[static_cast<size_t>(i)]) return false;
  return true;
}

std::string Shape::str() const {
  std::string s = "[";
  for (int i = 0; i < ndim_; ++i) s += (i ? ", " : "") + std::to_string(dims_[static_cast<size_t>(i)]);
  return s + "]";
}

int Shape::wrap_dim(int dim, const char* what) const {
  int wrapped = dim < 0 ? dim + ndim_ : dim;
  if (wrapped < 0 || wrapped >= ndim_)
    RT_THROW(what, ": dim ", dim, " is out of range for a tensor of shape ", str(), " (", ndim_, " dims)");
  return wrapped;
}

std::ostream& operator<<(std::ostream& os, const Shape& s) { return os << s.str(); }

// ---------------------------------------------------------------------------------------------------
// Creation

namespace {
std::shared_ptr<TensorImpl> make_impl(const Shape& shape, DType dtype, Device device) {
  auto impl = std::make_shared<TensorImpl>();
  impl->storage = allocate_storage(shape.numel() * dtype_size(dtype), device);
  impl->shape = shape;
  impl->dtype = dtype;
  return impl;
}
}  // namespace

Tensor Tensor::empty(const Shape& shape, DType dtype, Device device) {
  for (int i = 0; i < shape.ndim(); ++i)
    RT_CHECK(shape[i] >= 0, "Tensor::empty: shape ", shape, " has a negative dimension");
  return Tensor(make_impl(shape, dtype, device));
}

Tensor Tensor::empty_pinned(const Shape& shape, DType dtype) {
  for (int i = 0; i < shape.ndim(); ++i)
    RT_CHECK(shape[i] >= 0, "Tensor::empty_pinned: shape ", shape, " has a negative dimension");
  auto impl = std::make_shared<TensorImpl>();
  impl->storage = allocate_pinned_storage(shape.numel() * dtype_size(dtype));
  impl->shape = shape;
  impl->dtype = dtype;
  return Tensor(impl);
}

Tensor Tensor::zeros(const Shape& shape, DType dtype, Device device) { return full(shape, 0.0, dtype, device); }
Tensor Tensor::ones(const Shape& shape, DType dtype, Device device) { return full(shape, 1.0, dtype, device); }

Tensor Tensor::full(const Shape& shape, double value, DType dtype, Device device) {
  Tensor t = empty(shape, dtype, device);
  t.fill_(value);
  return t;
}

Tensor Tensor::uniform(const Shape& shape, double low, double high, uint64_t seed, DType dtype, Device device,
                       uint64_t stream) {
  RT_CHECK(is_floating(dtype), "Tensor::uniform needs a floating dtype, got ", dtype_name(dtype));
  RT_CHECK(low <= high, "Tensor::uniform: low ", low, " > high ", high);
  Tensor t = empty(shape, dtype, device);
  RT_KERNEL(device, "uniform", uniform)(t, seed, stream, low, high);
  detail::after_op(device, "uniform");
  return t;
}

Tensor Tensor::normal(const Shape& shape, double mean, double stddev, uint64_t seed, DType dtype, Device device,
                      uint64_t stream) {
  RT_CHECK(is_floating(dtype), "Tensor::normal needs a floating dtype, got ", dtype_name(dtype));
  RT_CHECK(stddev >= 0, "Tensor::normal: negative stddev ", stddev);
  Tensor t = empty(shape, dtype, device);
  RT_KERNEL(device, "normal", normal)(t, seed, stream, mean, stddev);
  detail::after_op(device, "normal");
  return t;
}

Tensor Tensor::from_vector(const std::vector<double>& values, const Shape& shape, DType dtype, Device device) {
  RT_CHECK(static_cast<int64_t>(values.size()) == shape.numel(), "Tensor::from_vector: ", values.size(),
           " values for shape ", shape, " (", shape.numel(), " elements)");
  Tensor host = empty(shape, DType::F64, Device::cpu());
  std::copy(values.begin(), values.end(), host.data<double>());
  if (dtype == DType::F64 && device.is_cpu()) return host;
  return host.to(dtype).to(device);
}

Tensor Tensor::scalar(double value, DType dtype, Device device) { return full(Shape{}, value, dtype, device); }

// ---------------------------------------------------------------------------------------------------
// Metadata

const Shape& Tensor::shape() const {
  RT_CHECK(impl_, "use of an undefined tensor");
  return impl_->shape;
}
int64_t Tensor::size(int dim) const { return shape()[shape().wrap_dim(dim, "Tensor::size")]; }
DType Tensor::dtype() const {
  RT_CHECK(impl_, "use of an undefined tensor");
  return impl_->dtype;
}
Device Tensor::device() const {
  RT_CHECK(impl_, "use of an undefined tensor");
  return impl_->storage->device();
}
void* Tensor::data_ptr() const {
  RT_CHECK(impl_, "use of an undefined tensor");
  if (released())
    RT_THROW("tensor ", describe(),
             " was released (a pipeline stage keeps only its own blocks' weights) and has "
             "no data");
  return static_cast<char*>(impl_->storage->data()) + impl_->offset_bytes;
}
void Tensor::release() {
  RT_CHECK(impl_, "release of an undefined tensor");
  // A storage without memory on the same device: shape, dtype and device stay answerable.
  impl_->storage = std::make_shared<Storage>(nullptr, 0, device());
}
bool Tensor::released() const { return impl_ && impl_->storage->data() == nullptr && impl_->shape.numel() > 0; }
bool Tensor::sole_owner() const {
  return defined() && impl_.use_count() == 1 && impl_->storage && impl_->storage.use_count() == 1;
}
bool Tensor::shares_storage_with(const Tensor& other) const {
  return defined() && other.defined() && impl_->storage == other.impl_->storage;
}
const std::string& Tensor::name() const {
  RT_CHECK(impl_, "use of an undefined tensor");
  return impl_->name;
}
Tensor& Tensor::set_name(std::string name) {
  RT_CHECK(impl_, "use of an undefined tensor");
  impl_->name = std::move(name);
  return *this;
}
std::string Tensor::describe() const {
  if (!impl_) return "undefined tensor";
  std::string s = std::string(dtype_name(dtype())) + shape().str() + " on " + device().str();
  if (!impl_->name.empty()) s = "'" + impl_->name + "' " + s;
  return s;
}

// ---------------------------------------------------------------------------------------------------
// Views

namespace {
Tensor make_view(const Tensor& base, const Shape& shape, int64_t extra_offset_bytes) {
  auto impl = std::make_shared<TensorImpl>();
  impl->storage = base.impl()->storage;
  impl->offset_bytes = base.impl()->offset_bytes + extra_offset_bytes;
  impl->shape = shape;
  impl->dtype = base.dtype();
  return Tensor(impl);
}
}  // namespace

Tensor Tensor::reshape(const Shape& requested) const {
  Shape shape = requested;
  int infer = -1;
  int64_t known = 1;
  for (int i = 0; i < shape.ndim(); ++i) {
    if (shape[i] == -1) {
      RT_CHECK(infer < 0, "reshape: more than one -1 in ", requested, " (tensor ", describe(), ")");
      infer = i;
    } else {
      known *= shape[i];
    }
  }
  if (infer >= 0) {
    if (known == 0 || numel() % known != 0)
      RT_THROW("reshape: cannot infer -1 in ", requested, " for ", describe(), " (", numel(), " elements)");
    shape[infer] = numel() / known;
  }
  if (shape.numel() != numel())
    RT_THROW("reshape: ", describe(), " has ", numel(), " elements, shape ", requested, " needs ", shape.numel());
  Tensor out = make_view(*this, shape, 0);
  if (needs_grad({this})) {
    Shape input_shape = this->shape();
    return record("reshape", {this}, out,
                  [input_shape](const Tensor& g) { return std::vector<Tensor>{g.reshape(input_shape)}; });
  }
  return out;
}

Tensor Tensor::flatten(int start_dim) const {
  const Shape& s = shape();
  if (s.ndim() == 0) return reshape(Shape{1});
  int start = s.wrap_dim(start_dim, "flatten");
  std::vector<int64_t> dims(s.begin(), s.begin() + start);
  int64_t rest = 1;
  for (int i = start; i < s.ndim(); ++i) rest *= s[i];
  dims.push_back(rest);
  return reshape(Shape(std::span<const int64_t>(dims)));
}

Tensor Tensor::slice(int64_t begin, int64_t end) const {
  RT_CHECK(ndim() >= 1, "slice: ", describe(), " has no first dim to slice");
  const int64_t rows = shape()[0];
  if (begin < 0 || end < begin || end > rows)
    RT_THROW("slice [", begin, ", ", end, ") is out of range for the first dim of ", describe());
  Shape out_shape = shape();
  out_shape[0] = end - begin;
  const int64_t row_bytes = rows ? nbytes() / rows : 0;
  Tensor out = make_view(*this, out_shape, begin * row_bytes);
  if (needs_grad({this})) {
    Shape input_shape = shape();
    return record("slice", {this}, out, [input_shape, begin, end](const Tensor& g) {
      Tensor full_grad = Tensor::zeros(input_shape, g.dtype(), g.device());
      full_grad.slice(begin, end).copy_(g);
      return std::vector<Tensor>{full_grad};
    });
  }
  return out;
}

Tensor Tensor::detach() const {
  Tensor out = make_view(*this, shape(), 0);
  out.impl_->name = impl_->name;
  return out;
}

// ---------------------------------------------------------------------------------------------------
// Conversion

Tensor Tensor::to(Device device) const {
  if (device == this->device()) return *this;
  Tensor out = empty(shape(), dtype(), device);
  {
    profile::Span span("cast_copy", this->device().is_cuda() ? this->device() : device, "copy to device");
    copy_bytes(out.data_ptr(), device, data_ptr(), this->device(), nbytes());
  }
  // The host has waited for the device: the checks left on it can be read now (core/device.h).
  if (device.is_cpu()) run_deferred_checks();
  if (needs_grad({this})) {
    Device source = this->device();
    return record("to_device", {this}, out, [source](const Tensor& g) { return std::vector<Tensor>{g.to(source)}; });
  }
  return out;
}

Tensor Tensor::to(DType dtype) const {
  if (dtype == this->dtype()) return *this;
  Tensor out = empty(shape(), dtype, device());
  RT_KERNEL(device(), "to_dtype", convert)(*this, out);
  detail::after_op(device(), "to_dtype");
  if (needs_grad({this})) {
    RT_CHECK(is_floating(dtype), "to(", dtype_name(dtype), "): converting ", describe(),
             " that requires grad to a non-floating dtype is not differentiable; detach() it first");
    DType source = this->dtype();
    return record("to_dtype", {this}, out, [source](const Tensor& g) { return std::vector<Tensor>{g.to(source)}; });
  }
  return out;
}

Tensor Tensor::clone() const {
  Tensor out = empty(shape(), dtype(), device());
  {
    profile::Span span("cast_copy", device(), "copy clone");
    copy_bytes(out.data_ptr(), device(), data_ptr(), device(), nbytes());
  }
  if (needs_grad({this})) return record("clone", {this}, out, [](const Tensor& g) { return std::vector<Tensor>{g}; });
  return out;
}

// ---------------------------------------------------------------------------------------------------
// In-place

Tensor& Tensor::fill_(double value) {
  RT_KERNEL(device(), "fill", fill)(*this, value);
  detail::after_op(device(), "fill");
  return *this;
}

Tensor& Tensor::copy_(const Tensor& src) {
  RT_CHECK(src.shape() == shape(), "copy_: source ", src.describe(), " does not match destination ", describe());
  Tensor source = src;
  if (source.device() != device()) source = source.detach().to(device());
  if (source.dtype() != dtype()) {
    RT_KERNEL(device(), "copy_", convert)(source, *this);
    detail::after_op(device(), "copy_");
  } else if (source.data_ptr() != data_ptr()) {
    profile::Span span("cast_copy", device(), "copy copy_");
    copy_bytes(data_ptr(), device(), source.data_ptr(), device(), nbytes());
  }
  return *this;
}

Tensor& Tensor::add_(const Tensor& other, double alpha) {
  RT_CHECK(other.shape() == shape() && other.dtype() == dtype() && other.device() == device(),
           "add_: ", other.describe(), " cannot be added in place to ", describe());
  NoGradGuard no_grad;
  Tensor scaled = alpha == 1.0 ? other : mul(other, alpha);
  BroadcastDesc bc = make_broadcast(shape(), shape(), shape());
  RT_KERNEL(device(), "add_", binary)(BinaryOp::Add, *this, scaled, *this, bc);
  detail::after_op(device(), "add_");
  return *this;
}

Tensor& Tensor::mul_(double factor) {
  RT_KERNEL(device(), "mul_", scalar)(ScalarOp::Mul, *this, factor, *this);
  detail::after_op(device(), "mul_");
  return *this;
}

// ---------------------------------------------------------------------------------------------------
// Host access

std::vector<double> Tensor::to_vector() const {
  Tensor host = detach().to(Device::cpu()).to(DType::F64);
  const double* p = host.data<double>();
  return std::vector<double>(p, p + numel());
}

double Tensor::item() const {
  RT_CHECK(numel() == 1, "item() needs a single element, got ", describe());
  return to_vector()[0];
}

// ---------------------------------------------------------------------------------------------------
// Autograd accessors

bool Tensor::requires_grad() const { return impl_ && impl_->autograd.requires_grad; }

Tensor& Tensor::set_requires_grad(bool enabled) {
  RT_CHECK(impl_, "set_requires_grad on an undefined tensor");
  RT_CHECK(is_leaf(), "set_requires_grad: ", describe(), " is the output of op ", impl_->autograd.grad_fn->describe(),
           "; only leaves can be marked (use detach())");
  RT_CHECK(!enabled || is_floating(dtype()), "set_requires_grad: ", describe(),
           " is not floating point; only floating tensors can require grad");
  impl_->autograd.requires_grad = enabled;
  return *this;
}

bool Tensor::is_leaf() const { return !impl_ || !impl_->autograd.grad_fn; }

Tensor Tensor::grad() const {
  RT_CHECK(impl_, "grad() of an undefined tensor");
  return impl_->autograd.grad ? Tensor(impl_->autograd.grad) : Tensor();
}

void Tensor::set_grad(const Tensor& g) {
  RT_CHECK(impl_, "set_grad on an undefined tensor");
  if (g.defined()) {
    RT_CHECK(g.shape() == shape() && g.dtype() == dtype() && g.device() == device(), "set_grad: gradient ",
             g.describe(), " does not match ", describe());
  }
  impl_->autograd.grad = g.defined() ? g.impl_ptr() : nullptr;
}

void Tensor::zero_grad(bool set_to_none) {
  if (!impl_ || !impl_->autograd.grad) return;
  if (set_to_none)
    impl_->autograd.grad.reset();
  else
    Tensor(impl_->autograd.grad).zero_();
}

std::shared_ptr<Node> Tensor::grad_fn() const { return impl_ ? impl_->autograd.grad_fn : nullptr; }

void Tensor::register_ready_hook(GradReadyHook hook) {
  RT_CHECK(impl_ && is_leaf(), "register_ready_hook: only leaves have gradient-ready hooks, got ", describe());
  impl_->autograd.ready_hooks.push_back(std::move(hook));
}

void Tensor::backward(const Tensor& gradient, bool retain_graph) const { run_backward(*this, gradient, retain_graph); }

// ---------------------------------------------------------------------------------------------------
// Printing

namespace {
void print_values(std::ostream& os, const std::vector<double>& values, const Shape& shape, int dim, int64_t& index,
                  bool integral) {
  if (shape.ndim() == 0) {
    os << values[0];
    return;
  }
  os << "[";
  for (int64_t i = 0; i < shape[dim]; ++i) {
    if (i) os << (dim + 1 < shape.ndim() ? ",\n" + std::string(static_cast<size_t>(dim) + 1, ' ') : ", ");
    if (dim + 1 < shape.ndim()) {
      print_values(os, values, shape, dim + 1, index, integral);
    } else {
      double v = values[static_cast<size_t>(index++)];
      if (integral)
        os << static_cast<long long>(v);
      else
        os << v;
    }
  }
  os << "]";
}
}  // namespace

std::string to_string(const Tensor& t, int64_t max_elements) {
  if (!t.defined()) return "Tensor(undefined)";
  std::ostringstream os;
  os << "Tensor(" << dtype_name(t.dtype()) << t.shape() << ", " << t.device();
  if (!t.name().empty()) os << ", '" << t.name() << "'";
  if (t.requires_grad()) os << ", requires_grad";
  os << ")";
  if (t.numel() <= max_elements) {
    os << "\n" << std::setprecision(6);
    int64_t index = 0;
    print_values(os, t.to_vector(), t.shape(), 0, index, !is_floating(t.dtype()));
  } else {
    os << " [" << t.numel() << " elements not shown]";
  }
  return os.str();
}

std::ostream& operator<<(std::ostream& os, const Tensor& t) { return os << to_string(t); }

}  // namespace ringtrain
