// Image folders: one subfolder per class.
#include <algorithm>
#include <cctype>
#include <cstring>
#include <fstream>
#include <sstream>

#include "core/error.h"
#include "data/data.h"

namespace ab::data {
namespace fs = std::filesystem;
namespace {

bool has_image_extension(const fs::path& p) {
  std::string ext = p.extension().string();
  std::transform(ext.begin(), ext.end(), ext.begin(),
                 [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  return ext == ".jpg" || ext == ".jpeg" || ext == ".png";
}

// Why `path` cannot be an image ("" when it starts like a JPEG or PNG): read at scan time so a bad
// file is named before any worker meets it.
std::string unreadable_reason(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return "cannot be opened";
  std::uint8_t head[8] = {};
  in.read(reinterpret_cast<char*>(head), sizeof head);
  const auto got = in.gcount();
  if (got >= 3 && head[0] == 0xFF && head[1] == 0xD8 && head[2] == 0xFF) return "";
  if (got == 8 && std::memcmp(head, "\x89PNG\r\n\x1a\n", 8) == 0) return "";
  return got == 0 ? "empty" : "no JPEG or PNG signature";
}

}  // namespace

std::string list_unreadable(const std::vector<UnreadableFile>& bad) {
  std::ostringstream s;
  const std::size_t shown = std::min<std::size_t>(bad.size(), 5);
  for (std::size_t i = 0; i < shown; ++i) s << (i ? "; " : "") << bad[i].path.string() << " (" << bad[i].reason << ")";
  if (bad.size() > shown) s << "; and " << bad.size() - shown << " more";
  return s.str();
}

ImageFolder scan_image_folder(const fs::path& root, bool refuse_unreadable) {
  if (!fs::is_directory(root)) throw Error("image folder " + root.string() + " is not a folder");
  ImageFolder f;
  f.root = root;
  for (const auto& e : fs::directory_iterator(root))
    if (e.is_directory()) f.class_names.push_back(e.path().filename().string());
  std::sort(f.class_names.begin(), f.class_names.end());
  if (f.class_names.empty()) throw Error(root.string() + " has no class subfolders (one folder per label expected)");
  for (std::size_t label = 0; label < f.class_names.size(); ++label) {
    std::vector<fs::path> paths;
    for (const auto& e : fs::recursive_directory_iterator(root / f.class_names[label]))
      if (e.is_regular_file() && has_image_extension(e.path())) paths.push_back(e.path());
    std::sort(paths.begin(), paths.end());
    for (auto& p : paths) {
      std::string why = unreadable_reason(p);
      if (why.empty()) f.files.push_back({std::move(p), static_cast<std::int32_t>(label)});
      else f.unreadable.push_back({std::move(p), std::move(why)});
    }
  }
  if (refuse_unreadable && !f.unreadable.empty())
    throw Error(root.string() + ": " + std::to_string(f.unreadable.size()) +
                " unreadable image files: " + list_unreadable(f.unreadable));
  if (f.files.empty())
    throw Error(root.string() + " holds no readable .jpg/.jpeg/.png files in its class folders" +
                (f.unreadable.empty() ? "" : " (unreadable: " + list_unreadable(f.unreadable) + ")"));
  return f;
}

std::int64_t write_image_folder(const ImageSet& set, const fs::path& root, std::int64_t size, int quality,
                                std::int64_t limit) {
  if (size < 1) throw UsageError("image size must be >= 1 px");
  if (quality < 1 || quality > 100) throw UsageError("JPEG quality must be 1..100");
  const std::int64_t n = limit < 0 ? set.count : std::min(limit, set.count);
  // Zero-padded class names so the sorted folder names give back the label ids.
  const std::size_t digits = std::to_string(std::max(set.classes - 1, 0)).size();
  const auto class_dir = [&](std::int32_t label) {
    std::string name = std::to_string(label);
    return root / (std::string(digits - std::min(digits, name.size()), '0') + name);
  };
  for (std::int32_t c = 0; c < set.classes; ++c) fs::create_directories(class_dir(c));
  for (std::int64_t i = 0; i < n; ++i) {
    const Image px = resize_bilinear(image_of(set, i), size, size, 3);
    const auto jpeg = encode_jpeg(px, quality);
    const fs::path path = class_dir(set.labels[static_cast<std::size_t>(i)]) / (std::to_string(i) + ".jpg");
    std::ofstream out(path, std::ios::binary);
    out.write(reinterpret_cast<const char*>(jpeg.data()), static_cast<std::streamsize>(jpeg.size()));
    if (!out) throw Error("cannot write " + path.string());
  }
  return n;
}

}  // namespace ab::data
