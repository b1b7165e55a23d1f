// JPEG (libjpeg-turbo) and PNG (libpng) decoding and encoding. libjpeg reports an error by calling
// error_exit, which must not return: it longjmps back to the call that started the work, where the
// codec's state is destroyed and a C++ exception thrown (never thrown through the C library).
#include <csetjmp>
#include <cstdio>
// jpeglib.h needs FILE and size_t declared first.
#include <jpeglib.h>
#include <png.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>

#include "core/error.h"
#include "data/data.h"

namespace ab::data {
namespace {

constexpr std::uint8_t kJpegSignature[] = {0xFF, 0xD8, 0xFF};
constexpr std::uint8_t kPngSignature[] = {0x89, 'P', 'N', 'G', '\r', '\n', 0x1A, '\n'};

template <std::size_t N>
bool starts_with(std::span<const std::uint8_t> bytes, const std::uint8_t (&signature)[N]) {
  return bytes.size() >= N && std::memcmp(bytes.data(), signature, N) == 0;
}

struct JpegError {
  jpeg_error_mgr mgr;
  std::jmp_buf jump;
  char message[JMSG_LENGTH_MAX];
};

void jpeg_error_exit(j_common_ptr info) {
  auto* err = reinterpret_cast<JpegError*>(info->err);
  (*info->err->format_message)(info, err->message);
  std::longjmp(err->jump, 1);
}

// Warnings (a premature end of data, extraneous bytes) mean a damaged file: refused like errors,
// so a truncated JPEG never passes as an image with a grey bottom half.
void jpeg_emit_message(j_common_ptr info, int level) {
  if (level < 0) jpeg_error_exit(info);
}

// Only trivially destructible locals live between setjmp and a longjmp; `out` is the caller's.
void decode_jpeg(std::span<const std::uint8_t> bytes, const std::string& what, Image& out) {
  jpeg_decompress_struct cinfo;
  JpegError err;
  cinfo.err = jpeg_std_error(&err.mgr);
  err.mgr.error_exit = &jpeg_error_exit;
  err.mgr.emit_message = &jpeg_emit_message;
  if (setjmp(err.jump) != 0) {
    jpeg_destroy_decompress(&cinfo);
    throw Error(what + ": bad JPEG: " + err.message);
  }
  jpeg_create_decompress(&cinfo);
  jpeg_mem_src(&cinfo, bytes.data(), static_cast<unsigned long>(bytes.size()));
  jpeg_read_header(&cinfo, TRUE);
  cinfo.out_color_space = cinfo.num_components == 1 ? JCS_GRAYSCALE : JCS_RGB;
  jpeg_start_decompress(&cinfo);
  out.height = cinfo.output_height;
  out.width = cinfo.output_width;
  out.channels = cinfo.output_components;
  out.pixels.resize(static_cast<std::size_t>(out.height * out.width * out.channels));
  const auto stride = static_cast<std::size_t>(out.width * out.channels);
  while (cinfo.output_scanline < cinfo.output_height) {
    JSAMPROW row = out.pixels.data() + cinfo.output_scanline * stride;
    jpeg_read_scanlines(&cinfo, &row, 1);
  }
  jpeg_finish_decompress(&cinfo);
  jpeg_destroy_decompress(&cinfo);
}

void decode_png(std::span<const std::uint8_t> bytes, const std::string& what, Image& out) {
  png_image png;
  std::memset(&png, 0, sizeof png);
  png.version = PNG_IMAGE_VERSION;
  if (png_image_begin_read_from_memory(&png, bytes.data(), bytes.size()) == 0)
    throw Error(what + ": bad PNG: " + png.message);
  const bool colour = (png.format & PNG_FORMAT_FLAG_COLOR) != 0;
  png.format = colour ? PNG_FORMAT_RGB : PNG_FORMAT_GRAY;
  out.height = png.height;
  out.width = png.width;
  out.channels = colour ? 3 : 1;
  out.pixels.resize(PNG_IMAGE_SIZE(png));
  if (png_image_finish_read(&png, nullptr, out.pixels.data(), 0, nullptr) == 0) {
    const std::string message = png.message;
    png_image_free(&png);
    throw Error(what + ": bad PNG: " + message);
  }
}

}  // namespace

void decode_image_into(std::span<const std::uint8_t> bytes, const std::string& what, Image& out) {
  if (starts_with(bytes, kJpegSignature)) return decode_jpeg(bytes, what, out);
  if (starts_with(bytes, kPngSignature)) return decode_png(bytes, what, out);
  throw Error(what + ": neither JPEG nor PNG (" + std::to_string(bytes.size()) + " bytes without either signature)");
}

Image decode_image(std::span<const std::uint8_t> bytes, const std::string& what) {
  Image out;
  decode_image_into(bytes, what, out);
  return out;
}

std::vector<std::uint8_t> encode_jpeg(const Image& image, int quality) {
  if (image.channels != 1 && image.channels != 3)
    throw Error("encode_jpeg: " + std::to_string(image.channels) + " channels (1 or 3)");
  jpeg_compress_struct cinfo;
  JpegError err;
  unsigned char* buffer = nullptr;
  unsigned long size = 0;
  cinfo.err = jpeg_std_error(&err.mgr);
  err.mgr.error_exit = &jpeg_error_exit;
  if (setjmp(err.jump) != 0) {
    jpeg_destroy_compress(&cinfo);
    std::free(buffer);
    throw Error(std::string("encode_jpeg: ") + err.message);
  }
  jpeg_create_compress(&cinfo);
  jpeg_mem_dest(&cinfo, &buffer, &size);
  cinfo.image_width = static_cast<JDIMENSION>(image.width);
  cinfo.image_height = static_cast<JDIMENSION>(image.height);
  cinfo.input_components = static_cast<int>(image.channels);
  cinfo.in_color_space = image.channels == 1 ? JCS_GRAYSCALE : JCS_RGB;
  jpeg_set_defaults(&cinfo);
  jpeg_set_quality(&cinfo, quality, TRUE);
  jpeg_start_compress(&cinfo, TRUE);
  const auto stride = static_cast<std::size_t>(image.width * image.channels);
  while (cinfo.next_scanline < cinfo.image_height) {
    // libjpeg takes non-const rows; it only reads them.
    JSAMPROW row = const_cast<std::uint8_t*>(image.pixels.data()) + cinfo.next_scanline * stride;
    jpeg_write_scanlines(&cinfo, &row, 1);
  }
  jpeg_finish_compress(&cinfo);
  jpeg_destroy_compress(&cinfo);
  std::vector<std::uint8_t> bytes(buffer, buffer + size);
  std::free(buffer);
  return bytes;
}

std::vector<std::uint8_t> encode_png(const Image& image) {
  png_image png;
  std::memset(&png, 0, sizeof png);
  png.version = PNG_IMAGE_VERSION;
  png.width = static_cast<png_uint_32>(image.width);
  png.height = static_cast<png_uint_32>(image.height);
  png.format = image.channels == 1 ? PNG_FORMAT_GRAY : PNG_FORMAT_RGB;
  png_alloc_size_t size = 0;
  if (png_image_write_to_memory(&png, nullptr, &size, 0, image.pixels.data(), 0, nullptr) == 0)
    throw Error(std::string("encode_png: ") + png.message);
  std::vector<std::uint8_t> bytes(size);
  if (png_image_write_to_memory(&png, bytes.data(), &size, 0, image.pixels.data(), 0, nullptr) == 0)
    throw Error(std::string("encode_png: ") + png.message);
  bytes.resize(size);
  return bytes;
}

Image resize_bilinear(const Image& src, std::int64_t height, std::int64_t width, std::int64_t channels_out) {
  if (channels_out != src.channels && !(src.channels == 1 && channels_out == 3))
    throw Error("resize_bilinear: " + std::to_string(src.channels) + " channels to " + std::to_string(channels_out));
  Image dst{height, width, channels_out,
            std::vector<std::uint8_t>(static_cast<std::size_t>(height * width * channels_out))};
  const double sy = static_cast<double>(src.height) / static_cast<double>(height);
  const double sx = static_cast<double>(src.width) / static_cast<double>(width);
  const auto at = [&](std::int64_t y, std::int64_t x, std::int64_t c) {
    return static_cast<double>(src.pixels[static_cast<std::size_t>((y * src.width + x) * src.channels + c)]);
  };
  for (std::int64_t y = 0; y < height; ++y) {
    const double fy = std::clamp((static_cast<double>(y) + 0.5) * sy - 0.5, 0.0, static_cast<double>(src.height - 1));
    const auto y0 = static_cast<std::int64_t>(fy);
    const std::int64_t y1 = std::min(y0 + 1, src.height - 1);
    const double wy = fy - static_cast<double>(y0);
    for (std::int64_t x = 0; x < width; ++x) {
      const double fx = std::clamp((static_cast<double>(x) + 0.5) * sx - 0.5, 0.0, static_cast<double>(src.width - 1));
      const auto x0 = static_cast<std::int64_t>(fx);
      const std::int64_t x1 = std::min(x0 + 1, src.width - 1);
      const double wx = fx - static_cast<double>(x0);
      for (std::int64_t c = 0; c < channels_out; ++c) {
        const std::int64_t sc = src.channels == 1 ? 0 : c;
        const double v = (1 - wy) * ((1 - wx) * at(y0, x0, sc) + wx * at(y0, x1, sc)) +
                         wy * ((1 - wx) * at(y1, x0, sc) + wx * at(y1, x1, sc));
        dst.pixels[static_cast<std::size_t>((y * width + x) * channels_out + c)] =
            static_cast<std::uint8_t>(std::clamp(v + 0.5, 0.0, 255.0));
      }
    }
  }
  return dst;
}

Image image_of(const ImageSet& set, std::int64_t i) {
  if (i < 0 || i >= set.count) throw Error("image " + std::to_string(i) + " of " + std::to_string(set.count));
  const auto px = set.image(i);
  return {set.height, set.width, set.channels, std::vector<std::uint8_t>(px.begin(), px.end())};
}

}  // namespace ab::data
