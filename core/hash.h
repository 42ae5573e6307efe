// core/hash.h: FNV-1a (64-bit), the one non-cryptographic hash ringtrain uses to compare things across
// ranks in the same job: builds, bucket plans, configurations, tensor bytes. Values are never stored, so
// only equality within one run matters.
#pragma once

#include <cstdint>
#include <cstring>
#include <string_view>

namespace ringtrain {

class Fnv1a {
 public:
  static constexpr uint64_t kOffsetBasis = 14695981039346656037ull;
  static constexpr uint64_t kPrime = 1099511628211ull;

  // Byte by byte (the textbook FNV-1a).
  Fnv1a& add(std::string_view bytes) {
    for (const char c : bytes) h_ = (h_ ^ static_cast<unsigned char>(c)) * kPrime;
    return *this;
  }
  // One 64-bit word as a single step: eight times fewer multiplications for bulk data (tensor bytes),
  // at the price of differing from the byte-wise hash of the same bytes.
  Fnv1a& add_word(uint64_t word) {
    h_ = (h_ ^ word) * kPrime;
    return *this;
  }
  // Bulk bytes as 64-bit words, the tail byte by byte, then the length.
  Fnv1a& add_words(const void* data, int64_t nbytes) {
    const auto* p = static_cast<const unsigned char*>(data);
    int64_t i = 0;
    for (; i + 8 <= nbytes; i += 8) {
      uint64_t w;
      std::memcpy(&w, p + i, 8);
      add_word(w);
    }
    for (; i < nbytes; ++i) h_ = (h_ ^ p[i]) * kPrime;
    h_ ^= static_cast<uint64_t>(nbytes);
    return *this;
  }
  uint64_t value() const { return h_; }

 private:
  uint64_t h_ = kOffsetBasis;
};

inline uint64_t fnv1a(std::string_view bytes) { return Fnv1a().add(bytes).value(); }

}  // namespace ringtrain
