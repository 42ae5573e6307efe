// data/codec.h: image decoding (JPEG via libjpeg-turbo, PNG via libpng; the format is detected from
// the magic bytes, not the file name), encoding (for --keep-encoded shards and test fixtures) and the
// shorter-side resize + center crop the converters use. Pixels are always uint8 HWC.
// Errors are ringtrain::Error naming what was wrong with the bytes; callers add the file name.
// Neither library is ever allowed to call exit(): both report through setjmp/longjmp error handlers.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

namespace ringtrain::data {

struct DecodedImage {
  int64_t height = 0, width = 0, channels = 0;  // channels: 1 (gray) or 3 (RGB)
  std::vector<uint8_t> pixels;                  // (height, width, channels)
};

enum class ImageFormat { kUnknown, kJpeg, kPng };

// From the first bytes: JPEG starts FF D8 FF, PNG with its 8-byte signature.
ImageFormat detect_image_format(const uint8_t* bytes, size_t size);

// Decodes a JPEG or PNG. Grayscale (with or without alpha) gives 1 channel; everything else 3: alpha
// is dropped, palettes expanded, 16-bit samples scaled to 8 bits, CMYK JPEGs converted to RGB.
// Throws for an unknown format, corrupt or truncated data, or an image over 1 GiB decoded.
DecodedImage decode_image(const uint8_t* bytes, size_t size);

// pixels: (height, width, channels) with channels 1 or 3. quality: 1..100.
std::vector<uint8_t> encode_jpeg(const uint8_t* pixels, int64_t height, int64_t width, int64_t channels, int quality);
// pixels: (height, width, channels) with channels 1, 2 (gray + alpha), 3 or 4 (RGBA). Lossless.
std::vector<uint8_t> encode_png(const uint8_t* pixels, int64_t height, int64_t width, int64_t channels);

// Scales so the shorter side is `size`, then crops the central size x size window; returns
// (size, size, channels). Bilinear (half-pixel centers) when shrinking by up to 2x or enlarging; a box
// filter over the covered source area when shrinking by more, so fine detail averages instead of aliasing.
std::vector<uint8_t> resize_shorter_side_center_crop(const uint8_t* pixels, int64_t height, int64_t width,
                                                     int64_t channels, int64_t size);

// Converts between 1 and 3 channels: gray is replicated; RGB becomes ITU-R 601 luma (as PIL's "L").
DecodedImage convert_channels(DecodedImage image, int64_t channels);

}  // namespace ringtrain::data
