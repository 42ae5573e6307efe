// data/codec.h: image decoding (JPEG via libjpeg-turbo, PNG via libpng; the format is detected from
// the magic bytes, not the file name), encoding (for --keep-encoded shards and test fixtures) and the
// shorter-side resize + center crop the converters use. Pixels are always uint8 HWC.
// Errors are ringtrain::Error naming what was wrong with the bytes; callers add the file name.
// Neither library is ever allowed to call exit(): both report through setjmp/longjmp error handlers.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

namespace ringtrain::data {

struct DecodedImage {
  int64_t height = 0, width = 0, channels = 0;  // channels: 1 (gray) or 3 (RGB)
  std::vector<uint8_t> pixels;                  // (height, width, channels)
  // libjpeg's warnings while decoding (corrupt entropy data, extraneous bytes, bad restart markers): the
  // image decoded, but parts of it may be gray or garbled. Callers count and report them (--strict refuses).
  int warnings = 0;
  std::string first_warning;  // libjpeg's text of the first
};

enum class ImageFormat { kUnknown, kJpeg, kPng };

// From the first bytes: JPEG starts FF D8 FF, PNG with its 8-byte signature.
ImageFormat detect_image_format(const uint8_t* bytes, size_t size);

// Decodes a JPEG or PNG. Grayscale (with or without alpha) gives 1 channel; everything else 3: alpha
// is dropped, palettes expanded, 16-bit samples scaled to 8 bits, CMYK JPEGs converted to RGB.
// Throws for an unknown format, corrupt or truncated data, a PNG whose image data disagrees with the size
// its header gives, or an image over 1 GiB decoded. A JPEG's recoverable damage is in `warnings`.
DecodedImage decode_image(const uint8_t* bytes, size_t size);

// A segmentation mask: a PNG of one channel whose samples are classes, 8-bit grayscale or a palette (its indices
// kept, as VOC stores its masks). Returns (height, width, 1). Other formats or channel counts are errors.
DecodedImage decode_mask(const uint8_t* bytes, size_t size);

// An image's size as its header gives it: channels as decode_image gives them (1 or 3).
struct ImageHeader {
  ImageFormat format = ImageFormat::kUnknown;
  int64_t height = 0, width = 0, channels = 0;
};

// The header alone (no pixel decoded): what a check of every record can afford. Throws as decode_image does
// for an unknown format or a header that does not parse.
ImageHeader read_image_header(const uint8_t* bytes, size_t size);

// Which part of an image to decode, in the coordinates of the image shrunk by `scale`: rows
// [y0, y0 + h) and columns [x0, x0 + w), clamped to the image (an empty window is widened to one pixel).
struct RegionRequest {
  int64_t scale = 1;  // 1, 2, 4 or 8
  int64_t y0 = 0, x0 = 0, h = 0, w = 0;
};

struct DecodedRegion {
  DecodedImage image;                           // the region's pixels
  int64_t scale = 1;                            // the scale it was decoded at
  int64_t y0 = 0, x0 = 0;                       // where the region starts in the scaled image
  int64_t scaled_height = 0, scaled_width = 0;  // the whole scaled image
};

// Decodes the part of an image that `choose` asks for once it has seen the header (it is called once).
// A JPEG is decoded by libjpeg-turbo at 1/scale with its DCT scaling (the smaller inverse DCT produces the
// shrunk image directly, so it costs less than a full decode and averages instead of aliasing); the rows
// above the window are skipped, decoding stops after its last row, and only the iMCU columns that hold it
// are decoded (the region may start left of x0, at an iMCU boundary, and be wider). A PNG is decoded whole
// at scale 1 whatever was asked. CMYK is converted to RGB as decode_image does.
DecodedRegion decode_image_region(const uint8_t* bytes, size_t size,
                                  const std::function<RegionRequest(const ImageHeader&)>& choose);

// The largest JPEG DCT scale (1, 2, 4 or 8) at which a crop of crop_h x crop_w source pixels still has
// at least out_h x out_w pixels (so what remains is a shrink by less than 2x, or an enlargement).
int64_t dct_scale_for(double crop_h, double crop_w, int64_t out_h, int64_t out_w);

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
