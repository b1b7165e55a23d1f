#include "workloads/models/mllog.h"

#include <chrono>
#include <cmath>
#include <sstream>

#include "core/error.h"

namespace ab::workloads::zoo {
namespace {

// Python's json.dumps with its default separators; nlohmann's dump for scalars (numbers round-trip).
template <typename Json>
void python_json(std::ostringstream& o, const Json& v) {
  if (v.is_object()) {
    o << '{';
    bool first = true;
    for (const auto& [k, item] : v.items()) {
      o << (first ? "" : ", ") << Json(k).dump() << ": ";
      python_json(o, item);
      first = false;
    }
    o << '}';
  } else if (v.is_array()) {
    o << '[';
    for (std::size_t i = 0; i < v.size(); ++i) {
      o << (i == 0 ? "" : ", ");
      python_json(o, v[i]);
    }
    o << ']';
  } else {
    o << v.dump();
  }
}

double wall_ms() {
  using namespace std::chrono;
  return static_cast<double>(duration_cast<milliseconds>(system_clock::now().time_since_epoch()).count());
}

}  // namespace

std::string mllog_line(double time_ms, const char* event_type, const std::string& key, const nlohmann::json& value,
                       const nlohmann::ordered_json& metadata) {
  std::ostringstream o;
  o << ":::MLLOG {\"namespace\": \"\", \"time_ms\": " << static_cast<long long>(std::llround(time_ms))
    << ", \"event_type\": \"" << event_type << "\", \"key\": " << nlohmann::json(key).dump() << ", \"value\": ";
  python_json(o, value);
  o << ", \"metadata\": ";
  python_json(o, metadata);
  o << "}";
  return o.str();
}

MlLog::MlLog(const std::filesystem::path& path) : path_(path) {
  if (path.has_parent_path()) std::filesystem::create_directories(path.parent_path());
  out_.open(path, std::ios::trunc);
  if (!out_) throw Error("cannot write the MLPerf log " + path.string());
}

void MlLog::write(const char* type, const std::string& key, const nlohmann::json& value, const nlohmann::json& metadata,
                  const std::source_location& where) {
  if (!out_.is_open()) return;
  // ordered_json keeps file and lineno first, as mllog writes them, then the caller's fields.
  nlohmann::ordered_json meta{{"file", std::filesystem::path(where.file_name()).filename().string()},
                              {"lineno", where.line()}};
  if (metadata.is_object())
    for (const auto& [k, v] : metadata.items()) meta[k] = v;
  out_ << mllog_line(wall_ms(), type, key, value, meta) << '\n';
  out_.flush();
}

void MlLog::event(const std::string& key, const nlohmann::json& value, const nlohmann::json& metadata,
                  std::source_location where) {
  write("POINT_IN_TIME", key, value, metadata, where);
}
void MlLog::start(const std::string& key, const nlohmann::json& value, const nlohmann::json& metadata,
                  std::source_location where) {
  write("INTERVAL_START", key, value, metadata, where);
}
void MlLog::end(const std::string& key, const nlohmann::json& value, const nlohmann::json& metadata,
                std::source_location where) {
  write("INTERVAL_END", key, value, metadata, where);
}

std::vector<nlohmann::json> read_mllog(const std::filesystem::path& path) {
  std::ifstream in(path);
  if (!in) throw Error("cannot read the MLPerf log " + path.string());
  std::vector<nlohmann::json> lines;
  const std::string prefix = ":::MLLOG ";
  for (std::string line; std::getline(in, line);)
    if (line.starts_with(prefix)) lines.push_back(nlohmann::json::parse(line.substr(prefix.size())));
  return lines;
}

}  // namespace ab::workloads::zoo
