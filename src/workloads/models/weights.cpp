#include "workloads/models/weights.h"

#include <bit>
#include <cstring>
#include <fstream>

#include <nlohmann/json.hpp>

#include "core/error.h"

namespace ab::workloads::zoo {
namespace {

constexpr char kMagic[8] = {'A', 'B', 'W', 'E', 'I', 'G', 'H', 'T'};
constexpr int kFormat = 1;
static_assert(std::endian::native == std::endian::little, "weights files are written little-endian as in memory");

}  // namespace

void save_weights(const std::filesystem::path& path, const WeightsFile& weights) {
  nlohmann::json tensors = nlohmann::json::array();
  for (const auto& [name, values] : weights.values) tensors.push_back({{"name", name}, {"count", values.size()}});
  const std::string header =
      nlohmann::json{{"format", kFormat}, {"model", weights.model}, {"dtype", "f32"}, {"tensors", tensors}}.dump();
  if (path.has_parent_path()) std::filesystem::create_directories(path.parent_path());
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  if (!out) throw Error("cannot write weights to " + path.string());
  const std::uint64_t length = header.size();
  out.write(kMagic, sizeof kMagic);
  out.write(reinterpret_cast<const char*>(&length), sizeof length);
  out.write(header.data(), static_cast<std::streamsize>(header.size()));
  std::vector<float> buffer;
  for (const auto& [name, values] : weights.values) {
    buffer.assign(values.begin(), values.end());
    out.write(reinterpret_cast<const char*>(buffer.data()), static_cast<std::streamsize>(buffer.size() * 4));
  }
  if (!out) throw Error("cannot write weights to " + path.string() + " (disk full?)");
}

WeightsFile load_weights(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw Error("cannot open weights file " + path.string());
  const std::string what = "weights file " + path.string();
  char magic[sizeof kMagic] = {};
  std::uint64_t length = 0;
  in.read(magic, sizeof magic);
  in.read(reinterpret_cast<char*>(&length), sizeof length);
  if (!in || std::memcmp(magic, kMagic, sizeof magic) != 0)
    throw Error(what + " is not an accelbench weights file (no ABWEIGHT header)");
  if (length > (std::uint64_t{1} << 30)) throw Error(what + ": a header of " + std::to_string(length) + " bytes");
  std::string header(length, '\0');
  in.read(header.data(), static_cast<std::streamsize>(length));
  if (!in) throw Error(what + " is truncated inside its header");
  nlohmann::json h;
  try {
    h = nlohmann::json::parse(header);
  } catch (const nlohmann::json::exception& e) {
    throw Error(what + ": its header is not JSON (" + e.what() + ")");
  }
  if (h.value("format", 0) != kFormat || h.value("dtype", "") != "f32" || !h.contains("tensors"))
    throw Error(what + ": format " + h.value("format", nlohmann::json()).dump() + ", dtype " + h.value("dtype", "?") +
                " (format 1, f32 expected)");
  WeightsFile w;
  w.model = h.value("model", "");
  std::vector<float> buffer;
  for (const auto& t : h["tensors"]) {
    const std::string name = t.at("name").get<std::string>();
    const auto count = t.at("count").get<std::uint64_t>();
    buffer.resize(count);
    in.read(reinterpret_cast<char*>(buffer.data()), static_cast<std::streamsize>(count * 4));
    if (!in) throw Error(what + " is truncated in tensor " + name);
    w.values[name].assign(buffer.begin(), buffer.end());
  }
  if (in.peek() != std::char_traits<char>::eof()) throw Error(what + ": bytes after its last tensor");
  return w;
}

}  // namespace ab::workloads::zoo
