// core/hash.h: the non-cryptographic hashes. FNV-1a (64-bit) compares things across the ranks of one
// job (builds, bucket plans, configurations, tensor bytes): equality within one run is all that matters.
// Digest64 is the checksum stored in checkpoints: every 64-bit word goes through a full avalanche
// (splitmix64's finaliser) before it is folded in, so flipped bits cannot cancel each other the way they
// can in word-wise FNV (where two flips of bit 63 add 2^64 and vanish).
#pragma once

#include <cstdint>
#include <cstring>
#include <string_view>

namespace ringtrain {

namespace detail {
// Calls word(w) for each whole 64-bit word of data (native byte order); returns the bytes consumed.
template <typename Word>
int64_t for_each_word(const void* data, int64_t nbytes, Word&& word) {
  const auto* p = static_cast<const unsigned char*>(data);
  int64_t i = 0;
  for (; i + 8 <= nbytes; i += 8) {
    uint64_t w;
    std::memcpy(&w, p + i, 8);
    word(w);
  }
  return i;
}
}  // namespace detail

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
    for (int64_t i = detail::for_each_word(data, nbytes, [this](uint64_t w) { add_word(w); }); i < nbytes; ++i)
      h_ = (h_ ^ p[i]) * kPrime;
    h_ ^= static_cast<uint64_t>(nbytes);
    return *this;
  }
  uint64_t value() const { return h_; }

 private:
  uint64_t h_ = kOffsetBasis;
};

inline uint64_t fnv1a(std::string_view bytes) { return Fnv1a().add(bytes).value(); }

class Digest64 {
 public:
  Digest64& add_word(uint64_t word) {
    h_ = rotl(h_ ^ mix(word + kGolden * ++count_), 29) * 0x9fb21c651e98df25ull;
    return *this;
  }
  // Bytes as 64-bit words (the tail zero-padded), then the length.
  Digest64& add(const void* data, int64_t nbytes) {
    const auto* p = static_cast<const unsigned char*>(data);
    const int64_t i = detail::for_each_word(data, nbytes, [this](uint64_t w) { add_word(w); });
    if (i < nbytes) {
      uint64_t w = 0;
      std::memcpy(&w, p + i, static_cast<size_t>(nbytes - i));
      add_word(w);
    }
    return add_word(static_cast<uint64_t>(nbytes));
  }
  Digest64& add(std::string_view text) { return add(text.data(), static_cast<int64_t>(text.size())); }
  uint64_t value() const { return mix(h_ ^ count_); }

 private:
  static constexpr uint64_t kGolden = 0x9e3779b97f4a7c15ull;
  static uint64_t rotl(uint64_t x, int r) { return (x << r) | (x >> (64 - r)); }
  static uint64_t mix(uint64_t z) {  // splitmix64's finaliser: every input bit reaches every output bit
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
  }
  uint64_t h_ = kGolden;
  uint64_t count_ = 0;
};

}  // namespace ringtrain
