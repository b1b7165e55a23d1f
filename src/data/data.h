// Real data for training and the input pipeline: readers for IDX (MNIST, Fashion-MNIST), CIFAR
// binaries, folders of JPEG/PNG images and token files, and the JPEG/PNG codecs. Every reader
// checks what it reads against the format and throws ab::Error naming the file and the fault.
#pragma once

#include <cstdint>
#include <filesystem>
#include <span>
#include <string>
#include <vector>

namespace ab::data {

// Images of one size as 8-bit pixels, NHWC (channels 1 or 3), with a label each.
struct ImageSet {
  std::int64_t count = 0, height = 0, width = 0, channels = 0;
  std::vector<std::uint8_t> pixels;  // count * height * width * channels
  std::vector<std::int32_t> labels;  // count, each in [0, classes)
  int classes = 0;
  std::string source;  // what was read, for messages and records
  std::int64_t image_bytes() const { return height * width * channels; }
  std::span<const std::uint8_t> image(std::int64_t i) const {
    return {pixels.data() + i * image_bytes(), static_cast<std::size_t>(image_bytes())};
  }
};

// A whole file's bytes, gunzipped when it is gzip (a plain file is read as it is).
std::vector<std::uint8_t> read_file_bytes(const std::filesystem::path& path);

// An IDX file of unsigned bytes (the only type MNIST-like sets use): its dimensions and data.
struct IdxArray {
  std::vector<std::int64_t> dims;
  std::vector<std::uint8_t> values;
};
IdxArray parse_idx(std::span<const std::uint8_t> bytes, const std::string& what);
// An IDX image file ([n, h, w]) with its IDX label file ([n]); the counts must agree.
ImageSet read_idx(const std::filesystem::path& images, const std::filesystem::path& labels);

// Where Debian's dataset-fashion-mnist installs its files; ACCELBENCH_FASHION_MNIST overrides it.
inline constexpr const char* kFashionMnistDebianDir = "/usr/share/datasets/fashion-mnist";
std::filesystem::path fashion_mnist_dir();
// "train" (60,000 images) or "test" (10,000) from `dir` (default: fashion_mnist_dir()). Error
// naming the folder, the package and the variable when the files are not there.
ImageSet read_fashion_mnist(const std::string& split, const std::filesystem::path& dir = {});

// CIFAR binary files: each record a label byte (CIFAR-100: coarse then fine; the fine label is
// kept) and 3072 bytes of 32x32 red, green, blue planes.
enum class CifarKind { cifar10, cifar100 };
ImageSet read_cifar(const std::vector<std::filesystem::path>& files, CifarKind kind);

// An image set named on a command line: "fashion-mnist[:train|:test]", an IDX image file (labels
// from `labels`, or the file beside it named like t10k-labels-idx1-ubyte), or CIFAR .bin files
// ("cifar10:" or "cifar100:" before the path). UsageError for what is none of these.
ImageSet load_image_set(const std::string& spec, const std::filesystem::path& labels = {});

// Decoded pixels, HWC.
struct Image {
  std::int64_t height = 0, width = 0, channels = 0;
  std::vector<std::uint8_t> pixels;
};
// JPEG or PNG by their signature; `what` names the source in errors. Grey stays 1 channel, colour
// becomes 3 (PNG alpha is dropped, palettes expanded).
Image decode_image(std::span<const std::uint8_t> bytes, const std::string& what);
void decode_image_into(std::span<const std::uint8_t> bytes, const std::string& what, Image& out);
std::vector<std::uint8_t> encode_jpeg(const Image& image, int quality);
std::vector<std::uint8_t> encode_png(const Image& image);
// Bilinear resize (pixel centres aligned, as PIL and OpenCV do) to height x width, with channels
// 1 -> 3 replicated when `channels_out` is 3.
Image resize_bilinear(const Image& src, std::int64_t height, std::int64_t width, std::int64_t channels_out);
Image image_of(const ImageSet& set, std::int64_t i);

// A folder with one subfolder per class (names sorted give the label ids) of .jpg/.jpeg/.png files.
struct ImageFile {
  std::filesystem::path path;
  std::int32_t label = 0;
};
struct UnreadableFile {
  std::filesystem::path path;
  std::string reason;
};
struct ImageFolder {
  std::filesystem::path root;
  std::vector<std::string> class_names;
  std::vector<ImageFile> files;
  std::vector<UnreadableFile> unreadable;  // left out: not openable, or no JPEG/PNG signature
};
// `refuse_unreadable`: throw Error counting and naming the unreadable files instead of keeping them
// aside. Error for a folder without class subfolders or without a single image.
ImageFolder scan_image_folder(const std::filesystem::path& root, bool refuse_unreadable);
// The first five unreadable files with their reasons ("; and N more" after them), for messages and records.
std::string list_unreadable(const std::vector<UnreadableFile>& bad);
// Writes `set` as root/<label>/<index>.jpg, each image resized to size x size, 3 channels.
// Returns the files written.
std::int64_t write_image_folder(const ImageSet& set, const std::filesystem::path& root, std::int64_t size, int quality,
                                std::int64_t limit = -1);

// Token files for language models: uint16 tokens, little-endian, with llm.c's 1024-byte header
// (magic 20240520, version 1, token count) or without one (the file's bytes are the tokens).
std::vector<std::uint16_t> read_tokens(const std::filesystem::path& path);
void write_tokens(const std::filesystem::path& path, std::span<const std::uint16_t> tokens);
// Byte-level tokenizer: each byte of the text one token (a vocabulary of 256), so any file works.
inline constexpr int kByteVocabulary = 256;
std::vector<std::uint16_t> byte_tokens(std::string_view text);
std::string byte_text(std::span<const std::uint16_t> tokens);  // Error for a token >= 256
std::vector<std::uint16_t> tokenize_text_file(const std::filesystem::path& path);

}  // namespace ab::data
