// The accelbench subcommands. Each returns the process exit code: 0 ok, 1 failure, 2 usage error,
// 130 interrupted.
#pragma once

#include <string>
#include <vector>

#include "harness/session.h"
#include "report/report.h"

namespace ab::cli {

// `run`'s command line: the session's request (target, device, measurement settings, output,
// telemetry) and the sweep's axis overrides.
struct RunOptions : harness::RunRequest {
  std::vector<std::string> axes;
  std::vector<std::string> options;  // "name=value", a workload's tuning knobs (--option)
};

int sysinfo(bool json);
// Every workload's axes, options and defaults; `what`: "suites" (the bundled suites), one
// workload's name, or "" / "workloads" for all.
int list(bool json, const std::string& what);
int run(const RunOptions& options);
int results(const std::string& out_dir, const std::string& run_id, bool csv, const std::string& output_file,
            const std::string& fields, bool json = false);
int monitor(double interval_ms, double duration_s);
// An ONNX model's op histogram, parameters, FLOPs per sample, fused chains and unsupported ops.
int inspect(const std::string& file);

// Every workload's axis names in declaration order, for the summary's columns.
report::AxisOrder axis_order();

}  // namespace ab::cli
