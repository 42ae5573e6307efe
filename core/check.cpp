// core/check.cpp: formatting of checked-call failures for every library, MPI and HDF5 adapters.
#include "core/check.h"

#include <hdf5.h>
#include <mpi.h>

#include <cstdio>

namespace ringtrain::detail {
namespace {

std::string format_call_error(std::string_view library, long long code, std::string_view text, const char* call,
                              const char* file, int line, int device) {
  std::ostringstream os;
  os << library << " error " << code;
  if (!text.empty()) os << " (" << text << ")";
  os << " in `" << call << "` at " << file << ":" << line;
  if (device != kNoDevice) os << " on device cuda:" << device;
  return os.str();
}

}  // namespace

void raise_call_error(std::string_view library, long long code, std::string_view text, const char* call,
                      const char* file, int line, int device) {
  throw Error(format_call_error(library, code, text, call, file, line, device));
}

void report_call_error(std::string_view library, long long code, std::string_view text, const char* call,
                       const char* file, int line, int device) noexcept {
  try {
    std::fprintf(stderr, "ringtrain: %s (ignored: in a destructor)\n",
                 format_call_error(library, code, text, call, file, line, device).c_str());
  } catch (...) {
    std::fprintf(stderr, "ringtrain: %.*s error %lld in `%s` at %s:%d\n", static_cast<int>(library.size()),
                 library.data(), code, call, file, line);
  }
}

void raise_check_failure(const char* condition, const std::string& message, const char* file, int line) {
  std::ostringstream os;
  os << message;
  if (message.empty()) os << "check failed";
  os << " [check `" << condition << "` at " << file << ":" << line << "]";
  throw Error(os.str());
}

std::string mpi_error_text(int code) {
  char buffer[MPI_MAX_ERROR_STRING] = {0};
  int length = 0;
  if (MPI_Error_string(code, buffer, &length) != MPI_SUCCESS) return "unknown MPI error";
  return std::string(buffer, static_cast<size_t>(length));
}

namespace {
herr_t collect_h5_frame(unsigned n, const H5E_error2_t* frame, void* out) {
  auto* text = static_cast<std::string*>(out);
  if (!text->empty()) *text += "; ";
  (void)n;
  *text += frame->desc ? frame->desc : "?";
  if (frame->func_name) *text += std::string(" [") + frame->func_name + "]";
  return 0;
}
}  // namespace

std::string h5_error_text() {
  std::string text;
  H5Ewalk2(H5E_DEFAULT, H5E_WALK_DOWNWARD, collect_h5_frame, &text);
  H5Eclear2(H5E_DEFAULT);
  return text.empty() ? "no HDF5 error stack" : text;
}

void h5_silence_errors() { H5Eset_auto2(H5E_DEFAULT, nullptr, nullptr); }

std::recursive_mutex& hdf5_mutex() {
  static std::recursive_mutex mutex;
  return mutex;
}

}  // namespace ringtrain::detail
