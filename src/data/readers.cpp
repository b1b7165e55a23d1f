// IDX and CIFAR readers, and the names a command line gives an image set.
#include <zlib.h>

#include <algorithm>
#include <cstdlib>
#include <fstream>
#include <memory>

#include "core/error.h"
#include "data/data.h"

namespace ab::data {
namespace fs = std::filesystem;
namespace {

std::int64_t big_endian_u32(const std::uint8_t* p) {
  return (std::int64_t{p[0]} << 24) | (std::int64_t{p[1]} << 16) | (std::int64_t{p[2]} << 8) | std::int64_t{p[3]};
}

int classes_of(const std::vector<std::int32_t>& labels) {
  return labels.empty() ? 0 : *std::max_element(labels.begin(), labels.end()) + 1;
}

// CIFAR's channel planes (R, G, B of 32x32) become HWC pixels.
void planes_to_hwc(const std::uint8_t* planes, std::uint8_t* hwc) {
  constexpr int kPixels = 32 * 32;
  for (int p = 0; p < kPixels; ++p)
    for (int c = 0; c < 3; ++c) hwc[p * 3 + c] = planes[c * kPixels + p];
}

}  // namespace

std::vector<std::uint8_t> read_file_bytes(const fs::path& path) {
  // gzread passes a file that is not gzip through unchanged, so one path reads both.
  std::unique_ptr<gzFile_s, int (*)(gzFile)> file(gzopen(path.c_str(), "rb"), &gzclose);
  if (!file) throw Error("cannot open " + path.string());
  std::vector<std::uint8_t> bytes;
  std::vector<std::uint8_t> chunk(1 << 20);
  for (;;) {
    const int n = gzread(file.get(), chunk.data(), static_cast<unsigned>(chunk.size()));
    if (n < 0) {
      int code = 0;
      throw Error("cannot read " + path.string() + ": " + gzerror(file.get(), &code));
    }
    if (n == 0) break;
    bytes.insert(bytes.end(), chunk.begin(), chunk.begin() + n);
  }
  // A gzip stream cut short reads as a short file without an error from gzread; gzclose sees it.
  const int closed = gzclose(file.release());
  if (closed == Z_BUF_ERROR) throw Error(path.string() + " is truncated: its gzip stream ends early");
  if (closed != Z_OK) throw Error("cannot read " + path.string() + " (zlib error " + std::to_string(closed) + ")");
  return bytes;
}

IdxArray parse_idx(std::span<const std::uint8_t> bytes, const std::string& what) {
  if (bytes.size() < 4) throw Error(what + ": not an IDX file (" + std::to_string(bytes.size()) + " bytes, no header)");
  if (bytes[0] != 0 || bytes[1] != 0)
    throw Error(what + ": not an IDX file (its magic number does not start with two zero bytes)");
  if (bytes[2] != 0x08)
    throw Error(what + ": IDX element type 0x" + std::to_string(bytes[2]) +
                " is not supported (only 0x08, unsigned byte)");
  const int rank = bytes[3];
  if (rank < 1 || rank > 4)
    throw Error(what + ": IDX header gives " + std::to_string(rank) + " dimensions (1 to 4 expected)");
  const std::size_t header = 4 + 4 * static_cast<std::size_t>(rank);
  if (bytes.size() < header) throw Error(what + ": truncated IDX header (" + std::to_string(bytes.size()) + " bytes)");
  IdxArray a;
  std::int64_t elements = 1;
  for (int d = 0; d < rank; ++d) {
    a.dims.push_back(big_endian_u32(bytes.data() + 4 + 4 * d));
    if (a.dims.back() > (std::int64_t{1} << 40) / std::max<std::int64_t>(elements, 1))
      throw Error(what + ": IDX dimensions multiply past 2^40 bytes: a corrupt header");
    elements *= a.dims.back();
  }
  const auto data_bytes = static_cast<std::int64_t>(bytes.size() - header);
  if (data_bytes < elements)
    throw Error(what + ": truncated: the IDX header says " + std::to_string(elements) +
                " bytes of data, the file holds " + std::to_string(data_bytes));
  if (data_bytes > elements)
    throw Error(what + ": " + std::to_string(data_bytes - elements) + " bytes after the " + std::to_string(elements) +
                " the IDX header gives: a corrupt header or a different file");
  a.values.assign(bytes.begin() + static_cast<std::ptrdiff_t>(header), bytes.end());
  return a;
}

ImageSet read_idx(const fs::path& images, const fs::path& labels) {
  IdxArray x = parse_idx(read_file_bytes(images), images.string());
  IdxArray y = parse_idx(read_file_bytes(labels), labels.string());
  if (x.dims.size() != 3 && !(x.dims.size() == 4 && (x.dims[3] == 1 || x.dims[3] == 3)))
    throw Error(images.string() + ": IDX images must be [n, height, width] (or [n, h, w, 1 or 3]); this one has " +
                std::to_string(x.dims.size()) + " dimensions");
  if (y.dims.size() != 1)
    throw Error(labels.string() + ": IDX labels must be one dimension; this file has " + std::to_string(y.dims.size()));
  if (x.dims[0] != y.dims[0])
    throw Error("labels do not match images: " + images.string() + " holds " + std::to_string(x.dims[0]) + " images, " +
                labels.string() + " " + std::to_string(y.dims[0]) + " labels");
  ImageSet s;
  s.count = x.dims[0];
  s.height = x.dims[1];
  s.width = x.dims[2];
  s.channels = x.dims.size() == 4 ? x.dims[3] : 1;
  s.pixels = std::move(x.values);
  s.labels.assign(y.values.begin(), y.values.end());
  s.classes = classes_of(s.labels);
  s.source = images.string();
  return s;
}

fs::path fashion_mnist_dir() {
  const char* env = std::getenv("ACCELBENCH_FASHION_MNIST");
  return env != nullptr && *env != '\0' ? fs::path(env) : fs::path(kFashionMnistDebianDir);
}

ImageSet read_fashion_mnist(const std::string& split, const fs::path& dir) {
  if (split != "train" && split != "test") throw UsageError("Fashion-MNIST split '" + split + "': train or test");
  const fs::path root = dir.empty() ? fashion_mnist_dir() : dir;
  const std::string stem = split == "train" ? "train" : "t10k";
  const auto find = [&](const std::string& kind) {
    for (const char* ext : {".gz", ""}) {
      const fs::path p = root / (stem + "-" + kind + "-ubyte" + ext);
      if (fs::exists(p)) return p;
    }
    throw Error("Fashion-MNIST not found: no " + stem + "-" + kind + "-ubyte[.gz] in " + root.string() +
                " (install Debian's dataset-fashion-mnist, or point ACCELBENCH_FASHION_MNIST at a folder with the "
                "IDX files)");
  };
  ImageSet s = read_idx(find("images-idx3"), find("labels-idx1"));
  s.source = "fashion-mnist:" + split;
  return s;
}

ImageSet read_cifar(const std::vector<fs::path>& files, CifarKind kind) {
  const std::size_t label_bytes = kind == CifarKind::cifar10 ? 1 : 2;
  const std::size_t record = label_bytes + 3072;
  if (files.empty()) throw UsageError("CIFAR: no files given");
  ImageSet s;
  s.height = s.width = 32;
  s.channels = 3;
  for (const auto& f : files) {
    const auto bytes = read_file_bytes(f);
    if (bytes.empty() || bytes.size() % record != 0)
      throw Error(f.string() + ": " + std::to_string(bytes.size()) + " bytes is not a whole number of " +
                  std::to_string(record) + "-byte " + (kind == CifarKind::cifar10 ? "CIFAR-10" : "CIFAR-100") +
                  " records (truncated, or the other CIFAR)");
    const std::size_t n = bytes.size() / record;
    s.pixels.resize(static_cast<std::size_t>(s.count + static_cast<std::int64_t>(n)) * 3072);
    for (std::size_t r = 0; r < n; ++r) {
      const std::uint8_t* rec = bytes.data() + r * record;
      const int label = rec[label_bytes - 1];
      const int limit = kind == CifarKind::cifar10 ? 10 : 100;
      if (label >= limit)
        throw Error(f.string() + ": record " + std::to_string(r) + " has label " + std::to_string(label) + " (CIFAR-" +
                    std::to_string(limit) + " labels are below " + std::to_string(limit) + ")");
      s.labels.push_back(label);
      planes_to_hwc(rec + label_bytes, s.pixels.data() + (static_cast<std::size_t>(s.count) + r) * 3072);
    }
    s.count += static_cast<std::int64_t>(n);
  }
  s.classes = kind == CifarKind::cifar10 ? 10 : 100;
  s.source = files.front().string();
  return s;
}

ImageSet load_image_set(const std::string& spec, const fs::path& labels) {
  if (spec == "fashion-mnist" || spec.starts_with("fashion-mnist:"))
    return read_fashion_mnist(spec == "fashion-mnist" ? "train" : spec.substr(14));
  for (const auto& [prefix, kind] :
       {std::pair{"cifar10:", CifarKind::cifar10}, std::pair{"cifar100:", CifarKind::cifar100}})
    if (spec.starts_with(prefix)) return read_cifar({fs::path(spec.substr(std::string(prefix).size()))}, kind);
  const fs::path images(spec);
  if (!fs::is_regular_file(images))
    throw UsageError("image set '" + spec +
                     "': not fashion-mnist[:train|:test], cifar10:FILE, cifar100:FILE or an IDX file");
  if (!labels.empty()) return read_idx(images, labels);
  // MNIST's naming: train-images-idx3-ubyte[.gz] beside train-labels-idx1-ubyte[.gz].
  std::string name = images.filename().string();
  const auto at = name.find("images-idx3");
  if (at == std::string::npos) throw UsageError(spec + ": give its IDX label file (--labels); none is named after it");
  name.replace(at, 11, "labels-idx1");
  return read_idx(images, images.parent_path() / name);
}

}  // namespace ab::data
