// JPEG/PNG codecs, the bilinear resize, image folders (with unreadable files) and the
// make-imagefolder command, on images made here from random numbers.
#include <gtest/gtest.h>

#include <cmath>
#include <fstream>

#include "data/data.h"
#include "test_support.h"

namespace {

namespace fs = std::filesystem;
using ab::data::Image;
using ab::test::TempDir;
using Bytes = std::vector<std::uint8_t>;
using ab::test::write_bytes;

bool contains(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

Image random_image(std::int64_t h, std::int64_t w, std::int64_t c, std::uint64_t seed) {
  Image im{h, w, c, Bytes(static_cast<std::size_t>(h * w * c))};
  for (std::size_t i = 0; i < im.pixels.size(); ++i) im.pixels[i] = static_cast<std::uint8_t>(ab::mix64(seed, i));
  return im;
}

// Smooth content (a few random cosines) that JPEG keeps close at high quality.
Image smooth_image(std::int64_t h, std::int64_t w, std::int64_t c, std::uint64_t seed) {
  Image im{h, w, c, Bytes(static_cast<std::size_t>(h * w * c))};
  const double fy = ab::uniform(seed, 0, 0.5, 2.0), fx = ab::uniform(seed, 1, 0.5, 2.0),
               phase = ab::uniform(seed, 2, 0, 6);
  for (std::int64_t y = 0; y < h; ++y)
    for (std::int64_t x = 0; x < w; ++x)
      for (std::int64_t ch = 0; ch < c; ++ch) {
        const double v = 128 + 90 *
                                   std::cos(fy * 6.28 * static_cast<double>(y) / static_cast<double>(h) + phase +
                                            static_cast<double>(ch)) *
                                   std::cos(fx * 6.28 * static_cast<double>(x) / static_cast<double>(w));
        im.pixels[static_cast<std::size_t>((y * w + x) * c + ch)] = static_cast<std::uint8_t>(v);
      }
  return im;
}

double mean_abs_difference(const Bytes& a, const Bytes& b) {
  double s = 0;
  for (std::size_t i = 0; i < a.size(); ++i) s += std::abs(static_cast<double>(a[i]) - static_cast<double>(b[i]));
  return s / static_cast<double>(a.size());
}

TEST(Codec, JpegKeepsSizeChannelsAndCloseValues) {
  for (const std::int64_t channels : {1, 3}) {
    const Image im = smooth_image(37, 53, channels, ab::test::seed());
    const Image back = ab::data::decode_image(ab::data::encode_jpeg(im, 95), "test.jpg");
    EXPECT_EQ(back.height, 37);
    EXPECT_EQ(back.width, 53);
    EXPECT_EQ(back.channels, channels);
    EXPECT_LT(mean_abs_difference(back.pixels, im.pixels), 3.0) << channels << " channels";
    EXPECT_GT(mean_abs_difference(back.pixels, random_image(37, 53, channels, ab::test::seed()).pixels), 20.0)
        << "the comparison can fail";
  }
}

TEST(Codec, PngIsLossless) {
  for (const std::int64_t channels : {1, 3}) {
    const Image im = random_image(19, 23, channels, ab::test::seed());
    const Image back = ab::data::decode_image(ab::data::encode_png(im), "test.png");
    EXPECT_EQ(back.channels, channels);
    EXPECT_EQ(back.pixels, im.pixels);
  }
}

TEST(Codec, DamagedFilesAreRefusedWithTheirName) {
  const Bytes jpeg = ab::data::encode_jpeg(smooth_image(64, 64, 3, ab::test::seed()), 90);
  const std::string cut = ab::test::error_message<ab::Error>(
      [&] { ab::data::decode_image(std::span(jpeg).first(jpeg.size() / 2), "half.jpg"); });
  EXPECT_TRUE(contains(cut, "half.jpg: bad JPEG")) << cut;
  const Bytes png = ab::data::encode_png(random_image(16, 16, 3, ab::test::seed()));
  const std::string cut_png = ab::test::error_message<ab::Error>(
      [&] { ab::data::decode_image(std::span(png).first(png.size() / 2), "half.png"); });
  EXPECT_TRUE(contains(cut_png, "half.png: bad PNG")) << cut_png;
  const Bytes text{'h', 'e', 'l', 'l', 'o'};
  EXPECT_TRUE(contains(ab::test::error_message<ab::Error>([&] { ab::data::decode_image(text, "notes.jpg"); }),
                       "notes.jpg: neither JPEG nor PNG"));
}

TEST(Resize, HalvingAveragesEachTwoByTwoBlockAndGreyBecomesRgb) {
  const Image im = random_image(8, 6, 1, ab::test::seed());
  const Image half = ab::data::resize_bilinear(im, 4, 3, 3);
  ASSERT_EQ(half.channels, 3);
  for (std::int64_t y = 0; y < 4; ++y)
    for (std::int64_t x = 0; x < 3; ++x) {
      const auto px = [&](std::int64_t yy, std::int64_t xx) {
        return static_cast<double>(im.pixels[static_cast<std::size_t>(yy * 6 + xx)]);
      };
      const double mean =
          (px(2 * y, 2 * x) + px(2 * y, 2 * x + 1) + px(2 * y + 1, 2 * x) + px(2 * y + 1, 2 * x + 1)) / 4;
      for (std::int64_t c = 0; c < 3; ++c)
        EXPECT_NEAR(half.pixels[static_cast<std::size_t>((y * 3 + x) * 3 + c)], mean, 0.5) << y << "," << x << "," << c;
    }
  EXPECT_EQ(ab::data::resize_bilinear(im, 8, 6, 1).pixels, im.pixels) << "the same size is the identity";
}

// Two classes of valid images, and files that are not images.
struct Folder {
  TempDir tmp;
  fs::path root() const { return tmp.path() / "set"; }
  Folder() {
    const std::uint64_t seed = ab::test::seed();
    write_bytes(root() / "cat" / "a.png", ab::data::encode_png(random_image(10, 12, 3, seed)));
    write_bytes(root() / "cat" / "b.JPG", ab::data::encode_jpeg(smooth_image(10, 12, 3, seed + 1), 90));
    write_bytes(root() / "dog" / "c.jpeg", ab::data::encode_jpeg(smooth_image(9, 9, 1, seed + 2), 90));
    write_bytes(root() / "dog" / "broken.jpg", {'n', 'o', 't', ' ', 'a', ' ', 'j', 'p', 'e', 'g'});
    write_bytes(root() / "dog" / "empty.png", {});
    write_bytes(root() / "dog" / "README.txt", {'h', 'i'});
  }
};

TEST(ImageFolder, ClassesFromSubfoldersAndUnreadableFilesNamed) {
  const Folder f;
  const auto folder = ab::data::scan_image_folder(f.root(), false);
  EXPECT_EQ(folder.class_names, (std::vector<std::string>{"cat", "dog"}));
  ASSERT_EQ(folder.files.size(), 3u);
  EXPECT_EQ(folder.files[0].path.filename(), "a.png");
  EXPECT_EQ(folder.files[0].label, 0);
  EXPECT_EQ(folder.files[2].path.filename(), "c.jpeg");
  EXPECT_EQ(folder.files[2].label, 1);
  ASSERT_EQ(folder.unreadable.size(), 2u) << "README.txt is no image file and not counted";
  EXPECT_EQ(folder.unreadable[0].path.filename(), "broken.jpg");
  EXPECT_EQ(folder.unreadable[0].reason, "no JPEG or PNG signature");
  EXPECT_EQ(folder.unreadable[1].reason, "empty");
  const std::string refused = ab::test::error_message<ab::Error>([&] { ab::data::scan_image_folder(f.root(), true); });
  EXPECT_TRUE(contains(refused, "2 unreadable image files")) << refused;
  EXPECT_TRUE(contains(refused, "broken.jpg (no JPEG or PNG signature)")) << refused;
  EXPECT_TRUE(contains(refused, "empty.png (empty)")) << refused;
}

TEST(ImageFolder, FoldersWithoutClassesOrImagesAreRefused) {
  TempDir tmp;
  write_bytes(tmp.path() / "loose.png", ab::data::encode_png(random_image(4, 4, 1, ab::test::seed())));
  EXPECT_TRUE(contains(ab::test::error_message<ab::Error>([&] { ab::data::scan_image_folder(tmp.path(), false); }),
                       "no class subfolders"));
  write_bytes(tmp.path() / "a" / "bad.png", {'x'});
  const std::string none = ab::test::error_message<ab::Error>([&] { ab::data::scan_image_folder(tmp.path(), false); });
  EXPECT_TRUE(contains(none, "no readable")) << none;
  EXPECT_TRUE(contains(none, "bad.png")) << none;
  EXPECT_TRUE(
      contains(ab::test::error_message<ab::Error>([&] { ab::data::scan_image_folder(tmp.path() / "nope", false); }),
               "is not a folder"));
}

ab::data::ImageSet random_set(std::int64_t n, std::int64_t px, int classes, std::uint64_t seed) {
  ab::data::ImageSet s{n, px, px, 1, random_image(n, px, px, seed).pixels, {}, classes, "test"};
  for (std::int64_t i = 0; i < n; ++i)
    s.labels.push_back(static_cast<std::int32_t>(ab::mix64(seed, 1000 + i) % classes));
  s.labels[0] = classes - 1;  // every class folder is made, the last one included
  return s;
}

TEST(ImageFolder, WrittenSetsReadBackWithTheirLabels) {
  TempDir tmp;
  const auto set = random_set(25, 6, 12, ab::test::seed());
  EXPECT_EQ(ab::data::write_image_folder(set, tmp.path() / "out", 20, 90, 21), 21);
  const auto folder = ab::data::scan_image_folder(tmp.path() / "out", true);
  ASSERT_EQ(folder.class_names.size(), 12u);
  EXPECT_EQ(folder.class_names[2], "02") << "zero-padded, so sorting keeps label order";
  ASSERT_EQ(folder.files.size(), 21u);
  for (const auto& f : folder.files) {
    const auto index = std::stoll(f.path.stem().string());
    EXPECT_EQ(f.label, set.labels[static_cast<std::size_t>(index)]) << f.path;
  }
  std::ifstream in(folder.files[0].path, std::ios::binary);
  const Bytes bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  const Image im = ab::data::decode_image(bytes, folder.files[0].path.string());
  EXPECT_EQ(im.height, 20);
  EXPECT_EQ(im.width, 20);
  EXPECT_EQ(im.channels, 3);
}

// The command line's make-imagefolder on an IDX pair written here, and on a corrupt one.
TEST(MakeImageFolder, WritesTheSetAndNamesBadInput) {
  TempDir tmp;
  const auto set = random_set(9, 5, 3, ab::test::seed());
  Bytes images{0, 0, 8, 3, 0, 0, 0, 9, 0, 0, 0, 5, 0, 0, 0, 5};
  images.insert(images.end(), set.pixels.begin(), set.pixels.end());
  Bytes labels{0, 0, 8, 1, 0, 0, 0, 9};
  for (auto l : set.labels) labels.push_back(static_cast<std::uint8_t>(l));
  write_bytes(tmp.path() / "t10k-images-idx3-ubyte", images);
  write_bytes(tmp.path() / "t10k-labels-idx1-ubyte", labels);
  const auto ok = ab::test::accelbench({"data", "make-imagefolder", (tmp.path() / "t10k-images-idx3-ubyte").string(),
                                        (tmp.path() / "out").string(), "--size", "16"});
  ASSERT_EQ(ok.code, 0) << ok.output;
  EXPECT_TRUE(contains(ok.output, "wrote 9 images")) << ok.output;
  const auto folder = ab::data::scan_image_folder(tmp.path() / "out", true);
  EXPECT_EQ(folder.files.size(), 9u);
  EXPECT_EQ(folder.class_names.size(), 3u);

  images[0] = 0x42;
  write_bytes(tmp.path() / "bad-images-idx3-ubyte", images);
  const auto bad = ab::test::accelbench({"data", "make-imagefolder", (tmp.path() / "bad-images-idx3-ubyte").string(),
                                         (tmp.path() / "bad").string(), "--labels",
                                         (tmp.path() / "t10k-labels-idx1-ubyte").string()});
  EXPECT_EQ(bad.code, 1) << bad.output;
  EXPECT_TRUE(contains(bad.output, "not an IDX file")) << bad.output;
  const auto unknown = ab::test::accelbench({"data", "make-imagefolder", "imagenet", (tmp.path() / "x").string()});
  EXPECT_EQ(unknown.code, 2) << unknown.output;
  EXPECT_TRUE(contains(unknown.output, "fashion-mnist[:train|:test]")) << unknown.output;
}

}  // namespace
