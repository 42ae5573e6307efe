// core/pack.h: lossless packing of a mostly-zero CPU tensor (a ReLU's output): one bit per element,
// set where the element is not zero, and the elements that are not, in order. An element is zero when
// all its bits are (so -0.0 and NaN are kept as values): unpacking gives back the same bytes, whatever
// they are. For 4- and 2-byte elements (f32, bf16, f16, i32); at a density d of nonzeros an f32 tensor
// takes d + 1/32 of its bytes (d + 1/16 for 2 bytes).
//
// Activation recompute keeps each block's input between its forward and its backward; the inputs are a
// ReLU's outputs, about half zero, so packed they take about half the memory and the recompute still
// starts from the same bits (layers/recompute.cpp).
//
// In place: the tensor's memory becomes the packed form, so no second copy is made and the memory stays
// where the allocator put it (a new block for it would pin a hole in the heap among the activations
// freed around it). The work is split into blocks of 4096 elements over the worker threads; the mask,
// the compaction and the expansion use AVX-512 or AVX2 where the CPU has it (chosen at run time), plain
// C++ elsewhere, with the same result.
#pragma once

#include <cstdint>
#include <optional>
#include <vector>

#include "core/tensor.h"

namespace ringtrain {

struct PackedZeros {
  Shape shape;
  DType dtype = DType::F32;
  // The packed bytes, in the tensor's own memory (shrunk): the nonzero elements in order, 16 elements of
  // padding, then (at mask_offset, 64-byte aligned) one bit per element, element i at bit i % 64 of word
  // i / 64.
  Tensor bytes;  // u8
  int64_t mask_offset = 0;
  std::vector<int64_t> offsets;  // where block b's values start; offsets.back() = their count
  int64_t nonzeros() const { return offsets.empty() ? 0 : offsets.back(); }
  int64_t nbytes() const;  // what the packed form holds (bytes and offsets)
};

// Packs `t` in place if at most `max_density` of its elements are nonzero and the packed form is
// smaller: its memory is compacted and shrunk (Storage::shrink), and `t` is left undefined. Otherwise
// (too dense, too small to gain, another device or element size) nullopt, and `t` is as it was. `t`
// must be the only handle on its memory (Tensor::sole_owner): an error naming it otherwise.
std::optional<PackedZeros> pack_zeros(Tensor& t, double max_density = 0.8);

// A new tensor with the packed tensor's shape, dtype and bytes.
Tensor unpack_zeros(const PackedZeros& packed);

// A fused ReLU's mask in bits: bit i % 64 of word i / 64 set where y[i] > 0 (y: an f32 CPU tensor). All
// that the ReLU's backward needs of its output, in 1/32 of its memory: a batch norm + add + ReLU keeps
// this instead of its output, which (a block's output) is otherwise held only for that.
Tensor positive_bits(const Tensor& y);  // u8, (numel + 63) / 64 * 8 bytes
// out[i] = dy[i] where the bit is set, else 0 (f32 CPU tensors of one size; out may be dy itself).
void mask_by_bits(const Tensor& dy, const Tensor& bits, const Tensor& out);

namespace detail {
// Which code runs: "avx512", "avx2" or "generic"; set_pack_isa forces one (tests run each the CPU has).
const char* pack_isa();
void set_pack_isa(const char* isa);  // "avx512" or "avx2" (if the CPU has it), "generic"; other names throw
}  // namespace detail

}  // namespace ringtrain
