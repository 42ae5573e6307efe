// core/check.h: the one error type (ringtrain::Error) and the one checking macro family.
// Every CUDA / cuBLAS / cuDNN / NCCL / MPI / HDF5 call goes through RT_CALL_CHECK, which reports the
// call text, file:line and (for GPU libraries) the current device. *_NOTHROW variants only print and are
// for destructors. Each library's adapter (status to text, the wrapper macro) lives with the floor that
// uses the library, so the tensor library needs none of them: CUDA_CHECK and friends in
// core/cuda/cuda_check.h, MPI_CHECK in comm/mpi_check.h, H5_CHECK in io/hdf5.h.
#pragma once

#include <sstream>
#include <stdexcept>
#include <string>
#include <string_view>

namespace ringtrain {

// The single exception type. `what()` is the full message; context() is the extra lines added by
// callers that caught and rethrew with more context (file, rank, op).
class Error : public std::runtime_error {
 public:
  explicit Error(std::string message, bool permanent = false)
      : std::runtime_error(std::move(message)), permanent_(permanent) {}
  // A restart of the job would meet the same error (bad flags, bad data, a checkpoint that does not
  // match the run, a diverged run): the supervisor (ringtrain_run) ends the run at once instead of
  // relaunching. Everything else (a lost peer, a hang, a crash) may be transient.
  bool permanent() const { return permanent_; }

 private:
  bool permanent_;
};

// An Error that a restart cannot fix (see Error::permanent).
class PermanentError : public Error {
 public:
  explicit PermanentError(std::string message) : Error(std::move(message), true) {}
};

// Runs fn; a ringtrain::Error it throws comes out as a PermanentError with the same message. For the
// places whose every failure is about the input (validating flags, opening data, loading a checkpoint).
template <typename Fn>
decltype(auto) permanent_errors(Fn&& fn) {
  try {
    return fn();
  } catch (const Error& e) {
    if (e.permanent()) throw;
    throw PermanentError(e.what());
  }
}

namespace detail {

// Concatenates anything streamable; used by RT_CHECK messages.
template <typename... Args>
std::string str_cat(const Args&... args) {
  std::ostringstream os;
  (os << ... << args);
  return os.str();
}

// One generic reporter for every library: "<lib> error <code> (<text>) in `<call>` at file:line [device d]".
[[noreturn]] void raise_call_error(std::string_view library, long long code, std::string_view text, const char* call,
                                   const char* file, int line, int device);
void report_call_error(std::string_view library, long long code, std::string_view text, const char* call,
                       const char* file, int line, int device) noexcept;
[[noreturn]] void raise_check_failure(const char* condition, const std::string& message, const char* file, int line);

constexpr int kNoDevice = -1;

}  // namespace detail
}  // namespace ringtrain

// Internal invariant / argument check with a streamed message: RT_CHECK(n > 0, "bad n=", n).
#define RT_CHECK(cond, ...)                                                                                           \
  do {                                                                                                                \
    if (!(cond))                                                                                                      \
      ::ringtrain::detail::raise_check_failure(#cond, ::ringtrain::detail::str_cat(__VA_ARGS__), __FILE__, __LINE__); \
  } while (0)

// Throws ringtrain::Error with a streamed message (no condition text).
#define RT_THROW(...) throw ::ringtrain::Error(::ringtrain::detail::str_cat(__VA_ARGS__))
// Throws ringtrain::PermanentError (an error no restart fixes) with a streamed message.
#define RT_THROW_PERMANENT(...) throw ::ringtrain::PermanentError(::ringtrain::detail::str_cat(__VA_ARGS__))

// The generic call checker: `ok(status)` decides success, `text(status)` explains it, `device()` names
// the current device (or kNoDevice).
// `call_text` is the call as written: wrapper macros (MPI_CHECK, CUDA_CHECK, ...) stringize their own
// argument, because an argument passed on to another macro is macro-expanded first (MPI_INT would
// show as Open MPI's cast expression).
#define RT_CALL_CHECK_IMPL(lib, call, call_text, ok, text, device, reporter)                                        \
  do {                                                                                                              \
    auto rt_status_ = (call);                                                                                       \
    if (!(ok(rt_status_))) {                                                                                        \
      reporter(lib, static_cast<long long>(rt_status_), text(rt_status_), call_text, __FILE__, __LINE__, device()); \
    }                                                                                                               \
  } while (0)

#define RT_CALL_CHECK(lib, call, ok, text, device) \
  RT_CALL_CHECK_IMPL(lib, call, #call, ok, text, device, ::ringtrain::detail::raise_call_error)
#define RT_CALL_CHECK_NOTHROW(lib, call, ok, text, device) \
  RT_CALL_CHECK_IMPL(lib, call, #call, ok, text, device, ::ringtrain::detail::report_call_error)
// For wrapper macros: the same with the call text given.
#define RT_CALL_CHECK_T(lib, call, call_text, ok, text, device) \
  RT_CALL_CHECK_IMPL(lib, call, call_text, ok, text, device, ::ringtrain::detail::raise_call_error)
#define RT_CALL_CHECK_NOTHROW_T(lib, call, call_text, ok, text, device) \
  RT_CALL_CHECK_IMPL(lib, call, call_text, ok, text, device, ::ringtrain::detail::report_call_error)

#define RT_DETAIL_NO_DEVICE() ::ringtrain::detail::kNoDevice

// CUDA, cuBLAS, cuDNN, NCCL: defined over RT_CALL_CHECK_T in core/cuda/cuda_check.h (CUDA sources only);
// MPI_CHECK in comm/mpi_check.h; H5_CHECK in io/hdf5.h.
