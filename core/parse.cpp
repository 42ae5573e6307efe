// core/parse.cpp: checked numbers from text (see parse.h).
#include "core/parse.h"

#include <algorithm>
#include <cctype>
#include <charconv>
#include <cmath>
#include <cstdio>

#include "core/check.h"

namespace ringtrain {
template <typename T>
std::string number_text(T v) {
  if constexpr (std::is_floating_point_v<T>) {
    char buffer[32];
    std::snprintf(buffer, sizeof buffer, "%g", static_cast<double>(v));
    return buffer;
  } else {
    return std::to_string(v);
  }
}

template <typename T>
std::optional<T> to_number(std::string_view text) {
  if (text.empty()) return std::nullopt;
  const char* first = text.data();
  const char* last = text.data() + text.size();
  T value{};
  if constexpr (std::is_integral_v<T>) {
    // from_chars takes no '+', no spaces and no base prefix; a leading zero is fine and stays decimal.
    if (std::is_unsigned_v<T> && text.front() == '-') return std::nullopt;
    const auto [end, error] = std::from_chars(first, last, value, 10);
    if (error != std::errc() || end != last) return std::nullopt;
  } else {
    // from_chars would read "nan" and "inf"; only finite values are numbers here. Hex floats are refused.
    if (text.find_first_of("xXpP") != std::string_view::npos) return std::nullopt;
    const auto [end, error] = std::from_chars(first, last, value, std::chars_format::general);
    if (error != std::errc() || end != last || !std::isfinite(value)) return std::nullopt;
  }
  return value;
}

template <typename T>
std::string NumberRange<T>::text() const {
  const char* kind = std::is_integral_v<T> ? "an integer" : "a finite number";
  return detail::str_cat(kind, " in ", open_low ? "(" : "[", number_text(lo), ", ", number_text(hi), "]");
}

template <typename T>
std::string number_problem(std::string_view text, const NumberRange<T>& range) {
  const std::optional<T> v = to_number<T>(text);
  if (v && range.holds(*v)) return {};
  return detail::str_cat("expected ", range.text(), ", got '", text, "'");
}

template <typename T>
T parse_number(const std::string& what, std::string_view text, const NumberRange<T>& range) {
  const std::string problem = number_problem(text, range);
  if (!problem.empty()) throw PermanentError(what + ": " + problem);
  return *to_number<T>(text);
}

namespace {

// The items of a comma-separated list, each checked; `problem` says why not when one is not a T in range.
template <typename T>
std::vector<T> number_list(std::string_view text, const NumberRange<T>& range, std::string& problem) {
  std::vector<T> out;
  size_t start = 0;
  for (;;) {
    const size_t comma = text.find(',', start);
    const std::string_view item = text.substr(start, comma == std::string_view::npos ? comma : comma - start);
    if (!number_problem(item, range).empty()) {
      problem = detail::str_cat("a comma-separated list, each item ", range.text(), "; item ", out.size() + 1, " of '",
                                text, "' is '", item, "'");
      return {};
    }
    out.push_back(*to_number<T>(item));
    if (comma == std::string_view::npos) return out;
    start = comma + 1;
  }
}

}  // namespace

template <typename T>
std::vector<T> parse_number_list(const std::string& what, std::string_view text, const NumberRange<T>& range) {
  std::string problem;
  std::vector<T> out = number_list(text, range, problem);
  if (!problem.empty()) throw PermanentError(what + ": " + problem);
  return out;
}

template <typename T>
std::string number_list_problem(std::string_view text, const NumberRange<T>& range) {
  std::string problem;
  number_list(text, range, problem);
  return problem;
}

#define RINGTRAIN_NUMBER(T)                                                                                  \
  template std::string number_text<T>(T);                                                                    \
  template std::optional<T> to_number<T>(std::string_view);                                                  \
  template struct NumberRange<T>;                                                                            \
  template std::string number_problem<T>(std::string_view, const NumberRange<T>&);                           \
  template T parse_number<T>(const std::string&, std::string_view, const NumberRange<T>&);                   \
  template std::vector<T> parse_number_list<T>(const std::string&, std::string_view, const NumberRange<T>&); \
  template std::string number_list_problem<T>(std::string_view, const NumberRange<T>&);
RINGTRAIN_NUMBER(int)
RINGTRAIN_NUMBER(unsigned)
RINGTRAIN_NUMBER(long)
RINGTRAIN_NUMBER(long long)
RINGTRAIN_NUMBER(unsigned long)
RINGTRAIN_NUMBER(unsigned long long)
RINGTRAIN_NUMBER(double)
RINGTRAIN_NUMBER(float)
#undef RINGTRAIN_NUMBER

std::pair<std::string, std::string> split_number_unit(std::string_view text) {
  const size_t digits = std::min(text.find_first_not_of("0123456789.eE+-"), text.size());
  std::string number(text.substr(0, digits)), unit(text.substr(digits));
  // "1e3" is a number, but "1E" or "2e" would swallow the unit's letter: give a trailing e back.
  while (!number.empty() && (number.back() == 'e' || number.back() == 'E')) {
    unit.insert(unit.begin(), number.back());
    number.pop_back();
  }
  return {number, unit};
}

std::string bytes_problem(const std::string& text, int64_t& bytes) {
  const auto bad = [&](const std::string& why) {
    return detail::str_cat(why, ", got '", text,
                           "' (a size like 512M, 8G or 300MB: K/M/G/T and KiB/MiB/GiB/TiB are powers of 1024, "
                           "KB/MB/GB/TB powers of 1000)");
  };
  const auto [number, suffix] = split_number_unit(text);
  const std::optional<double> value = to_number<double>(number);
  if (!value) return bad("expected a size");
  std::string unit = suffix;
  std::transform(unit.begin(), unit.end(), unit.begin(), [](unsigned char c) { return std::tolower(c); });
  double scale = 0;
  static const struct {
    const char* name;
    double scale;
  } kUnits[] = {{"", 1},       {"b", 1},        {"k", 0x1p10},   {"kib", 0x1p10}, {"kb", 1e3},
                {"m", 0x1p20}, {"mib", 0x1p20}, {"mb", 1e6},     {"g", 0x1p30},   {"gib", 0x1p30},
                {"gb", 1e9},   {"t", 0x1p40},   {"tib", 0x1p40}, {"tb", 1e12}};
  for (const auto& u : kUnits)
    if (unit == u.name) scale = u.scale;
  if (scale == 0) return bad("unknown size unit '" + suffix + "'");
  if (*value < 0) return bad("a size is not negative");
  const double count = *value * scale;
  if (!(count < 0x1p63)) return bad("a size beyond 2^63 bytes");
  if (count != std::floor(count)) return bad("not a whole number of bytes");
  bytes = static_cast<int64_t>(count);
  return {};
}

int64_t parse_bytes(const std::string& what, const std::string& text) {
  int64_t bytes = 0;
  const std::string problem = bytes_problem(text, bytes);
  if (!problem.empty()) throw PermanentError(what + ": " + problem);
  return bytes;
}

}  // namespace ringtrain
