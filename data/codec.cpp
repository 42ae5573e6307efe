// data/codec.cpp: JPEG/PNG decode and encode, resize, channel conversion (see codec.h).
//
// libjpeg and libpng report fatal errors by calling an error handler that must not return; the default
// ones call exit() (libjpeg) or print to stderr. We install handlers that save the message and
// longjmp back. Each setjmp lives in a small function whose own locals are all trivially destructible
// and are not modified after setjmp, so the longjmp skips no destructors and reads no indeterminate
// values; C++ objects (vectors, strings) are owned by the caller and only touched between library calls.
#include "data/codec.h"

// jpeglib.h needs FILE declared before it, and jerror.h needs jpeglib.h: keep this order.
// clang-format off
#include <cstdio>
#include <jpeglib.h>
#include <jerror.h>
// clang-format on
// The configuration checked that the linked libjpeg implements this version (cmake/RingtrainCheckSameOrigin.cmake);
// another jconfig.h found first on this file's include path would still compile against a different one.
#if defined(RINGTRAIN_JPEG_LIB_VERSION) && JPEG_LIB_VERSION != RINGTRAIN_JPEG_LIB_VERSION
#error "jpeglib.h declares another JPEG_LIB_VERSION than the linked libjpeg: another jconfig.h is on the include path"
#endif
#include <png.h>

#include <algorithm>
#include <cmath>
#include <csetjmp>
#include <cstdlib>
#include <cstring>
#include <string>

#include "core/check.h"

namespace ringtrain::data {
namespace {

// Anything larger is a decompression bomb or a corrupt header, not a training image.
constexpr int64_t kMaxDecodedBytes = int64_t{1} << 30;
constexpr size_t kMessageBytes = 256;
static_assert(kMessageBytes >= JMSG_LENGTH_MAX);

void check_decoded_size(int64_t height, int64_t width, int64_t channels, const char* format) {
  if (height <= 0 || width <= 0) RT_THROW(format, " image has an empty size ", height, "x", width);
  if (height * width * channels > kMaxDecodedBytes)
    RT_THROW(format, " image is ", height, "x", width, "x", channels, ", over the ", kMaxDecodedBytes,
             "-byte decode limit");
}

// ---------------------------------------------------------------------------------------------- JPEG

struct JpegErrorManager {
  jpeg_error_mgr base;  // must be first: libjpeg hands us &base
  std::jmp_buf jump;
  char message[kMessageBytes];
  char warning[kMessageBytes];  // the first warning's text
};

void jpeg_error_exit(j_common_ptr cinfo) {
  auto* manager = reinterpret_cast<JpegErrorManager*>(cinfo->err);
  (*cinfo->err->format_message)(cinfo, manager->message);
  std::longjmp(manager->jump, 1);
}

// level -1 is a warning. Most warnings (extraneous bytes, bad restart markers) still decode to a usable
// image, as PIL and torchvision accept them; a premature end of data does not: libjpeg would pad the
// rest of the image with gray, so a truncated file becomes an error.
void jpeg_emit_message(j_common_ptr cinfo, int level) {
  if (level != -1) return;  // trace messages
  if (cinfo->err->msg_code == JWRN_JPEG_EOF) jpeg_error_exit(cinfo);
  if (cinfo->err->num_warnings++ == 0)
    (*cinfo->err->format_message)(cinfo, reinterpret_cast<JpegErrorManager*>(cinfo->err)->warning);
}

void install_jpeg_errors(JpegErrorManager* manager, jpeg_error_mgr** slot) {
  *slot = jpeg_std_error(&manager->base);
  manager->base.error_exit = jpeg_error_exit;
  manager->base.emit_message = jpeg_emit_message;
  manager->message[0] = '\0';
  manager->warning[0] = '\0';
}

struct JpegDecodeState {
  bool adobe_cmyk = false;  // CMYK stored inverted (Photoshop's Adobe marker)
  char message[kMessageBytes] = {};
  int warnings = 0;
  char warning[kMessageBytes] = {};
  // Filled in by decode_jpeg_raw: where the decoded rows and columns lie in the scaled image.
  int64_t scale = 1, y0 = 0, x0 = 0, scaled_height = 0, scaled_width = 0;
};

// Decodes into out->pixels; 4 channels means CMYK, converted by the caller. `choose` (may be null: the
// whole image at scale 1) picks the scale and window once the header is read. Returns false with
// state->message set on a libjpeg error; an exception from `choose` or the size check propagates after
// the decompressor is destroyed.
bool decode_jpeg_raw(const uint8_t* bytes, size_t size, const std::function<RegionRequest(const ImageHeader&)>* choose,
                     DecodedImage* out, JpegDecodeState* state) {
  jpeg_decompress_struct cinfo;
  std::memset(&cinfo, 0, sizeof cinfo);  // jpeg_destroy on a struct never created is then a no-op
  JpegErrorManager errors;
  install_jpeg_errors(&errors, &cinfo.err);
  if (setjmp(errors.jump)) {
    jpeg_destroy_decompress(&cinfo);
    std::memcpy(state->message, errors.message, kMessageBytes);
    return false;
  }
  jpeg_create_decompress(&cinfo);
  jpeg_mem_src(&cinfo, bytes, static_cast<unsigned long>(size));
  jpeg_read_header(&cinfo, TRUE);
  if (cinfo.jpeg_color_space == JCS_GRAYSCALE) {
    cinfo.out_color_space = JCS_GRAYSCALE;
  } else if (cinfo.jpeg_color_space == JCS_CMYK || cinfo.jpeg_color_space == JCS_YCCK) {
    cinfo.out_color_space = JCS_CMYK;  // libjpeg cannot convert CMYK to RGB itself
    state->adobe_cmyk = cinfo.saw_Adobe_marker;
  } else {
    cinfo.out_color_space = JCS_RGB;
  }
  RegionRequest want;
  try {
    const int64_t components = cinfo.out_color_space == JCS_GRAYSCALE ? 1 : cinfo.out_color_space == JCS_CMYK ? 4 : 3;
    check_decoded_size(cinfo.image_height, cinfo.image_width, components, "JPEG");
    if (choose) {
      want = (*choose)(ImageHeader{ImageFormat::kJpeg, cinfo.image_height, cinfo.image_width,
                                   cinfo.out_color_space == JCS_GRAYSCALE ? 1 : 3});
      if (want.scale != 1 && want.scale != 2 && want.scale != 4 && want.scale != 8)
        RT_THROW("JPEG decode scale must be 1, 2, 4 or 8, got ", want.scale);
    }
  } catch (...) {
    jpeg_destroy_decompress(&cinfo);
    throw;
  }
  state->scale = want.scale;
  cinfo.scale_num = 1;
  cinfo.scale_denom = static_cast<unsigned>(want.scale);
  jpeg_start_decompress(&cinfo);
  state->scaled_height = cinfo.output_height;
  state->scaled_width = cinfo.output_width;
  // The window, clamped to the scaled image and at least one pixel.
  if (choose) {
    state->y0 = std::clamp<int64_t>(want.y0, 0, state->scaled_height - 1);
    state->x0 = std::clamp<int64_t>(want.x0, 0, state->scaled_width - 1);
    out->height = std::clamp<int64_t>(want.y0 + want.h, state->y0 + 1, state->scaled_height) - state->y0;
    out->width = std::clamp<int64_t>(want.x0 + want.w, state->x0 + 1, state->scaled_width) - state->x0;
  } else {
    out->height = state->scaled_height;
    out->width = state->scaled_width;
  }
  if (out->width < state->scaled_width) {
    JDIMENSION x = static_cast<JDIMENSION>(state->x0), w = static_cast<JDIMENSION>(out->width);
    jpeg_crop_scanline(&cinfo, &x, &w);  // moves x left to an iMCU boundary, widens w to match
    state->x0 = x;
    out->width = w;
  }
  if (state->y0 > 0) jpeg_skip_scanlines(&cinfo, static_cast<JDIMENSION>(state->y0));
  out->channels = cinfo.output_components;
  try {
    out->pixels.resize(static_cast<size_t>(out->height * out->width * out->channels));
  } catch (...) {
    jpeg_destroy_decompress(&cinfo);
    throw;
  }
  const size_t stride = static_cast<size_t>(out->width * out->channels);
  const JDIMENSION end = static_cast<JDIMENSION>(state->y0 + out->height);
  while (cinfo.output_scanline < end) {
    JSAMPROW row = out->pixels.data() + (cinfo.output_scanline - state->y0) * stride;
    jpeg_read_scanlines(&cinfo, &row, 1);
  }
  // Rows below the window are never decoded: abort instead of finishing (which would decode them).
  if (cinfo.output_scanline < cinfo.output_height)
    jpeg_abort_decompress(&cinfo);
  else
    jpeg_finish_decompress(&cinfo);
  state->warnings = static_cast<int>(errors.base.num_warnings);
  std::memcpy(state->warning, errors.warning, kMessageBytes);
  jpeg_destroy_decompress(&cinfo);
  return true;
}

void take_warnings(DecodedImage& image, const JpegDecodeState& state) {
  image.warnings = state.warnings;
  image.first_warning = state.warnings > 0 ? state.warning : "";
}

// CMYK (4 channels) to RGB in place; other channel counts than 1 and 3 are errors.
void finish_jpeg_channels(DecodedImage& image, const JpegDecodeState& state) {
  if (image.channels == 4) {
    // CMYK -> RGB: R = (1 - C)(1 - K); Adobe files store 1 - C and 1 - K.
    const int64_t n = image.height * image.width;
    uint8_t* p = image.pixels.data();
    for (int64_t i = 0; i < n; ++i) {
      int c = p[4 * i], m = p[4 * i + 1], y = p[4 * i + 2], k = p[4 * i + 3];
      if (!state.adobe_cmyk) c = 255 - c, m = 255 - m, y = 255 - y, k = 255 - k;
      p[3 * i] = static_cast<uint8_t>((c * k + 127) / 255);
      p[3 * i + 1] = static_cast<uint8_t>((m * k + 127) / 255);
      p[3 * i + 2] = static_cast<uint8_t>((y * k + 127) / 255);
    }
    image.channels = 3;
    image.pixels.resize(static_cast<size_t>(n * 3));
  } else if (image.channels != 1 && image.channels != 3) {
    RT_THROW("JPEG with ", image.channels, " output channels is not supported");
  }
}

DecodedImage decode_jpeg(const uint8_t* bytes, size_t size) {
  DecodedImage image;
  JpegDecodeState state;
  if (!decode_jpeg_raw(bytes, size, nullptr, &image, &state)) RT_THROW("corrupt JPEG data: ", state.message);
  finish_jpeg_channels(image, state);
  take_warnings(image, state);
  return image;
}

struct JpegEncodeOutput {
  unsigned char* buffer = nullptr;  // malloc'ed by libjpeg's memory destination; freed by the caller
  unsigned long size = 0;
  char message[kMessageBytes] = {};
};

bool encode_jpeg_raw(const uint8_t* pixels, int64_t height, int64_t width, int64_t channels, int quality,
                     JpegEncodeOutput* out) {
  jpeg_compress_struct cinfo;
  std::memset(&cinfo, 0, sizeof cinfo);
  JpegErrorManager errors;
  install_jpeg_errors(&errors, &cinfo.err);
  if (setjmp(errors.jump)) {
    jpeg_destroy_compress(&cinfo);
    std::memcpy(out->message, errors.message, kMessageBytes);
    return false;
  }
  jpeg_create_compress(&cinfo);
  jpeg_mem_dest(&cinfo, &out->buffer, &out->size);
  cinfo.image_width = static_cast<JDIMENSION>(width);
  cinfo.image_height = static_cast<JDIMENSION>(height);
  cinfo.input_components = static_cast<int>(channels);
  cinfo.in_color_space = channels == 1 ? JCS_GRAYSCALE : JCS_RGB;
  jpeg_set_defaults(&cinfo);
  jpeg_set_quality(&cinfo, quality, TRUE);
  jpeg_start_compress(&cinfo, TRUE);
  const size_t stride = static_cast<size_t>(width * channels);
  while (cinfo.next_scanline < cinfo.image_height) {
    // libjpeg's API is not const-correct; it only reads the rows.
    JSAMPROW row = const_cast<uint8_t*>(pixels) + cinfo.next_scanline * stride;
    jpeg_write_scanlines(&cinfo, &row, 1);
  }
  jpeg_finish_compress(&cinfo);
  jpeg_destroy_compress(&cinfo);
  return true;
}

// ----------------------------------------------------------------------------------------------- PNG

struct PngState {
  const uint8_t* data = nullptr;
  size_t size = 0, offset = 0;
  char message[kMessageBytes] = {};
  char warning[kMessageBytes] = {};  // the first of libpng's warnings
};

void png_error_handler(png_structp png, png_const_charp message) {
  auto* state = static_cast<PngState*>(png_get_error_ptr(png));
  std::snprintf(state->message, kMessageBytes, "%s", message);
  png_longjmp(png, 1);
}

// Most warnings are ancillary-chunk complaints (an incorrect sRGB profile) over a fine image; the first is kept
// so that one about the image data itself can be made an error.
void png_warning_handler(png_structp png, png_const_charp message) {
  auto* state = static_cast<PngState*>(png_get_error_ptr(png));
  if (state->warning[0] == '\0') std::snprintf(state->warning, kMessageBytes, "%s", message);
}

void png_read_from_memory(png_structp png, png_bytep out, size_t length) {
  auto* state = static_cast<PngState*>(png_get_io_ptr(png));
  if (length > state->size - state->offset) png_error(png, "truncated data (read past the end)");
  std::memcpy(out, state->data + state->offset, length);
  state->offset += length;
}

// Reads into out->pixels with palettes expanded and samples scaled to 8 bits; alpha (2 or 4 channels)
// is dropped by the caller. `rows` is caller-owned scratch so this frame holds no C++ objects.
bool decode_png_raw(PngState* state, DecodedImage* out, std::vector<png_bytep>* rows, bool palette_indices = false) {
  png_structp png = png_create_read_struct(PNG_LIBPNG_VER_STRING, state, png_error_handler, png_warning_handler);
  if (!png) {
    std::snprintf(state->message, kMessageBytes, "png_create_read_struct failed");
    return false;
  }
  png_infop info = png_create_info_struct(png);
  if (!info) {
    png_destroy_read_struct(&png, nullptr, nullptr);
    std::snprintf(state->message, kMessageBytes, "png_create_info_struct failed");
    return false;
  }
  if (setjmp(png_jmpbuf(png))) {
    png_destroy_read_struct(&png, &info, nullptr);
    return false;
  }
  png_set_read_fn(png, state, png_read_from_memory);
  png_read_info(png, info);
  const int color_type = png_get_color_type(png, info), bit_depth = png_get_bit_depth(png, info);
  if (color_type == PNG_COLOR_TYPE_PALETTE && !palette_indices) png_set_palette_to_rgb(png);
  if (color_type == PNG_COLOR_TYPE_PALETTE && palette_indices && bit_depth < 8) png_set_packing(png);
  if (color_type == PNG_COLOR_TYPE_GRAY && bit_depth < 8) png_set_expand_gray_1_2_4_to_8(png);
  if (bit_depth == 16) png_set_scale_16(png);
  png_set_interlace_handling(png);
  png_read_update_info(png, info);
  try {
    out->height = png_get_image_height(png, info);
    out->width = png_get_image_width(png, info);
    out->channels = png_get_channels(png, info);
    check_decoded_size(out->height, out->width, out->channels, "PNG");
    if (static_cast<int64_t>(png_get_rowbytes(png, info)) != out->width * out->channels)
      RT_THROW("PNG row size ", png_get_rowbytes(png, info), " is not width x channels after conversion");
    out->pixels.resize(static_cast<size_t>(out->height * out->width * out->channels));
    rows->resize(static_cast<size_t>(out->height));
    for (int64_t y = 0; y < out->height; ++y)
      (*rows)[static_cast<size_t>(y)] = out->pixels.data() + y * out->width * out->channels;
  } catch (...) {
    png_destroy_read_struct(&png, &info, nullptr);
    throw;
  }
  png_read_image(png, rows->data());
  png_read_end(png, nullptr);  // reads what follows the rows: image data the header has no room for is seen
  png_destroy_read_struct(&png, &info, nullptr);
  return true;
}

DecodedImage decode_png(const uint8_t* bytes, size_t size) {
  PngState state;
  state.data = bytes;
  state.size = size;
  DecodedImage image;
  std::vector<png_bytep> rows;
  if (!decode_png_raw(&state, &image, &rows)) RT_THROW("corrupt PNG data: ", state.message);
  const std::string warning = state.warning;
  if (warning.find("image data") != std::string::npos || warning.find("compressed data") != std::string::npos ||
      warning.find("IDAT") != std::string::npos)
    RT_THROW("corrupt PNG data: ", warning, ": the image data disagrees with the ", image.width, "x", image.height,
             " its header gives");
  if (image.channels == 2 || image.channels == 4) {
    // Drop alpha in place: gray+alpha -> gray, RGBA -> RGB.
    const int64_t n = image.height * image.width, from = image.channels, to = image.channels - 1;
    uint8_t* p = image.pixels.data();
    for (int64_t i = 0; i < n; ++i)
      for (int64_t c = 0; c < to; ++c) p[i * to + c] = p[i * from + c];
    image.channels = to;
    image.pixels.resize(static_cast<size_t>(n * to));
  }
  return image;
}

// ---------------------------------------------------------------------------------------------- resize

// For one axis: output sample o draws from inputs [first[o], first[o] + count[o]) with weights
// weights[o * max_taps + k].
struct Taps {
  int64_t max_taps = 0;
  std::vector<int64_t> first, count;
  std::vector<float> weights;
};

// scale: output pixels per input pixel; offset: where the output window starts on the scaled axis.
Taps make_taps(int64_t in_size, int64_t out_size, double scale, double offset) {
  Taps taps;
  const bool area = scale < 0.5;
  taps.max_taps = area ? static_cast<int64_t>(std::ceil(1.0 / scale)) + 2 : 2;
  taps.first.resize(static_cast<size_t>(out_size));
  taps.count.resize(static_cast<size_t>(out_size));
  taps.weights.assign(static_cast<size_t>(out_size * taps.max_taps), 0.0f);
  for (int64_t o = 0; o < out_size; ++o) {
    float* w = taps.weights.data() + o * taps.max_taps;
    int64_t first = 0, count = 0;
    if (area) {
      // The box [lo, hi) in input coordinates this output pixel covers; edge pixels count by overlap.
      const double lo = std::clamp((o + offset) / scale, 0.0, static_cast<double>(in_size));
      const double hi = std::clamp((o + offset + 1) / scale, 0.0, static_cast<double>(in_size));
      first = std::min(static_cast<int64_t>(std::floor(lo)), in_size - 1);
      const int64_t last = std::max(first + 1, static_cast<int64_t>(std::ceil(hi)));
      count = std::min(last - first, taps.max_taps);
      double total = 0;
      for (int64_t k = 0; k < count; ++k) {
        const double overlap =
            std::min(hi, static_cast<double>(first + k + 1)) - std::max(lo, static_cast<double>(first + k));
        w[k] = static_cast<float>(std::max(overlap, 0.0));
        total += w[k];
      }
      if (total <= 0) {
        w[0] = 1.0f, total = 1.0;
      }
      for (int64_t k = 0; k < count; ++k) w[k] = static_cast<float>(w[k] / total);
    } else {
      // Bilinear with half-pixel centers, clamped at the borders.
      const double center = std::clamp((o + offset + 0.5) / scale - 0.5, 0.0, static_cast<double>(in_size - 1));
      first = std::min(static_cast<int64_t>(std::floor(center)), std::max<int64_t>(in_size - 2, 0));
      const double frac = center - static_cast<double>(first);
      count = in_size >= 2 ? 2 : 1;
      w[0] = static_cast<float>(1.0 - frac);
      if (count == 2) w[1] = static_cast<float>(frac);
    }
    taps.first[static_cast<size_t>(o)] = first;
    taps.count[static_cast<size_t>(o)] = count;
  }
  return taps;
}

}  // namespace

ImageFormat detect_image_format(const uint8_t* bytes, size_t size) {
  static constexpr uint8_t kPngSignature[8] = {0x89, 'P', 'N', 'G', '\r', '\n', 0x1A, '\n'};
  if (size >= 3 && bytes[0] == 0xFF && bytes[1] == 0xD8 && bytes[2] == 0xFF) return ImageFormat::kJpeg;
  if (size >= 8 && std::memcmp(bytes, kPngSignature, 8) == 0) return ImageFormat::kPng;
  return ImageFormat::kUnknown;
}

namespace {

[[noreturn]] void unknown_format(const uint8_t* bytes, size_t size) {
  std::string head;
  for (size_t i = 0; i < std::min<size_t>(size, 8); ++i) {
    char hex[4];
    std::snprintf(hex, sizeof hex, "%02x", bytes[i]);
    if (i) head += ' ';
    head += hex;  // not `" " + std::string(hex)`: GCC 12 flags that with a false -Wrestrict
  }
  RT_THROW("not a JPEG or PNG image (", size, " bytes, starting ", size ? head : "<empty>", ")");
}

}  // namespace

DecodedImage decode_mask(const uint8_t* bytes, size_t size) {
  if (detect_image_format(bytes, size) != ImageFormat::kPng)
    RT_THROW("a segmentation mask must be a PNG (a JPEG's compression would change its classes)");
  PngState state;
  state.data = bytes;
  state.size = size;
  DecodedImage mask;
  std::vector<png_bytep> rows;
  if (!decode_png_raw(&state, &mask, &rows, true)) RT_THROW("corrupt PNG data: ", state.message);
  if (mask.channels != 1)
    RT_THROW("a segmentation mask must be one channel of classes (grayscale or palette indices), got ", mask.channels,
             " channels");
  return mask;
}

DecodedImage decode_image(const uint8_t* bytes, size_t size) {
  switch (detect_image_format(bytes, size)) {
    case ImageFormat::kJpeg:
      return decode_jpeg(bytes, size);
    case ImageFormat::kPng:
      return decode_png(bytes, size);
    case ImageFormat::kUnknown:
      break;
  }
  unknown_format(bytes, size);
}

namespace {

// The header of a JPEG; false with `message` set on a libjpeg error. No C++ objects in this frame.
bool jpeg_header_raw(const uint8_t* bytes, size_t size, ImageHeader* out, char* message) {
  jpeg_decompress_struct cinfo;
  std::memset(&cinfo, 0, sizeof cinfo);
  JpegErrorManager errors;
  install_jpeg_errors(&errors, &cinfo.err);
  if (setjmp(errors.jump)) {
    jpeg_destroy_decompress(&cinfo);
    std::memcpy(message, errors.message, kMessageBytes);
    return false;
  }
  jpeg_create_decompress(&cinfo);
  jpeg_mem_src(&cinfo, bytes, static_cast<unsigned long>(size));
  jpeg_read_header(&cinfo, TRUE);
  *out = ImageHeader{ImageFormat::kJpeg, cinfo.image_height, cinfo.image_width,
                     cinfo.jpeg_color_space == JCS_GRAYSCALE ? 1 : 3};
  jpeg_destroy_decompress(&cinfo);
  return true;
}

bool png_header_raw(PngState* state, ImageHeader* out) {
  png_structp png = png_create_read_struct(PNG_LIBPNG_VER_STRING, state, png_error_handler, png_warning_handler);
  if (!png) return false;
  png_infop info = png_create_info_struct(png);
  if (!info || setjmp(png_jmpbuf(png))) {
    png_destroy_read_struct(&png, info ? &info : nullptr, nullptr);
    return false;
  }
  png_set_read_fn(png, state, png_read_from_memory);
  png_read_info(png, info);
  const int color = png_get_color_type(png, info);
  *out = ImageHeader{ImageFormat::kPng, png_get_image_height(png, info), png_get_image_width(png, info),
                     color == PNG_COLOR_TYPE_GRAY || color == PNG_COLOR_TYPE_GRAY_ALPHA ? 1 : 3};
  png_destroy_read_struct(&png, &info, nullptr);
  return true;
}

}  // namespace

ImageHeader read_image_header(const uint8_t* bytes, size_t size) {
  ImageHeader h;
  switch (detect_image_format(bytes, size)) {
    case ImageFormat::kJpeg: {
      char message[kMessageBytes] = {};
      if (!jpeg_header_raw(bytes, size, &h, message)) RT_THROW("corrupt JPEG header: ", message);
      return h;
    }
    case ImageFormat::kPng: {
      PngState state;
      state.data = bytes;
      state.size = size;
      if (!png_header_raw(&state, &h)) RT_THROW("corrupt PNG header: ", state.message);
      return h;
    }
    case ImageFormat::kUnknown:
      break;
  }
  unknown_format(bytes, size);
}

DecodedRegion decode_image_region(const uint8_t* bytes, size_t size,
                                  const std::function<RegionRequest(const ImageHeader&)>& choose) {
  DecodedRegion region;
  if (detect_image_format(bytes, size) == ImageFormat::kJpeg) {
    JpegDecodeState state;
    if (!decode_jpeg_raw(bytes, size, &choose, &region.image, &state)) RT_THROW("corrupt JPEG data: ", state.message);
    finish_jpeg_channels(region.image, state);
    take_warnings(region.image, state);
    region.scale = state.scale;
    region.y0 = state.y0;
    region.x0 = state.x0;
    region.scaled_height = state.scaled_height;
    region.scaled_width = state.scaled_width;
    return region;
  }
  region.image = decode_image(bytes, size);
  choose(ImageHeader{ImageFormat::kPng, region.image.height, region.image.width, region.image.channels});
  region.scaled_height = region.image.height;
  region.scaled_width = region.image.width;
  return region;
}

int64_t dct_scale_for(double crop_h, double crop_w, int64_t out_h, int64_t out_w) {
  int64_t scale = 1;
  while (scale < 8 && crop_h >= 2.0 * scale * static_cast<double>(out_h) &&
         crop_w >= 2.0 * scale * static_cast<double>(out_w))
    scale *= 2;
  return scale;
}

std::vector<uint8_t> encode_jpeg(const uint8_t* pixels, int64_t height, int64_t width, int64_t channels, int quality) {
  RT_CHECK(channels == 1 || channels == 3, "encode_jpeg: channels must be 1 or 3, got ", channels);
  RT_CHECK(height > 0 && width > 0 && height <= JPEG_MAX_DIMENSION && width <= JPEG_MAX_DIMENSION,
           "encode_jpeg: bad size ", height, "x", width);
  RT_CHECK(quality >= 1 && quality <= 100, "encode_jpeg: quality must be in 1..100, got ", quality);
  JpegEncodeOutput out;
  const bool ok = encode_jpeg_raw(pixels, height, width, channels, quality, &out);
  std::vector<uint8_t> bytes;
  if (ok) bytes.assign(out.buffer, out.buffer + out.size);
  std::free(out.buffer);
  if (!ok) RT_THROW("JPEG encoding failed: ", out.message);
  return bytes;
}

std::vector<uint8_t> encode_png(const uint8_t* pixels, int64_t height, int64_t width, int64_t channels) {
  RT_CHECK(channels >= 1 && channels <= 4, "encode_png: channels must be 1..4, got ", channels);
  RT_CHECK(height > 0 && width > 0 && height <= PNG_UINT_31_MAX && width <= PNG_UINT_31_MAX, "encode_png: bad size ",
           height, "x", width);
  static constexpr png_uint_32 kFormats[] = {PNG_FORMAT_GRAY, PNG_FORMAT_GA, PNG_FORMAT_RGB, PNG_FORMAT_RGBA};
  png_image image;
  std::memset(&image, 0, sizeof image);
  image.version = PNG_IMAGE_VERSION;
  image.width = static_cast<png_uint_32>(width);
  image.height = static_cast<png_uint_32>(height);
  image.format = kFormats[channels - 1];
  // The simplified write API reports errors through image.message and never longjmps into our code.
  png_alloc_size_t size = 0;
  if (!png_image_write_to_memory(&image, nullptr, &size, 0, pixels, 0, nullptr))
    RT_THROW("PNG encoding failed: ", image.message);
  std::vector<uint8_t> bytes(size);
  if (!png_image_write_to_memory(&image, bytes.data(), &size, 0, pixels, 0, nullptr))
    RT_THROW("PNG encoding failed: ", image.message);
  bytes.resize(size);
  png_image_free(&image);
  return bytes;
}

std::vector<uint8_t> resize_shorter_side_center_crop(const uint8_t* pixels, int64_t height, int64_t width,
                                                     int64_t channels, int64_t size) {
  RT_CHECK(height > 0 && width > 0 && channels > 0 && size > 0, "resize: bad shape ", height, "x", width, "x", channels,
           " -> ", size);
  const double scale = static_cast<double>(size) / static_cast<double>(std::min(height, width));
  // The longer side is cropped symmetrically on the scaled axis.
  const Taps rows = make_taps(height, size, scale, (height * scale - static_cast<double>(size)) / 2);
  const Taps cols = make_taps(width, size, scale, (width * scale - static_cast<double>(size)) / 2);
  const int64_t row_lo = rows.first.front(), row_hi = rows.first.back() + rows.count.back();

  // Horizontal pass over the source rows the vertical taps touch: (row_hi - row_lo, size, channels).
  std::vector<float> horizontal(static_cast<size_t>((row_hi - row_lo) * size * channels));
  for (int64_t y = row_lo; y < row_hi; ++y) {
    const uint8_t* src = pixels + y * width * channels;
    float* dst = horizontal.data() + (y - row_lo) * size * channels;
    for (int64_t x = 0; x < size; ++x) {
      const float* w = cols.weights.data() + x * cols.max_taps;
      const int64_t first = cols.first[static_cast<size_t>(x)], count = cols.count[static_cast<size_t>(x)];
      for (int64_t c = 0; c < channels; ++c) {
        float v = 0;
        for (int64_t k = 0; k < count; ++k) v += w[k] * src[(first + k) * channels + c];
        dst[x * channels + c] = v;
      }
    }
  }
  std::vector<uint8_t> out(static_cast<size_t>(size * size * channels));
  const int64_t row_elems = size * channels;
  for (int64_t y = 0; y < size; ++y) {
    const float* w = rows.weights.data() + y * rows.max_taps;
    const int64_t first = rows.first[static_cast<size_t>(y)], count = rows.count[static_cast<size_t>(y)];
    uint8_t* dst = out.data() + y * row_elems;
    for (int64_t i = 0; i < row_elems; ++i) {
      float v = 0;
      for (int64_t k = 0; k < count; ++k)
        v += w[k] * horizontal[static_cast<size_t>((first + k - row_lo) * row_elems + i)];
      dst[i] = static_cast<uint8_t>(std::clamp(std::lround(v), 0L, 255L));
    }
  }
  return out;
}

DecodedImage convert_channels(DecodedImage image, int64_t channels) {
  RT_CHECK(channels == 1 || channels == 3, "convert_channels: target must be 1 or 3, got ", channels);
  RT_CHECK(image.channels == 1 || image.channels == 3, "convert_channels: source has ", image.channels, " channels");
  if (image.channels == channels) return image;
  const int64_t n = image.height * image.width;
  std::vector<uint8_t> out(static_cast<size_t>(n * channels));
  const uint8_t* p = image.pixels.data();
  if (channels == 3) {
    for (int64_t i = 0; i < n; ++i) out[3 * i] = out[3 * i + 1] = out[3 * i + 2] = p[i];
  } else {
    for (int64_t i = 0; i < n; ++i)
      out[i] = static_cast<uint8_t>((299 * p[3 * i] + 587 * p[3 * i + 1] + 114 * p[3 * i + 2] + 500) / 1000);
  }
  image.pixels = std::move(out);
  image.channels = channels;
  return image;
}

}  // namespace ringtrain::data
