// data/loader.cpp: transforms (pad-crop, random-resized crop, flip, normalise) and the worker pool.
#include "data/loader.h"

#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <cmath>
#include <memory>
#include <type_traits>
#include <utility>
#if defined(__x86_64__)
#include <immintrin.h>
#endif

#include "core/check.h"
#include "core/parallel.h"
#include "core/philox.h"
#include "data/codec.h"

namespace ringtrain::data {
namespace {

// Random words for one sample: block = sample index, stream = (epoch, draw group).
Philox4 draws(uint64_t seed, int64_t epoch, int64_t sample, uint64_t group) {
  return philox4x32_10(seed ^ 0x6a09e667f3bcc909ull, static_cast<uint64_t>(sample),
                       (static_cast<uint64_t>(epoch) << 8) | group);
}
double unit(uint32_t w) { return (w >> 8) * (1.0 / 16777216.0); }  // [0, 1)

struct Crop {
  double y0, x0, h, w;  // source window (may be fractional for the resized crop)
};

Crop resized_crop_window(int64_t height, int64_t width, bool train, uint64_t seed, int64_t epoch, int64_t sample) {
  const double area = static_cast<double>(height * width);
  if (train) {
    // torchvision's RandomResizedCrop: up to 10 attempts, then the central crop at a clamped ratio.
    for (uint64_t attempt = 0; attempt < 10; ++attempt) {
      const Philox4 r = draws(seed, epoch, sample, 8 + attempt);
      const double scale = 0.08 + (1.0 - 0.08) * unit(r.v[0]);
      const double log_ratio = std::log(3.0 / 4.0) + (std::log(4.0 / 3.0) - std::log(3.0 / 4.0)) * unit(r.v[1]);
      const double ratio = std::exp(log_ratio);
      const double w = std::round(std::sqrt(area * scale * ratio)), h = std::round(std::sqrt(area * scale / ratio));
      if (w >= 1 && h >= 1 && w <= width && h <= height) {
        const double y0 = std::floor(unit(r.v[2]) * (height - h + 1)), x0 = std::floor(unit(r.v[3]) * (width - w + 1));
        return {y0, x0, h, w};
      }
    }
  }
  const double side = static_cast<double>(std::min(height, width));
  return {std::floor((height - side) / 2), std::floor((width - side) / 2), side, side};
}

}  // namespace

std::array<int64_t, 3> transformed_shape(const SplitInfo& info, const Transform& t) {
  RT_CHECK(t.resize == 0 || t.resized_crop == 0, "transform: resize (", t.resize, ") and a random-resized crop (",
           t.resized_crop, ") exclude each other");
  if (t.resized_crop > 0) return {t.resized_crop, t.resized_crop, info.channels};
  RT_CHECK(t.resize == 0 || !info.varied_size(), "split '", info.split,
           "' holds images of varied sizes: resizing them to one size takes a random-resized crop instead ",
           "(Transform::resized_crop; train_resnet: --image-size)");
  if (t.resize > 0) return {t.resize, t.resize, info.channels};
  RT_CHECK(!info.varied_size(), "split '", info.split,
           "' holds images of varied sizes: they have one shape only after ",
           "a random-resized crop (Transform::resized_crop; train_resnet: --image-size)");
  return {info.height, info.width, info.channels};
}

namespace {

// r: the sample's draws of group 0 (its flip, then the pad-crop offsets).
bool flip_of(const Transform& t, const Philox4& r) { return t.hflip && t.train && (r.v[0] & 1u); }

// Calls fn with `out` as the transform's output element type (f32 or bf16).
template <typename Fn>
void with_output(DType dtype, void* out, Fn&& fn) {
  if (dtype == DType::BF16)
    fn(static_cast<BFloat16*>(out));
  else
    fn(static_cast<float*>(out));
}

template <typename Out>
Out store_as(float v) {
  if constexpr (std::is_same_v<Out, BFloat16>)
    return f32_to_bf16(v);
  else
    return v;
}

// The resized crop's two passes, one output row at a time. Each has a portable version and an AVX2 one
// (AVX-512 machines run it too), chosen at run time; both do the same float operations in the same order
// (this file is built with -ffp-contract=off, so nothing is fused into an FMA), so the bits do not depend
// on the CPU.
//
// Horizontal: dst[i] = a + (b - a) * w[i] with a = row[i0[i]], b = row[i1[i]] (byte offsets in the row).
void horizontal_portable(const uint8_t* row, const int32_t* i0, const int32_t* i1, const float* w, int64_t n,
                         float* dst) {
  for (int64_t i = 0; i < n; ++i) {
    const float a = row[i0[i]], b = row[i1[i]];
    dst[i] = a + (b - a) * w[i];
  }
}

// Vertical, then normalised: o[i] = (top + (bottom - top) * wy) * scale[i] + shift[i].
template <typename Out>
void vertical_portable(const float* top, const float* bottom, float wy, const float* scale, const float* shift,
                       int64_t n, Out* o) {
  for (int64_t i = 0; i < n; ++i) o[i] = store_as<Out>((top[i] + (bottom[i] - top[i]) * wy) * scale[i] + shift[i]);
}

#if defined(__x86_64__)
// Gathers 32 bits at each byte offset and keeps the low byte: it reads up to 3 bytes past row[i0[i]], so
// the caller uses it only where the row is followed by another one.
__attribute__((target("avx2"))) void horizontal_avx2(const uint8_t* row, const int32_t* i0, const int32_t* i1,
                                                     const float* w, int64_t n, float* dst) {
  const __m256i low = _mm256_set1_epi32(0xFF);
  const int* base = reinterpret_cast<const int*>(row);
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m256i j0 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(i0 + i));
    const __m256i j1 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(i1 + i));
    const __m256 a = _mm256_cvtepi32_ps(_mm256_and_si256(_mm256_i32gather_epi32(base, j0, 1), low));
    const __m256 b = _mm256_cvtepi32_ps(_mm256_and_si256(_mm256_i32gather_epi32(base, j1, 1), low));
    const __m256 d = _mm256_mul_ps(_mm256_sub_ps(b, a), _mm256_loadu_ps(w + i));
    _mm256_storeu_ps(dst + i, _mm256_add_ps(a, d));
  }
  horizontal_portable(row, i0 + i, i1 + i, w + i, n - i, dst + i);
}

__attribute__((target("avx2"))) void vertical_avx2(const float* top, const float* bottom, float wy, const float* scale,
                                                   const float* shift, int64_t n, float* o) {
  const __m256 w = _mm256_set1_ps(wy);
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m256 t = _mm256_loadu_ps(top + i);
    const __m256 v = _mm256_add_ps(t, _mm256_mul_ps(_mm256_sub_ps(_mm256_loadu_ps(bottom + i), t), w));
    _mm256_storeu_ps(o + i, _mm256_add_ps(_mm256_mul_ps(v, _mm256_loadu_ps(scale + i)), _mm256_loadu_ps(shift + i)));
  }
  vertical_portable(top + i, bottom + i, wy, scale + i, shift + i, n - i, o + i);
}

bool cpu_has_avx2() {
  static const bool has = __builtin_cpu_supports("avx2");
  return has;
}
#else
bool cpu_has_avx2() { return false; }
#endif

// Random-resized crop of `crop` (in the image's own coordinates, possibly fractional) from an (H, W, C)
// image to (OH, OW, C), bilinear at pixel centres, clamped to the image; flipped horizontally if asked;
// then normalised with scale/shift per channel.
template <typename Out>
void resized_crop_into(const uint8_t* image, int64_t H, int64_t W, int64_t C, const Crop& crop, int64_t OH, int64_t OW,
                       bool flip, Out* out, const float* scale, const float* shift) {
  RT_CHECK(H * W * C < (int64_t{1} << 31), "transform: a ", H, "x", W, "x", C, " image is over 2 GiB");
  // Bilinear sampling at pixel centres of the crop window; the taps of every output element of a row
  // (byte offsets into a source row and the weight) computed once per image.
  const double sy = crop.h / static_cast<double>(OH), sx = crop.w / static_cast<double>(OW);
  const int64_t n = OW * C;
  std::vector<int32_t> i0(static_cast<size_t>(n)), i1(static_cast<size_t>(n));
  std::vector<float> wx(static_cast<size_t>(n)), row_scale(static_cast<size_t>(n)), row_shift(static_cast<size_t>(n));
  for (int64_t ox = 0; ox < OW; ++ox) {
    const int64_t tx = flip ? OW - 1 - ox : ox;
    const double fx = std::clamp(crop.x0 + (tx + 0.5) * sx - 0.5, 0.0, static_cast<double>(W - 1));
    const int64_t c0 = static_cast<int64_t>(fx), c1 = std::min(c0 + 1, W - 1);
    const float w = static_cast<float>(fx - std::floor(fx));
    for (int64_t c = 0; c < C; ++c) {
      const size_t k = static_cast<size_t>(ox * C + c);
      i0[k] = static_cast<int32_t>(c0 * C + c);
      i1[k] = static_cast<int32_t>(c1 * C + c);
      wx[k] = w;
      row_scale[k] = scale[c];
      row_shift[k] = shift[c];
    }
  }
  const bool avx2 = cpu_has_avx2();
  // Separable: each source row the crop needs is resized horizontally once (into one of two row
  // buffers), then every output row is one contiguous blend of two of them. The same arithmetic per
  // element as blending all four taps per pixel.
  std::vector<float> rows(static_cast<size_t>(2 * n));
  float* held[2] = {rows.data(), rows.data() + n};
  int64_t held_y[2] = {-1, -1};
  auto horizontal = [&](int64_t y) -> const float* {
    for (int k = 0; k < 2; ++k)
      if (held_y[k] == y) return held[k];
    // Replace the older row: rows only move down, so fetching y1 never evicts the y0 just fetched.
    const int k = held_y[0] < held_y[1] ? 0 : 1;
    held_y[k] = y;
    const uint8_t* row = image + y * W * C;
#if defined(__x86_64__)
    if (avx2 && (H - 1 - y) * W * C >= 3) {  // the gathers' 3 extra bytes fall inside the rows below
      horizontal_avx2(row, i0.data(), i1.data(), wx.data(), n, held[k]);
      return held[k];
    }
#endif
    horizontal_portable(row, i0.data(), i1.data(), wx.data(), n, held[k]);
    return held[k];
  };
  for (int64_t oy = 0; oy < OH; ++oy) {
    const double fy = std::clamp(crop.y0 + (oy + 0.5) * sy - 0.5, 0.0, static_cast<double>(H - 1));
    const int64_t y0 = static_cast<int64_t>(fy), y1 = std::min(y0 + 1, H - 1);
    const float wy = static_cast<float>(fy - static_cast<double>(y0));
    const float* top = horizontal(y0);
    const float* bottom = horizontal(y1);
#if defined(__x86_64__)
    if constexpr (std::is_same_v<Out, float>) {
      if (avx2) {
        vertical_avx2(top, bottom, wy, row_scale.data(), row_shift.data(), n, out + oy * n);
        continue;
      }
    }
#endif
    vertical_portable(top, bottom, wy, row_scale.data(), row_shift.data(), n, out + oy * n);
  }
}

// Transform::resize: the whole (H, W, C) image bilinear at pixel centres (clamped at the edges) to (OH, OW, C),
// rounded to bytes.
std::vector<uint8_t> resize_image(const uint8_t* image, int64_t H, int64_t W, int64_t C, int64_t OH, int64_t OW) {
  std::vector<uint8_t> out(static_cast<size_t>(OH * OW * C));
  const double sy = static_cast<double>(H) / static_cast<double>(OH),
               sx = static_cast<double>(W) / static_cast<double>(OW);
  for (int64_t oy = 0; oy < OH; ++oy) {
    const double fy = std::clamp((oy + 0.5) * sy - 0.5, 0.0, static_cast<double>(H - 1));
    const int64_t y0 = static_cast<int64_t>(fy), y1 = std::min(y0 + 1, H - 1);
    const double wy = fy - static_cast<double>(y0);
    for (int64_t ox = 0; ox < OW; ++ox) {
      const double fx = std::clamp((ox + 0.5) * sx - 0.5, 0.0, static_cast<double>(W - 1));
      const int64_t x0 = static_cast<int64_t>(fx), x1 = std::min(x0 + 1, W - 1);
      const double wx = fx - static_cast<double>(x0);
      for (int64_t c = 0; c < C; ++c) {
        auto at = [&](int64_t y, int64_t x) { return static_cast<double>(image[(y * W + x) * C + c]); };
        const double top = at(y0, x0) + (at(y0, x1) - at(y0, x0)) * wx;
        const double bottom = at(y1, x0) + (at(y1, x1) - at(y1, x0)) * wx;
        out[static_cast<size_t>((oy * OW + ox) * C + c)] =
            static_cast<uint8_t>(std::clamp(std::lround(top + (bottom - top) * wy), 0L, 255L));
      }
    }
  }
  return out;
}

// The transform's inner loops, for one output element type. scale/shift: per-channel normalisation.
// Where a sample's pixels go, from its draws: the flip, and the pad-crop's offsets (in [-p, p]; 0 without one).
// The image (transform_into) and its mask (apply_mask_transform) read the same.
struct Placement {
  bool flip = false;
  int64_t dy = 0, dx = 0;
};
Placement placement(const Transform& t, uint64_t seed, int64_t epoch, int64_t sample_index) {
  const Philox4 r = draws(seed, epoch, sample_index, 0);
  Placement at;
  at.flip = flip_of(t, r);
  const int64_t p = t.train ? t.pad_crop : 0;
  if (p > 0) {
    at.dy = static_cast<int64_t>(r.v[1] % static_cast<uint32_t>(2 * p + 1)) - p;
    at.dx = static_cast<int64_t>(r.v[2] % static_cast<uint32_t>(2 * p + 1)) - p;
  }
  return at;
}

template <typename Out>
void transform_into(const SplitInfo& info, const Transform& t, const uint8_t* image, uint64_t seed, int64_t epoch,
                    int64_t sample_index, Out* out, const float* scale, const float* shift) {
  int64_t H = info.height, W = info.width;
  const int64_t C = info.channels;
  std::vector<uint8_t> resized;
  if (t.resize > 0) {
    resized = resize_image(image, H, W, C, t.resize, t.resize);
    image = resized.data();
    H = W = t.resize;
  }
  const auto [OH, OW, OC] = transformed_shape(info, t);
  (void)OC;
  const Placement at = placement(t, seed, epoch, sample_index);
  const bool flip = at.flip;
  if (t.resized_crop > 0) {
    const Crop crop = resized_crop_window(H, W, t.train, seed, epoch, sample_index);
    resized_crop_into(image, H, W, C, crop, OH, OW, flip, out, scale, shift);
    return;
  }
  // Pad-and-crop or identity; zero pixels outside the image. Row by row: the in-image part of a row is one
  // tight loop.
  const int64_t dy = at.dy, dx = at.dx;
  std::vector<float> row_scale(static_cast<size_t>(OW * C)), row_shift(static_cast<size_t>(OW * C));
  for (int64_t i = 0; i < OW * C; ++i) {
    row_scale[static_cast<size_t>(i)] = scale[i % C];
    row_shift[static_cast<size_t>(i)] = shift[i % C];
  }
  for (int64_t y = 0; y < OH; ++y) {
    Out* o = out + y * OW * C;
    const int64_t src_y = y + dy;
    if (src_y < 0 || src_y >= H) {
      for (int64_t i = 0; i < OW * C; ++i) o[i] = store_as<Out>(row_shift[static_cast<size_t>(i)]);
      continue;
    }
    const uint8_t* row = image + src_y * W * C;
    if (!flip && dx == 0) {
      for (int64_t i = 0; i < OW * C; ++i)
        o[i] = store_as<Out>(row[i] * row_scale[static_cast<size_t>(i)] + row_shift[static_cast<size_t>(i)]);
      continue;
    }
    for (int64_t x = 0; x < OW; ++x) {
      const int64_t src_x = (flip ? OW - 1 - x : x) + dx;
      const bool inside = src_x >= 0 && src_x < W;
      for (int64_t c = 0; c < C; ++c) {
        const float v = inside ? row[src_x * C + c] : 0.0f;
        o[x * C + c] = store_as<Out>(v * scale[c] + shift[c]);
      }
    }
  }
}

// Per-channel (x/255 - mean) / std as x * scale + shift.
struct Normalisation {
  std::array<float, 16> scale{}, shift{};
};

Normalisation normalisation_of(const SplitInfo& info, const Transform& t) {
  const int64_t C = info.channels;
  RT_CHECK(C <= 16, "transform: at most 16 channels, got ", C);
  Normalisation n;
  for (int64_t c = 0; c < C; ++c) {
    const size_t k = static_cast<size_t>(c);
    const double mean = t.normalize && k < info.mean.size() ? info.mean[k] : 0.0;
    const double std = t.normalize && k < info.std.size() && info.std[k] > 0 ? info.std[k] : 1.0;
    n.scale[k] = static_cast<float>(1.0 / (255.0 * std));
    n.shift[k] = static_cast<float>(-mean / std);
  }
  return n;
}

std::string shape_text(const std::array<int64_t, 3>& s) { return detail::str_cat(s[0], "x", s[1], "x", s[2]); }

}  // namespace

void apply_transform(const SplitInfo& info, const Transform& t, const uint8_t* image, uint64_t seed, int64_t epoch,
                     int64_t sample_index, void* out) {
  const Normalisation n = normalisation_of(info, t);
  with_output(t.dtype, out, [&](auto* o) {
    transform_into(info, t, image, seed, epoch, sample_index, o, n.scale.data(), n.shift.data());
  });
}

void apply_mask_transform(const SplitInfo& info, const Transform& t, const uint8_t* mask, uint64_t seed, int64_t epoch,
                          int64_t sample_index, int64_t* out) {
  RT_CHECK(t.resized_crop == 0, "split '", info.split, "': a segmentation mask follows resize, pad-crop and flip, not ",
           "a random-resized crop (resize the images instead: train_resnet --image-size)");
  int64_t H = info.height, W = info.width;
  std::vector<uint8_t> resized;
  if (t.resize > 0) {  // the nearest source pixel of each output pixel's centre
    resized.resize(static_cast<size_t>(t.resize * t.resize));
    for (int64_t oy = 0; oy < t.resize; ++oy) {
      const int64_t y = std::min(H - 1, static_cast<int64_t>((oy + 0.5) * static_cast<double>(H) / t.resize));
      for (int64_t ox = 0; ox < t.resize; ++ox) {
        const int64_t x = std::min(W - 1, static_cast<int64_t>((ox + 0.5) * static_cast<double>(W) / t.resize));
        resized[static_cast<size_t>(oy * t.resize + ox)] = mask[y * W + x];
      }
    }
    mask = resized.data();
    H = W = t.resize;
  }
  const auto [OH, OW, OC] = transformed_shape(info, t);
  (void)OC;
  const Placement at = placement(t, seed, epoch, sample_index);  // the image's draws
  for (int64_t y = 0; y < OH; ++y) {
    const int64_t sy = y + at.dy;
    for (int64_t x = 0; x < OW; ++x) {
      const int64_t sx = (at.flip ? OW - 1 - x : x) + at.dx;
      out[y * OW + x] = sy >= 0 && sy < H && sx >= 0 && sx < W ? mask[sy * W + sx] : info.ignore_index;
    }
  }
}

std::string decode_transform(const SplitInfo& info, const Transform& t, const uint8_t* bytes, size_t size,
                             const std::array<int64_t, 3>& expected, uint64_t seed, int64_t epoch, int64_t sample_index,
                             void* out) {
  auto check_shape = [&](int64_t h, int64_t w, int64_t c) {
    if (h != expected[0] || w != expected[1] || c != expected[2])
      RT_THROW("decodes to ", shape_text({h, w, c}), ", expected ", shape_text(expected));
  };
  if (t.resized_crop <= 0) {
    const DecodedImage image = decode_image(bytes, size);
    check_shape(image.height, image.width, image.channels);
    apply_transform(info, t, image.pixels.data(), seed, epoch, sample_index, out);
    return image.first_warning;
  }
  const int64_t OH = t.resized_crop, OW = t.resized_crop;
  Crop crop{};
  const DecodedRegion region = decode_image_region(bytes, size, [&](const ImageHeader& h) {
    check_shape(h.height, h.width, h.channels);
    crop = resized_crop_window(h.height, h.width, t.train, seed, epoch, sample_index);
    RegionRequest r;
    r.scale = t.dct_scaling ? dct_scale_for(crop.h, crop.w, OH, OW) : 1;
    if (!t.region_decode) {
      r.h = h.height, r.w = h.width;
      return r;
    }
    // The window on the scaled image with two pixels to spare on every side: the bilinear taps reach one
    // pixel past the crop, and a region's outermost column may be upsampled from clamped chroma.
    const double s = static_cast<double>(r.scale);
    r.y0 = static_cast<int64_t>(std::floor(crop.y0 / s)) - 2;
    r.x0 = static_cast<int64_t>(std::floor(crop.x0 / s)) - 2;
    r.h = static_cast<int64_t>(std::ceil((crop.y0 + crop.h) / s)) + 2 - r.y0;
    r.w = static_cast<int64_t>(std::ceil((crop.x0 + crop.w) / s)) + 2 - r.x0;
    return r;
  });
  const DecodedImage& image = region.image;
  // The header said how many channels the decode gives; a decoder that disagreed would mislabel them.
  if (image.channels != expected[2]) RT_THROW("decodes to ", image.channels, " channels, expected ", expected[2]);
  const double s = static_cast<double>(region.scale);
  const Crop local{crop.y0 / s - static_cast<double>(region.y0), crop.x0 / s - static_cast<double>(region.x0),
                   crop.h / s, crop.w / s};
  const bool flip = flip_of(t, draws(seed, epoch, sample_index, 0));
  const Normalisation n = normalisation_of(info, t);
  with_output(t.dtype, out, [&](auto* o) {
    resized_crop_into(image.pixels.data(), image.height, image.width, image.channels, local, OH, OW, flip, o,
                      n.scale.data(), n.shift.data());
  });
  return image.first_warning;
}

void Loader::set_images(bool images) {
  std::lock_guard<std::mutex> lock(mutex_);
  RT_CHECK(workers_.empty(), "Loader::set_images while an epoch is loading (call it between epochs)");
  options_.images = images;
}

DecodeWarnings Loader::take_decode_warnings() {
  std::lock_guard<std::mutex> lock(mutex_);
  return std::exchange(warnings_, DecodeWarnings{});
}

Loader::Loader(const ShardDataset& dataset, LoaderOptions options) : dataset_(dataset), options_(options) {
  const Transform& t = options_.transform;
  RT_CHECK(t.dtype == DType::F32 || t.dtype == DType::BF16, "loader: output dtype must be f32 or bf16, got ",
           dtype_name(t.dtype));
  RT_CHECK(t.pad_crop >= 0 && t.resized_crop >= 0, "loader: negative crop size");
  const SplitInfo& info = dataset.info();
  if (info.varied_size())
    RT_CHECK(
        t.resized_crop > 0, "loader: split '", info.split, "' holds images of varied sizes (make_shards --size 0), ",
        "which only a random-resized crop (Transform::resized_crop; train_resnet: --image-size) brings to one shape");
  // A crop padded by more than the image is mostly padding: almost certainly a wrong flag.
  RT_CHECK(t.pad_crop == 0 || t.pad_crop <= std::min(info.height, info.width), "loader: pad_crop (--pad-crop) ",
           t.pad_crop, " is larger than the ", info.height, "x", info.width, " images of split '", info.split, "'");
  RT_CHECK(t.resized_crop <= 8192, "loader: Transform::resized_crop (train_resnet: --image-size) ", t.resized_crop,
           " is over 8192 pixels");
  RT_CHECK(options_.prefetch >= 1, "loader: prefetch must be >= 1, got ", options_.prefetch);
  RT_CHECK(options_.nice >= 0 && options_.nice <= 19, "loader: nice (--loader-nice) must be from 0 to 19, got ",
           options_.nice);
  threads_ = options_.threads > 0 ? options_.threads : std::max(1, num_threads() - 1);
  const int cores = available_cores();
  RT_CHECK(threads_ <= kMaxThreadsPerCore * cores, options_.threads_flag, " ", threads_, ": this process has ", cores,
           " core(s) available; more than ", kMaxThreadsPerCore,
           " loader threads per core only slow the loading down (0 chooses ", std::max(1, num_threads() - 1), ")");
  errno = 0;
  const int nice_now = ::getpriority(PRIO_PROCESS, static_cast<id_t>(::gettid()));
  caller_nice_ = errno == 0 ? nice_now : 0;
  worker_nice_ = caller_nice_;
  if (options_.device.is_cuda()) copy_stream_ = Stream::create(options_.device);
}

Loader::~Loader() { stop(); }

void Loader::stop() {
  // Host buffers of copies still running must outlive them.
  for (auto& f : in_flight_) f.done.synchronize();
  in_flight_.clear();
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stopping_ = true;
  }
  produced_.notify_all();
  consumed_.notify_all();
  for (auto& w : workers_) w.join();
  workers_.clear();
}

void Loader::start(std::vector<std::vector<int64_t>> batches, int64_t epoch, int64_t first_batch) {
  stop();
  for (const auto& b : batches)
    for (int64_t i : b)
      if (i < -1 || i >= dataset_.size())
        RT_THROW("loader: record index ", i, " is out of range for split '", dataset_.info().split, "' of ",
                 dataset_.size(), " records");
  std::lock_guard<std::mutex> lock(mutex_);
  batches_ = std::move(batches);
  epoch_ = epoch;
  first_batch_ = first_batch;  // set before the workers start: they read it without the lock
  ready_.clear();
  next_to_build_ = next_to_deliver_ = 0;
  stopping_ = false;
  started_ = true;
  error_ = nullptr;
  for (int i = 0; i < threads_; ++i) workers_.emplace_back([this] { worker(); });
}

void Loader::start_epoch(DistributedSampler& sampler, int64_t epoch) {
  if (sampler.state().epoch != epoch) sampler.set_epoch(epoch);
  std::vector<std::vector<int64_t>> batches;
  std::vector<int64_t> indices;
  const int64_t first = sampler.state().next_batch;
  while (sampler.next(indices)) batches.push_back(indices);
  start(std::move(batches), epoch, first);
}

SamplerState Loader::position() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return SamplerState{epoch_, first_batch_ + next_to_deliver_};
}

Batch Loader::build(int64_t t) {
  const std::vector<int64_t>& indices = batches_[static_cast<size_t>(t)];
  const SplitInfo& info = dataset_.info();
  const Transform& transform = options_.transform;
  const auto shape = transformed_shape(info, transform);
  const int64_t n = static_cast<int64_t>(indices.size());
  std::vector<int64_t> real;
  for (int64_t i : indices)
    if (i >= 0) real.push_back(i);
  Batch batch;
  batch.index = first_batch_ + t;
  batch.valid = static_cast<int64_t>(real.size());
  if (info.segmentation) return build_segmentation(std::move(batch), real, n);
  if (!options_.images) {  // labels only, from memory
    batch.labels =
        options_.device.is_cuda() ? Tensor::empty_pinned(Shape{n}, DType::I64) : Tensor::empty(Shape{n}, DType::I64);
    int64_t* labels = batch.labels.data<int64_t>();
    for (int64_t k = 0; k < n; ++k) labels[k] = k < batch.valid ? dataset_.label(real[static_cast<size_t>(k)]) : 0;
    return batch;
  }
  const Shape image_shape{n, shape[0], shape[1], shape[2]};
  // Every real slot is overwritten by its sample; only padding slots are zeroed below.
  if (options_.device.is_cuda()) {
    batch.images = Tensor::empty_pinned(image_shape, transform.dtype);
    batch.labels = Tensor::empty_pinned(Shape{n}, DType::I64);
  } else {
    batch.images = Tensor::empty(image_shape, transform.dtype);
    batch.labels = Tensor::empty(Shape{n}, DType::I64);
  }
  const int64_t sample_bytes = shape[0] * shape[1] * shape[2] * dtype_size(transform.dtype);
  auto* out = static_cast<uint8_t*>(batch.images.data_ptr());
  int64_t* out_labels = batch.labels.data<int64_t>();
  // Real samples first (in the batch's order), padding (-1) after them.
  const int64_t slots = static_cast<int64_t>(real.size());
  if (info.encoded) {
    // Each record decoded straight into its slot: under a random-resized crop only the part the crop
    // needs, at a reduced DCT scale when the crop allows.
    for (int64_t k = 0; k < slots; ++k) {
      const int64_t index = real[static_cast<size_t>(k)];
      int32_t label = 0;
      const std::vector<uint8_t> bytes = dataset_.read_encoded(index, &label);
      std::string warning;
      try {
        warning = decode_transform(info, transform, bytes.data(), bytes.size(), dataset_.record_shape(index),
                                   options_.seed, epoch_, index, out + k * sample_bytes);
      } catch (const Error& e) {
        RT_THROW(dataset_.record_name(index), ": ", e.what());
      }
      if (!warning.empty()) {
        if (options_.strict)
          RT_THROW(dataset_.record_name(index), ": libjpeg: ", warning,
                   " (its data is damaged: parts of the image are gray or garbled; --strict refuses such records)");
        std::lock_guard<std::mutex> lock(mutex_);
        if (warnings_.records++ == 0) warnings_.first = detail::str_cat(dataset_.record_name(index), ": ", warning);
      }
      out_labels[k] = label;
    }
  } else {
    // Uninitialised: every byte is read into (zeroing megabytes per batch was measurable).
    const std::unique_ptr<uint8_t[]> raw(new uint8_t[static_cast<size_t>(slots * info.record_bytes())]);
    std::vector<int32_t> labels(real.size());
    dataset_.read_indices(real, raw.get(), labels.data());
    for (int64_t k = 0; k < slots; ++k) {
      apply_transform(info, transform, raw.get() + k * info.record_bytes(), options_.seed, epoch_,
                      real[static_cast<size_t>(k)], out + k * sample_bytes);
      out_labels[k] = labels[static_cast<size_t>(k)];
    }
  }
  if (slots < n) {
    std::fill(out + slots * sample_bytes, out + n * sample_bytes, uint8_t{0});
    std::fill(out_labels + slots, out_labels + n, int64_t{0});
  }
  return batch;
}

// A segmentation split's batch: each record's mask through its image's geometry into (n, H, W) labels, the
// padding slots all ignored; the images (unless labels only) as any decoded split's.
Batch Loader::build_segmentation(Batch batch, const std::vector<int64_t>& real, int64_t n) {
  const SplitInfo& info = dataset_.info();
  const Transform& transform = options_.transform;
  const auto shape = transformed_shape(info, transform);
  const Shape label_shape{n, shape[0], shape[1]};
  const bool pinned = options_.device.is_cuda();
  batch.labels = pinned ? Tensor::empty_pinned(label_shape, DType::I64) : Tensor::empty(label_shape, DType::I64);
  const int64_t slots = static_cast<int64_t>(real.size()), per = shape[0] * shape[1];
  int64_t* labels = batch.labels.data<int64_t>();
  std::vector<uint8_t> masks(static_cast<size_t>(slots * info.mask_bytes()));
  dataset_.read_masks(real, masks.data());
  for (int64_t k = 0; k < slots; ++k)
    apply_mask_transform(info, transform, masks.data() + k * info.mask_bytes(), options_.seed, epoch_,
                         real[static_cast<size_t>(k)], labels + k * per);
  std::fill(labels + slots * per, labels + n * per, static_cast<int64_t>(info.ignore_index));
  if (!options_.images) return batch;
  const Shape image_shape{n, shape[0], shape[1], shape[2]};
  batch.images =
      pinned ? Tensor::empty_pinned(image_shape, transform.dtype) : Tensor::empty(image_shape, transform.dtype);
  const int64_t sample_bytes = shape[0] * shape[1] * shape[2] * dtype_size(transform.dtype);
  auto* out = static_cast<uint8_t*>(batch.images.data_ptr());
  const std::unique_ptr<uint8_t[]> raw(new uint8_t[static_cast<size_t>(slots * info.record_bytes())]);
  dataset_.read_indices(real, raw.get(), nullptr);
  for (int64_t k = 0; k < slots; ++k)
    apply_transform(info, transform, raw.get() + k * info.record_bytes(), options_.seed, epoch_,
                    real[static_cast<size_t>(k)], out + k * sample_bytes);
  std::fill(out + slots * sample_bytes, out + n * sample_bytes, uint8_t{0});
  return batch;
}

void Loader::worker() {
  // Linux gives every thread its own nice value; a failure (a sandbox refusing it) only leaves the worker
  // at the caller's priority.
  if (options_.nice > 0) {
    const int target = std::min(19, caller_nice_ + options_.nice);
    if (::setpriority(PRIO_PROCESS, static_cast<id_t>(::gettid()), target) == 0) worker_nice_ = target;
  }
  for (;;) {
    int64_t t;
    {
      std::unique_lock<std::mutex> lock(mutex_);
      consumed_.wait(lock, [&] {
        return stopping_ || next_to_build_ >= static_cast<int64_t>(batches_.size()) ||
               next_to_build_ < next_to_deliver_ + options_.prefetch;
      });
      if (stopping_ || next_to_build_ >= static_cast<int64_t>(batches_.size())) return;
      t = next_to_build_++;
    }
    try {
      Batch b = build(t);
      std::lock_guard<std::mutex> lock(mutex_);
      ready_.emplace(t, std::move(b));
    } catch (const std::exception& e) {
      std::lock_guard<std::mutex> lock(mutex_);
      if (!error_) {
        try {
          RT_THROW("loader: batch ", first_batch_ + t, " of epoch ", epoch_, " (split '", dataset_.info().split,
                   "'): ", e.what());
        } catch (...) {
          error_ = std::current_exception();
        }
      }
      stopping_ = true;
    } catch (...) {
      std::lock_guard<std::mutex> lock(mutex_);
      if (!error_) error_ = std::current_exception();
      stopping_ = true;
    }
    produced_.notify_all();
  }
}

std::optional<Batch> Loader::next() {
  std::unique_lock<std::mutex> lock(mutex_);
  if (next_to_deliver_ >= static_cast<int64_t>(batches_.size())) return std::nullopt;
  if (!started_) RT_THROW("loader: next() before start()");
  produced_.wait(lock, [&] { return error_ || ready_.count(next_to_deliver_) || stopping_; });
  if (error_) {
    std::exception_ptr e = error_;
    lock.unlock();
    stop();
    std::rethrow_exception(e);
  }
  if (stopping_) return std::nullopt;  // stopped: prefetched batches are dropped
  // Copy the handles out and deliver (which may fail: device memory) before the batch leaves the
  // queue, so a failed delivery can be retried instead of silently skipping the batch.
  Batch b = ready_.at(next_to_deliver_);
  lock.unlock();
  Batch delivered = options_.device.is_cuda() ? to_device(b) : b;
  lock.lock();
  ready_.erase(next_to_deliver_);
  ++next_to_deliver_;
  lock.unlock();
  consumed_.notify_all();
  return delivered;
}

Batch Loader::to_device(Batch host) {
  // Retire host buffers whose copies are done (at most `prefetch` in flight).
  while (static_cast<int>(in_flight_.size()) >= options_.prefetch) {
    in_flight_.front().done.synchronize();
    in_flight_.erase(in_flight_.begin());
  }
  const Device d = options_.device;
  const Stream compute = current_stream();
  // Device memory comes from the compute stream's pool; the copy stream first waits for the compute
  // stream so a reused block is no longer being read, then the compute stream waits for the copy.
  Batch out;
  out.index = host.index;
  out.valid = host.valid;
  if (host.images.defined()) out.images = Tensor::empty(host.images.shape(), host.images.dtype(), d);
  out.labels = Tensor::empty(host.labels.shape(), DType::I64, d);
  Event compute_ready = Event::create(d);
  compute_ready.record(compute);
  compute_ready.wait_on(copy_stream_);
  if (host.images.defined())
    copy_bytes_async(out.images.data_ptr(), d, host.images.data_ptr(), Device::cpu(), host.images.nbytes(),
                     copy_stream_);
  copy_bytes_async(out.labels.data_ptr(), d, host.labels.data_ptr(), Device::cpu(), host.labels.nbytes(), copy_stream_);
  Event copied = Event::create(d);
  copied.record(copy_stream_);
  copied.wait_on(compute);
  in_flight_.push_back(InFlight{copied, std::move(host)});
  return out;
}

}  // namespace ringtrain::data
