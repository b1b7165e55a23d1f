// An MLPerf training log (the mlperf_logging library's format), one line per event:
//   :::MLLOG {"namespace": "", "time_ms": 1700000000000, "event_type": "POINT_IN_TIME",
//             "key": "eval_accuracy", "value": 0.9213, "metadata": {"file": "...", "lineno": 12, "epoch_num": 3}}
// time_ms is the wall clock in ms since the Unix epoch; file and lineno name the source line that
// logged the event, as mllog's caller lookup does. Every line is flushed when written, so a run that
// stops early (interrupt, crash) keeps what it logged. docs/METHODOLOGY.md, "MLPerf training log".
#pragma once

#include <filesystem>
#include <fstream>
#include <source_location>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace ab::workloads::zoo {

class MlLog {
 public:
  MlLog() = default;  // logs nothing (a run without an artifacts folder)
  explicit MlLog(const std::filesystem::path& path);
  const std::filesystem::path& path() const { return path_; }

  // mllog's event(), start() and end(): POINT_IN_TIME, INTERVAL_START, INTERVAL_END.
  void event(const std::string& key, const nlohmann::json& value = nullptr, const nlohmann::json& metadata = {},
             std::source_location where = std::source_location::current());
  void start(const std::string& key, const nlohmann::json& value = nullptr, const nlohmann::json& metadata = {},
             std::source_location where = std::source_location::current());
  void end(const std::string& key, const nlohmann::json& value = nullptr, const nlohmann::json& metadata = {},
           std::source_location where = std::source_location::current());

 private:
  void write(const char* type, const std::string& key, const nlohmann::json& value, const nlohmann::json& metadata,
             const std::source_location& where);
  std::filesystem::path path_;
  std::ofstream out_;
};

// One line's JSON as Python's json.dumps writes it (", " and ": " separators, keys in the order
// given: namespace, time_ms, event_type, key, value, metadata), which log checkers compare against.
std::string mllog_line(double time_ms, const char* event_type, const std::string& key, const nlohmann::json& value,
                       const nlohmann::ordered_json& metadata);
// Parses a log's ":::MLLOG " lines into their JSON objects (other lines are skipped); for tests and checkers.
std::vector<nlohmann::json> read_mllog(const std::filesystem::path& path);

}  // namespace ab::workloads::zoo
