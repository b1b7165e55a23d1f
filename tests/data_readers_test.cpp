// The data module's readers: IDX (plain and gzip), CIFAR, token files, Fashion-MNIST, and the
// messages for corrupt, truncated and mismatched files. Every file is written here, of random bytes.
#include <gtest/gtest.h>

#include <cstdlib>
#include <fstream>
#include <set>

#include "data/data.h"
#include "data/pipeline.h"
#include "test_support.h"

namespace {

namespace fs = std::filesystem;
using ab::data::ImageSet;
using ab::test::TempDir;
using Bytes = std::vector<std::uint8_t>;
using ab::test::idx_file;
using ab::test::write_bytes;

bool contains(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

Bytes random_bytes(std::size_t n, std::uint64_t seed, int modulo = 256) {
  Bytes b(n);
  for (std::size_t i = 0; i < n; ++i)
    b[i] = static_cast<std::uint8_t>(ab::mix64(seed, i) % static_cast<unsigned>(modulo));
  return b;
}

void gzip(const fs::path& p) { ASSERT_EQ(ab::test::shell("gzip -f " + ab::test::quote(p.string())).code, 0); }

// A set of n images h x w with random pixels and labels below 10, as MNIST names its files.
struct IdxPair {
  Bytes pixels, labels;
  fs::path images_path, labels_path;
};
IdxPair write_idx_pair(const fs::path& dir, std::uint32_t n, std::uint32_t h, std::uint32_t w, std::uint64_t seed) {
  IdxPair p{random_bytes(std::size_t{n} * h * w, seed), random_bytes(n, seed + 1, 10), dir / "train-images-idx3-ubyte",
            dir / "train-labels-idx1-ubyte"};
  write_bytes(p.images_path, idx_file({n, h, w}, p.pixels));
  write_bytes(p.labels_path, idx_file({n}, p.labels));
  return p;
}

std::string read_error(const fs::path& images, const fs::path& labels) {
  return ab::test::error_message<ab::Error>([&] { ab::data::read_idx(images, labels); });
}

TEST(Idx, ReadsPlainAndGzipFilesAlike) {
  TempDir tmp;
  const IdxPair p = write_idx_pair(tmp.path(), 7, 5, 4, ab::test::seed());
  const ImageSet plain = ab::data::read_idx(p.images_path, p.labels_path);
  EXPECT_EQ(plain.count, 7);
  EXPECT_EQ(plain.height, 5);
  EXPECT_EQ(plain.width, 4);
  EXPECT_EQ(plain.channels, 1);
  EXPECT_EQ(plain.pixels, p.pixels);
  ASSERT_EQ(plain.labels.size(), 7u);
  for (std::size_t i = 0; i < 7; ++i) EXPECT_EQ(plain.labels[i], p.labels[i]);
  EXPECT_EQ(plain.classes, *std::max_element(p.labels.begin(), p.labels.end()) + 1);
  gzip(p.images_path);
  gzip(p.labels_path);
  const ImageSet gz = ab::data::read_idx(p.images_path.string() + ".gz", p.labels_path.string() + ".gz");
  EXPECT_EQ(gz.pixels, p.pixels);
  EXPECT_EQ(gz.labels, plain.labels);
  // An image file named like MNIST's finds its label file beside it.
  EXPECT_EQ(ab::data::load_image_set(p.images_path.string() + ".gz").pixels, p.pixels);
}

TEST(Idx, ACorruptHeaderIsNamed) {
  TempDir tmp;
  const IdxPair p = write_idx_pair(tmp.path(), 3, 4, 4, ab::test::seed());
  Bytes bad = idx_file({3, 4, 4}, p.pixels);
  bad[0] = 0x1F;  // what a gzip file starts with
  write_bytes(tmp.path() / "magic", bad);
  EXPECT_TRUE(contains(read_error(tmp.path() / "magic", p.labels_path), "not an IDX file"))
      << read_error(tmp.path() / "magic", p.labels_path);
  bad = idx_file({3, 4, 4}, p.pixels);
  bad[2] = 0x0D;  // float elements
  write_bytes(tmp.path() / "type", bad);
  EXPECT_TRUE(contains(read_error(tmp.path() / "type", p.labels_path), "element type"));
  bad = idx_file({3, 4, 4}, p.pixels);
  bad[3] = 9;
  write_bytes(tmp.path() / "rank", bad);
  EXPECT_TRUE(contains(read_error(tmp.path() / "rank", p.labels_path), "9 dimensions"));
  // A header whose sizes say more than the file holds, or less.
  write_bytes(tmp.path() / "big", idx_file({3, 4, 5}, p.pixels));
  EXPECT_TRUE(contains(read_error(tmp.path() / "big", p.labels_path),
                       "truncated: the IDX header says 60 bytes of data, the file holds 48"));
  write_bytes(tmp.path() / "small", idx_file({3, 4, 3}, p.pixels));
  EXPECT_TRUE(contains(read_error(tmp.path() / "small", p.labels_path), "12 bytes after the 36"));
}

TEST(Idx, TruncatedFilesAreRefused) {
  TempDir tmp;
  const IdxPair p = write_idx_pair(tmp.path(), 50, 8, 8, ab::test::seed());
  Bytes whole = idx_file({50, 8, 8}, p.pixels);
  write_bytes(tmp.path() / "cut", Bytes(whole.begin(), whole.end() - 100));
  const std::string cut = read_error(tmp.path() / "cut", p.labels_path);
  EXPECT_TRUE(contains(cut, "truncated")) << cut;
  EXPECT_TRUE(contains(cut, (tmp.path() / "cut").string())) << cut;
  write_bytes(tmp.path() / "header", Bytes(whole.begin(), whole.begin() + 9));
  EXPECT_TRUE(contains(read_error(tmp.path() / "header", p.labels_path), "truncated IDX header"));
  // A gzip stream cut in half.
  gzip(p.images_path);
  std::ifstream in(p.images_path.string() + ".gz", std::ios::binary);
  const Bytes gz((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  write_bytes(tmp.path() / "cut.gz", Bytes(gz.begin(), gz.begin() + static_cast<std::ptrdiff_t>(gz.size() / 2)));
  const std::string half = read_error(tmp.path() / "cut.gz", p.labels_path);
  EXPECT_TRUE(contains(half, "truncated")) << half;
  EXPECT_TRUE(contains(read_error(tmp.path() / "absent", p.labels_path), "cannot open"));
}

TEST(Idx, LabelsThatDoNotMatchTheImagesAreRefused) {
  TempDir tmp;
  const IdxPair p = write_idx_pair(tmp.path(), 7, 3, 3, ab::test::seed());
  write_bytes(tmp.path() / "six-labels", idx_file({6}, random_bytes(6, ab::test::seed(), 10)));
  const std::string e = read_error(p.images_path, tmp.path() / "six-labels");
  EXPECT_TRUE(contains(e, "labels do not match images")) << e;
  EXPECT_TRUE(contains(e, "7 images")) << e;
  EXPECT_TRUE(contains(e, "6 labels")) << e;
  // Labels given as images, and images given as labels.
  EXPECT_TRUE(contains(read_error(p.labels_path, p.labels_path), "must be [n, height, width]"));
  EXPECT_TRUE(contains(read_error(p.images_path, p.images_path), "labels must be one dimension"));
}

Bytes cifar_records(int n, int label_bytes, std::uint64_t seed) {
  Bytes b = random_bytes(static_cast<std::size_t>(n) * (label_bytes + 3072), seed);
  for (int r = 0; r < n; ++r)
    for (int l = 0; l < label_bytes; ++l)
      b[static_cast<std::size_t>(r) * (label_bytes + 3072) + l] =
          static_cast<std::uint8_t>(ab::mix64(seed, 99 + r * 2 + l) % 10);
  return b;
}

TEST(Cifar, RecordsBecomeHwcImagesWithTheirLabels) {
  TempDir tmp;
  const std::uint64_t seed = ab::test::seed();
  for (const auto& [kind, label_bytes] :
       {std::pair{ab::data::CifarKind::cifar10, 1}, std::pair{ab::data::CifarKind::cifar100, 2}}) {
    const Bytes raw = cifar_records(3, label_bytes, seed);
    write_bytes(tmp.path() / "batch.bin", raw);
    const ImageSet s = ab::data::read_cifar({tmp.path() / "batch.bin", tmp.path() / "batch.bin"}, kind);
    ASSERT_EQ(s.count, 6);
    EXPECT_EQ(s.height, 32);
    EXPECT_EQ(s.channels, 3);
    const std::size_t rec = static_cast<std::size_t>(label_bytes) + 3072;
    for (std::size_t r = 0; r < 3; ++r) {
      EXPECT_EQ(s.labels[r], raw[r * rec + rec - 3073]) << "the fine label (the last label byte)";
      EXPECT_EQ(s.labels[r + 3], s.labels[r]);
      // Pixel (y=5, x=7), channel c sits in plane c of the record.
      for (std::size_t c = 0; c < 3; ++c)
        EXPECT_EQ(s.pixels[r * 3072 + (5 * 32 + 7) * 3 + c], raw[r * rec + label_bytes + c * 1024 + 5 * 32 + 7]);
    }
  }
}

TEST(Cifar, TruncatedFilesAndBadLabelsAreRefused) {
  TempDir tmp;
  Bytes raw = cifar_records(2, 1, ab::test::seed());
  write_bytes(tmp.path() / "cut.bin", Bytes(raw.begin(), raw.end() - 10));
  const std::string cut = ab::test::error_message<ab::Error>(
      [&] { ab::data::read_cifar({tmp.path() / "cut.bin"}, ab::data::CifarKind::cifar10); });
  EXPECT_TRUE(contains(cut, "6136 bytes is not a whole number of 3073-byte CIFAR-10 records")) << cut;
  raw[3073] = 12;
  write_bytes(tmp.path() / "label.bin", raw);
  const std::string label = ab::test::error_message<ab::Error>(
      [&] { ab::data::read_cifar({tmp.path() / "label.bin"}, ab::data::CifarKind::cifar10); });
  EXPECT_TRUE(contains(label, "record 1 has label 12")) << label;
}

TEST(Tokens, HeaderedAndRawFilesRoundTrip) {
  TempDir tmp;
  std::vector<std::uint16_t> tokens(1000);
  const std::uint64_t seed = ab::test::seed();
  for (std::size_t i = 0; i < tokens.size(); ++i) tokens[i] = static_cast<std::uint16_t>(ab::mix64(seed, i) % 50257);
  ab::data::write_tokens(tmp.path() / "t.bin", tokens);
  EXPECT_EQ(ab::data::read_tokens(tmp.path() / "t.bin"), tokens);
  EXPECT_EQ(fs::file_size(tmp.path() / "t.bin"), 1024 + 2000u);
  std::ofstream(tmp.path() / "raw.bin", std::ios::binary).write(reinterpret_cast<const char*>(tokens.data()), 2000);
  EXPECT_EQ(ab::data::read_tokens(tmp.path() / "raw.bin"), tokens);
}

TEST(Tokens, TruncatedAndOddFilesAreRefused) {
  TempDir tmp;
  std::vector<std::uint16_t> tokens(600, 7);
  tokens[3] = 50000;
  ab::data::write_tokens(tmp.path() / "t.bin", tokens);
  fs::resize_file(tmp.path() / "t.bin", 1024 + 1000);
  const std::string cut = ab::test::error_message<ab::Error>([&] { ab::data::read_tokens(tmp.path() / "t.bin"); });
  EXPECT_TRUE(contains(cut, "truncated: the header gives 600 tokens (1200 bytes), the file holds 1000")) << cut;
  std::ofstream(tmp.path() / "odd.bin", std::ios::binary) << "abc";
  EXPECT_TRUE(contains(ab::test::error_message<ab::Error>([&] { ab::data::read_tokens(tmp.path() / "odd.bin"); }),
                       "odd number"));
}

TEST(Tokens, TheByteTokenizerTakesAnyFile) {
  TempDir tmp;
  const Bytes bytes = random_bytes(3000, ab::test::seed());  // not text: every byte value can occur
  write_bytes(tmp.path() / "any.txt", bytes);
  const auto tokens = ab::data::tokenize_text_file(tmp.path() / "any.txt");
  ASSERT_EQ(tokens.size(), bytes.size());
  for (std::size_t i = 0; i < bytes.size(); ++i) ASSERT_EQ(tokens[i], bytes[i]) << i;
  const std::string text = ab::data::byte_text(tokens);
  EXPECT_EQ(Bytes(text.begin(), text.end()), bytes);
  EXPECT_EQ(ab::data::byte_tokens("héllo").size(), 6u) << "é is two bytes in UTF-8";
  const std::vector<std::uint16_t> wide{65, 300};
  EXPECT_TRUE(contains(ab::test::error_message<ab::Error>([&] { ab::data::byte_text(wide); }), "token 300 at 1"));
  write_bytes(tmp.path() / "empty.txt", {});
  EXPECT_TRUE(contains(
      ab::test::error_message<ab::Error>([&] { ab::data::tokenize_text_file(tmp.path() / "empty.txt"); }), "empty"));
}

// Each token says where it stands (a random base plus its position), so a window shows where it came from.
TEST(Tokens, WindowsAreShiftedPairsShuffledPerEpochAndShardedPerRank) {
  const auto base = static_cast<std::uint16_t>(ab::mix64(ab::test::seed(), 0) % 60000);
  std::vector<std::uint16_t> tokens(5001);
  for (std::size_t i = 0; i < tokens.size(); ++i) tokens[i] = static_cast<std::uint16_t>(base + i);
  constexpr std::int64_t kSeq = 16, kBatch = 8;
  std::set<std::int64_t> starts_epoch0;
  std::vector<std::int64_t> first_epoch0, first_epoch1;
  for (int rank = 0; rank < 2; ++rank) {
    const ab::data::TokenWindows w(tokens, kSeq, 77, rank, 2);
    EXPECT_EQ(w.windows(), 312);                 // (5001 - 1) / 16
    ASSERT_EQ(w.batches_per_epoch(kBatch), 19);  // 156 windows a rank
    std::vector<std::int32_t> in(kBatch * kSeq), out(kBatch * kSeq);
    for (std::int64_t b = 0; b < 2 * 19; ++b) {
      w.fill(b, kBatch, in.data(), out.data());
      for (std::int64_t s = 0; s < kBatch; ++s) {
        const std::int64_t start = in[static_cast<std::size_t>(s * kSeq)] - base;
        ASSERT_EQ(start % kSeq, 0) << "windows start at multiples of seq";
        for (std::int64_t t = 0; t < kSeq; ++t) {
          ASSERT_EQ(in[static_cast<std::size_t>(s * kSeq + t)], base + start + t);
          ASSERT_EQ(out[static_cast<std::size_t>(s * kSeq + t)], base + start + t + 1) << "targets: the next token";
        }
        if (b < 19) {
          EXPECT_TRUE(starts_epoch0.insert(start).second) << "a window twice in one epoch, or on two ranks";
        }
        if (rank == 0 && b % 19 == 0) (b == 0 ? first_epoch0 : first_epoch1).push_back(start);
      }
    }
  }
  EXPECT_EQ(starts_epoch0.size(), 2u * 19 * kBatch);
  EXPECT_NE(first_epoch0, first_epoch1) << "each epoch its own order";
  EXPECT_TRUE(
      contains(ab::test::usage_error([&] { ab::data::TokenWindows(std::vector<std::uint16_t>(40, 9), 16, 1, 0, 4); }),
               "fewer than the 4 ranks"));
}

// Debian's dataset-fashion-mnist, where installed.
TEST(FashionMnist, TheDebianPackageReadsAsTenClassesOf28x28) {
  if (std::getenv("ACCELBENCH_FASHION_MNIST") == nullptr && !fs::exists(ab::data::kFashionMnistDebianDir))
    GTEST_SKIP() << "no " << ab::data::kFashionMnistDebianDir
                 << " (scripts/install-deps.sh installs dataset-fashion-mnist)";
  const ImageSet test = ab::data::read_fashion_mnist("test");
  EXPECT_EQ(test.count, 10000);
  EXPECT_EQ(test.height, 28);
  EXPECT_EQ(test.width, 28);
  EXPECT_EQ(test.classes, 10);
  std::vector<int> per_class(10);
  for (auto l : test.labels) ++per_class[static_cast<std::size_t>(l)];
  for (int n : per_class) EXPECT_EQ(n, 1000) << "the test split is balanced";
}

TEST(FashionMnist, AMissingFolderNamesThePackageAndTheVariable) {
  TempDir tmp;
  const std::string e = ab::test::error_message<ab::Error>([&] { ab::data::read_fashion_mnist("train", tmp.path()); });
  EXPECT_TRUE(contains(e, "dataset-fashion-mnist")) << e;
  EXPECT_TRUE(contains(e, "ACCELBENCH_FASHION_MNIST")) << e;
  EXPECT_TRUE(contains(e, tmp.path().string())) << e;
  // The variable points the reader elsewhere.
  write_idx_pair(tmp.path(), 4, 28, 28, ab::test::seed());
  const std::string before = std::getenv("ACCELBENCH_FASHION_MNIST") ? std::getenv("ACCELBENCH_FASHION_MNIST") : "";
  setenv("ACCELBENCH_FASHION_MNIST", tmp.path().c_str(), 1);
  const ImageSet s = ab::data::read_fashion_mnist("train");
  if (before.empty()) unsetenv("ACCELBENCH_FASHION_MNIST");
  else setenv("ACCELBENCH_FASHION_MNIST", before.c_str(), 1);
  EXPECT_EQ(s.count, 4);
  EXPECT_TRUE(
      contains(ab::test::usage_error([&] { ab::data::read_fashion_mnist("valid", tmp.path()); }), "train or test"));
}

}  // namespace
