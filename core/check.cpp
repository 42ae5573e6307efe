// core/check.cpp: formatting of checked-call failures for every library.
#include "core/check.h"

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

}  // namespace ringtrain::detail
