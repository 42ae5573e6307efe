// core/env.cpp: see env.h.
#include "core/env.h"

#include <cstdint>
#include <cstdlib>

#include "core/check.h"

namespace ringtrain {

std::optional<std::string> env_text(const char* name) {
  const char* v = std::getenv(name);
  if (!v || !*v) return std::nullopt;
  return std::string(v);
}

bool env_switch(const char* name, bool fallback, const char* meaning) {
  const std::optional<std::string> v = env_text(name);
  if (!v) return fallback;
  if (*v == "1") return true;
  if (*v == "0") return false;
  RT_THROW_PERMANENT(name, "='", *v, "': expected 1 (", meaning, ") or 0 (off), or leave it unset (",
                     fallback ? "on" : "off", ")");
}

template <typename T>
std::optional<T> env_number(const char* name, const NumberRange<T>& range) {
  const std::optional<std::string> v = env_text(name);
  if (!v) return std::nullopt;
  return parse_number<T>(name, *v, range);
}

int64_t restart_count() { return env_number<int64_t>("RINGTRAIN_RESTART", {0, 1000000000}).value_or(0); }

template std::optional<int> env_number<int>(const char*, const NumberRange<int>&);
template std::optional<int64_t> env_number<int64_t>(const char*, const NumberRange<int64_t>&);
template std::optional<double> env_number<double>(const char*, const NumberRange<double>&);

}  // namespace ringtrain
