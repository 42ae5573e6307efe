// core/parse.h: numbers from text (flags, list items, environment variables, file names), checked.
// One rule for every place that reads a number a person wrote: the whole text is one decimal number of
// the target's kind, inside the range the caller states, or it is refused naming what was read and the
// range. Nothing wraps ("-1" as an unsigned), saturates ("18446744073709551616"), truncates
// ("4294967301" into an int, "2.5" into an integer) or changes base ("010", "0x10"); floats are finite.
#pragma once

#include <cstdint>
#include <limits>
#include <optional>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

namespace ringtrain {

// The whole of `text` as a T: an integer T takes optional '-' (signed T only) then decimal digits; a
// floating T takes what strtod does in the C locale, finite only. nullopt for anything else, or for a
// value T cannot hold exactly.
template <typename T>
std::optional<T> to_number(std::string_view text);

// A number as messages and --help show it: integers in full, floats with %g ("0.001", "1e+06").
template <typename T>
std::string number_text(T v);

// The bounds of a number: [lo, hi], or (lo, hi] with open_low (a positive float: lo 0, open_low).
template <typename T>
struct NumberRange {
  T lo = std::numeric_limits<T>::lowest();
  T hi = std::numeric_limits<T>::max();
  bool open_low = false;
  bool holds(T v) const { return (open_low ? v > lo : v >= lo) && v <= hi; }
  // "an integer in [1, 4096]", "a finite number in (0, 1e+06]".
  std::string text() const;
};

// Empty when `text` is a T in `range`, else why not: "expected an integer in [0, 1024], got '4096'".
template <typename T>
std::string number_problem(std::string_view text, const NumberRange<T>& range);

// `text` as a T in `range`; an Error "<what>: expected ..., got '<text>'" otherwise.
template <typename T>
T parse_number(const std::string& what, std::string_view text, const NumberRange<T>& range = {});

// A comma-separated list of numbers, each in `range` ("0,9,18"); empty items and an empty list refused.
template <typename T>
std::vector<T> parse_number_list(const std::string& what, std::string_view text, const NumberRange<T>& range = {});
// Empty when parse_number_list would take `text`, else why not: "a comma-separated list, each item ...".
template <typename T>
std::string number_list_problem(std::string_view text, const NumberRange<T>& range);

// Byte counts as people write them, for flags such as --max-memory: a number with an optional suffix, any
// case: none or B (bytes); K, M, G, T and KiB, MiB, GiB, TiB (powers of 1024, as Slurm and free(1) read
// them); KB, MB, GB, TB (powers of 1000, as SI defines them). The result is a whole number of bytes in
// [0, 2^63); a fraction of a byte ("0.5"), a negative, NaN or a value beyond 64 bits is refused naming `what`.
int64_t parse_bytes(const std::string& what, const std::string& text);
// `text` split where its leading number ends and a unit begins, for every "number and unit" the project reads
// (sizes, link rates, latencies): "10Gbit" -> {"10", "Gbit"}, "5e-6s" -> {"5e-6", "s"}. An 'e' or 'E' the
// number would end on belongs to the unit ("2E" -> {"2", "E"}). The number part must still pass to_number.
std::pair<std::string, std::string> split_number_unit(std::string_view text);
// parse_bytes without the throw: empty when `text` is a byte count (put in `bytes`), else why not.
std::string bytes_problem(const std::string& text, int64_t& bytes);

}  // namespace ringtrain
