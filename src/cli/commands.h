// The accelbench subcommands. Each returns the process exit code: 0 ok, 1 failure, 2 usage error,
// 130 interrupted.
#pragma once

#include <string>
#include <vector>

namespace ab::cli {

struct RunOptions {
  std::string target;  // workload name or suite file
  std::string device;  // empty = best present
  std::vector<std::string> axes;
  std::vector<std::string> options;  // "name=value", a workload's tuning knobs (--option)
  double min_time_s = -1, max_noise_pct = -1, timeout_s = -1, warmup_s = -1;  // < 0: default or suite's
  std::string mode;
  std::string out_dir = ".";
  bool telemetry_trace = false;
  double telemetry_period_ms = 20;
  bool no_gpu_telemetry = false;
  bool quiet = false;
  std::string command_line;
};

int sysinfo(bool json);
int list(bool json);
int run(const RunOptions& options);
int results(const std::string& out_dir, const std::string& run_id, bool csv, const std::string& output_file);
int monitor(double interval_ms, double duration_s);

}  // namespace ab::cli
