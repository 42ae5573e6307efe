// core/dispatch.h (internal): picks the kernel table for a device and reports missing kernels by op.
#pragma once

#include <utility>

#include "core/check.h"
#include "core/kernels.h"
#include "core/profile.h"

namespace ringtrain::detail {

// The table for `device`; throws naming `op` when the device has no kernels (CUDA not built).
const KernelTable& kernel_table(Device device, const char* op);

// A kernel about to be called: timed by the profiler while a session is open (core/profile.h).
template <typename R, typename... A>
struct KernelCall {
  R (*fn)(A...);
  const char* entry;
  Device device;
  template <typename... B>
  R operator()(B&&... args) const {
    if (!profile::on()) return fn(std::forward<B>(args)...);
    profile::Span span(profile::family_of_kernel(entry), device, entry);
    return fn(std::forward<B>(args)...);
  }
};

template <typename R, typename... A>
KernelCall<R, A...> require_kernel(R (*fn)(A...), const char* op, const char* entry, Device device) {
  if (!fn) RT_THROW("op '", op, "' has no kernel '", entry, "' for device ", device.str());
  return {fn, entry, device};
}

// Post-op hook of the device (CUDA: error check per op, optional sync).
void after_op(Device device, const char* op);

}  // namespace ringtrain::detail

// RT_KERNEL(device, "op", entry)(args...) calls the device's kernel or throws naming op and device.
#define RT_KERNEL_FROM(table, device, op, entry) ::ringtrain::detail::require_kernel((table).entry, op, #entry, device)
#define RT_KERNEL(device, op, entry) RT_KERNEL_FROM(::ringtrain::detail::kernel_table(device, op), device, op, entry)
