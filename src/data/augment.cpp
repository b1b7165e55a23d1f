// The pipeline's per-sample work outside the threads: where samples come from, their order per
// epoch and rank, and the crop, flip and normalisation.
#include <algorithm>
#include <cmath>
#include <fstream>

#include "core/error.h"
#include "core/rng.h"
#include "data/pipeline.h"

namespace ab::data {
namespace {

class RawSource final : public SampleSource {
 public:
  explicit RawSource(ImageSet set) : set_(std::move(set)) {}
  std::int64_t size() const override { return set_.count; }
  std::int32_t label(std::int64_t i) const override { return set_.labels[static_cast<std::size_t>(i)]; }
  int classes() const override { return set_.classes; }
  void load(std::int64_t i, Image& out) const override {
    const auto px = set_.image(i);
    out.height = set_.height;
    out.width = set_.width;
    out.channels = set_.channels;
    out.pixels.assign(px.begin(), px.end());
  }
  std::int64_t encoded_bytes() const override { return 0; }

 private:
  ImageSet set_;
};

class EncodedSource final : public SampleSource {
 public:
  EncodedSource(std::vector<std::vector<std::uint8_t>> files, std::vector<std::int32_t> labels, int classes)
      : files_(std::move(files)), labels_(std::move(labels)), classes_(classes) {
    if (files_.size() != labels_.size())
      throw Error("encoded images: " + std::to_string(files_.size()) + " files, " + std::to_string(labels_.size()) +
                  " labels");
    for (const auto& f : files_) bytes_ += static_cast<std::int64_t>(f.size());
  }
  std::int64_t size() const override { return static_cast<std::int64_t>(files_.size()); }
  std::int32_t label(std::int64_t i) const override { return labels_[static_cast<std::size_t>(i)]; }
  int classes() const override { return classes_; }
  void load(std::int64_t i, Image& out) const override {
    decode_image_into(files_[static_cast<std::size_t>(i)], "in-memory image " + std::to_string(i), out);
  }
  std::int64_t encoded_bytes() const override { return bytes_; }
  bool encoded(std::int64_t i, std::vector<std::uint8_t>& out) const override {
    const auto& f = files_[static_cast<std::size_t>(i)];
    out.assign(f.begin(), f.end());
    return true;
  }

 private:
  std::vector<std::vector<std::uint8_t>> files_;
  std::vector<std::int32_t> labels_;
  int classes_ = 0;
  std::int64_t bytes_ = 0;
};

class FolderSource final : public SampleSource {
 public:
  explicit FolderSource(ImageFolder folder) : folder_(std::move(folder)) {
    for (const auto& f : folder_.files) bytes_ += static_cast<std::int64_t>(std::filesystem::file_size(f.path));
  }
  std::int64_t size() const override { return static_cast<std::int64_t>(folder_.files.size()); }
  std::int32_t label(std::int64_t i) const override { return folder_.files[static_cast<std::size_t>(i)].label; }
  int classes() const override { return static_cast<int>(folder_.class_names.size()); }
  void load(std::int64_t i, Image& out) const override {
    std::vector<std::uint8_t> bytes;
    encoded(i, bytes);
    decode_image_into(bytes, folder_.files[static_cast<std::size_t>(i)].path.string(), out);
  }
  std::int64_t encoded_bytes() const override { return bytes_; }
  bool encoded(std::int64_t i, std::vector<std::uint8_t>& out) const override {
    const auto& path = folder_.files[static_cast<std::size_t>(i)].path;
    std::ifstream in(path, std::ios::binary);
    out.assign(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
    if (!in.eof() && !in) throw Error("cannot read " + path.string());
    return true;
  }

 private:
  ImageFolder folder_;
  std::int64_t bytes_ = 0;
};

}  // namespace

std::unique_ptr<SampleSource> raw_source(ImageSet set) { return std::make_unique<RawSource>(std::move(set)); }
std::unique_ptr<SampleSource> encoded_source(std::vector<std::vector<std::uint8_t>> files,
                                             std::vector<std::int32_t> labels, int classes) {
  return std::make_unique<EncodedSource>(std::move(files), std::move(labels), classes);
}
std::unique_ptr<SampleSource> folder_source(ImageFolder folder) {
  return std::make_unique<FolderSource>(std::move(folder));
}

std::unique_ptr<SampleSource> jpeg_source(const ImageSet& set, std::int64_t size, int quality, std::int64_t limit) {
  const std::int64_t n = limit < 0 ? set.count : std::min(limit, set.count);
  std::vector<std::vector<std::uint8_t>> files;
  for (std::int64_t i = 0; i < n; ++i)
    files.push_back(encode_jpeg(resize_bilinear(image_of(set, i), size, size, 3), quality));
  return encoded_source(std::move(files), {set.labels.begin(), set.labels.begin() + n}, set.classes);
}

std::vector<std::int64_t> epoch_order(std::int64_t size, std::uint64_t seed, std::int64_t epoch, int rank, int ranks,
                                      bool shuffle) {
  if (ranks < 1 || rank < 0 || rank >= ranks)
    throw Error("epoch_order: rank " + std::to_string(rank) + " of " + std::to_string(ranks));
  std::vector<std::int64_t> all(static_cast<std::size_t>(size));
  for (std::int64_t i = 0; i < size; ++i) all[static_cast<std::size_t>(i)] = i;
  if (shuffle) {  // Fisher-Yates from counter-based draws: the same (seed, epoch) on every rank
    const std::uint64_t epoch_seed = mix64(seed, static_cast<std::uint64_t>(epoch));
    for (std::int64_t i = size - 1; i > 0; --i) {
      const auto j = static_cast<std::int64_t>(mix64(epoch_seed, static_cast<std::uint64_t>(i)) %
                                               static_cast<std::uint64_t>(i + 1));
      std::swap(all[static_cast<std::size_t>(i)], all[static_cast<std::size_t>(j)]);
    }
  }
  const std::int64_t per_rank = size / ranks;
  std::vector<std::int64_t> mine(static_cast<std::size_t>(per_rank));
  for (std::int64_t k = 0; k < per_rank; ++k)
    mine[static_cast<std::size_t>(k)] = all[static_cast<std::size_t>(k * ranks + rank)];
  return mine;
}

CropBox choose_crop(const Augment& a, std::int64_t height, std::int64_t width, std::uint64_t seed, std::uint64_t key) {
  const std::uint64_t s = mix64(seed, key);
  CropBox box{0, 0, height, width, a.flip && uniform(s, 0, 0.0, 1.0) < 0.5};
  if (!a.random_crop && a.pad > 0) {
    box.y = static_cast<std::int64_t>(uniform(s, 1, 0.0, static_cast<double>(2 * a.pad + 1)));
    box.x = static_cast<std::int64_t>(uniform(s, 2, 0.0, static_cast<double>(2 * a.pad + 1)));
  }
  if (!a.random_crop) return box;
  const double area = static_cast<double>(height * width);
  const double log_lo = std::log(a.ratio_min), log_hi = std::log(a.ratio_max);
  // torchvision's RandomResizedCrop: ten tries at a box that fits, then the centre at a clamped ratio.
  for (std::uint64_t attempt = 0; attempt < 10; ++attempt) {
    const double target = area * uniform(s, 1 + 4 * attempt, a.scale_min, a.scale_max);
    const double ratio = std::exp(uniform(s, 2 + 4 * attempt, log_lo, log_hi));
    const auto w = static_cast<std::int64_t>(std::lround(std::sqrt(target * ratio)));
    const auto h = static_cast<std::int64_t>(std::lround(std::sqrt(target / ratio)));
    if (w < 1 || h < 1 || w > width || h > height) continue;
    box.y = static_cast<std::int64_t>(uniform(s, 3 + 4 * attempt, 0.0, static_cast<double>(height - h + 1)));
    box.x = static_cast<std::int64_t>(uniform(s, 4 + 4 * attempt, 0.0, static_cast<double>(width - w + 1)));
    box.height = h;
    box.width = w;
    return box;
  }
  const double in_ratio = static_cast<double>(width) / static_cast<double>(height);
  if (in_ratio < a.ratio_min) {
    box.height = std::lround(static_cast<double>(width) / a.ratio_min);
  } else if (in_ratio > a.ratio_max) {
    box.width = std::lround(static_cast<double>(height) * a.ratio_max);
  }
  box.y = (height - box.height) / 2;
  box.x = (width - box.width) / 2;
  return box;
}

// Bilinear sampling in 11-bit fixed point (OpenCV's INTER_LINEAR scheme) to an 8-bit value, as
// torchvision's crop does on 8-bit images before ToTensor; the normalised value of each of the
// 256 levels per channel is then a table entry, already in the output type.
namespace {

constexpr int kWeightBits = 11;
constexpr std::int32_t kOne = 1 << kWeightBits;

struct Taps {
  std::int64_t lo = 0, hi = 0;  // source indices
  std::int32_t w = 0;           // weight of hi, out of kOne
};

// Output position o of n over the box [start, start + length) of the source, pixel centres aligned.
Taps taps(std::int64_t o, std::int64_t n, std::int64_t start, std::int64_t length) {
  const double scale = static_cast<double>(length) / static_cast<double>(n);
  const double f = std::clamp((static_cast<double>(o) + 0.5) * scale - 0.5, 0.0, static_cast<double>(length - 1));
  const auto lo = static_cast<std::int64_t>(f);
  return {start + lo, start + std::min(lo + 1, length - 1),
          static_cast<std::int32_t>(std::lround((f - static_cast<double>(lo)) * kOne))};
}

template <typename T>
void sample_box(const Image& image, const Augment& a, const CropBox& box, const std::array<std::array<T, 256>, 3>& lut,
                T* out) {
  const std::int64_t ic = image.channels, oc = a.channels;
  std::vector<Taps> cols(static_cast<std::size_t>(a.width));
  for (std::int64_t ox = 0; ox < a.width; ++ox) {
    Taps t = taps(box.flip ? a.width - 1 - ox : ox, a.width, box.x, box.width);
    cols[static_cast<std::size_t>(ox)] = {t.lo * ic, t.hi * ic, t.w};  // as byte offsets in a row
  }
  for (std::int64_t oy = 0; oy < a.height; ++oy) {
    const Taps row = taps(oy, a.height, box.y, box.height);
    const std::uint8_t* r0 = image.pixels.data() + row.lo * image.width * ic;
    const std::uint8_t* r1 = image.pixels.data() + row.hi * image.width * ic;
    T* o = out + oy * a.width * oc;
    for (const Taps& col : cols) {
      for (std::int64_t c = 0; c < oc; ++c) {
        const std::int64_t sc = ic == 1 ? 0 : c;
        const std::int32_t top = r0[col.lo + sc] * (kOne - col.w) + r0[col.hi + sc] * col.w;
        const std::int32_t bottom = r1[col.lo + sc] * (kOne - col.w) + r1[col.hi + sc] * col.w;
        const std::int32_t v =
            (top * (kOne - row.w) + bottom * row.w + (1 << (2 * kWeightBits - 1))) >> (2 * kWeightBits);
        *o++ = lut[static_cast<std::size_t>(c)][static_cast<std::size_t>(v)];
      }
    }
  }
}

Image padded(const Image& image, std::int64_t pad) {
  Image p{image.height + 2 * pad, image.width + 2 * pad, image.channels, {}};
  p.pixels.assign(static_cast<std::size_t>(p.height * p.width * p.channels), 0);
  const std::int64_t row = image.width * image.channels;
  for (std::int64_t y = 0; y < image.height; ++y)
    std::copy_n(image.pixels.data() + y * row, row, p.pixels.data() + ((y + pad) * p.width + pad) * p.channels);
  return p;
}

template <typename T, typename Store>
std::array<std::array<T, 256>, 3> normalise_table(const Augment& a, Store store) {
  std::array<std::array<T, 256>, 3> lut{};
  for (std::size_t c = 0; c < 3; ++c)
    for (std::size_t v = 0; v < 256; ++v) lut[c][v] = store((static_cast<float>(v) / 255.0F - a.mean[c]) / a.stddev[c]);
  return lut;
}

}  // namespace

void augment_into(const Image& source, const Augment& a, const CropBox& box, void* out) {
  if (a.pad < 0 || a.pad > 1024) throw Error("augment: pad " + std::to_string(a.pad) + " (0..1024)");
  const bool pad = !a.random_crop && a.pad > 0;
  Image padded_source;
  if (pad) padded_source = padded(source, a.pad);
  const Image& image = pad ? padded_source : source;
  if (image.channels != a.channels && !(image.channels == 1 && a.channels == 3))
    throw Error("augment: a " + std::to_string(image.channels) + "-channel image for " + std::to_string(a.channels) +
                "-channel output");
  if (box.y < 0 || box.x < 0 || box.height < 1 || box.width < 1 || box.y + box.height > image.height ||
      box.x + box.width > image.width)
    throw Error("augment: crop box outside the " + std::to_string(image.height) + "x" + std::to_string(image.width) +
                " image");
  switch (a.dtype) {
    case DType::f32:
      return sample_box(image, a, box, normalise_table<float>(a, [](float v) { return v; }), static_cast<float*>(out));
    case DType::bf16:
      return sample_box(image, a, box, normalise_table<std::uint16_t>(a, &float_to_bf16_bits),
                        static_cast<std::uint16_t*>(out));
    case DType::f16:
      return sample_box(image, a, box, normalise_table<std::uint16_t>(a, &float_to_half_bits),
                        static_cast<std::uint16_t*>(out));
    default: throw Error("augment: output type " + std::string(to_string(a.dtype)) + " (f16, bf16 or f32)");
  }
}

}  // namespace ab::data
