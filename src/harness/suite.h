// Suite files: a YAML list of workloads with axis overrides and measurement settings, run as one
// run. Errors name the file and line.
#pragma once

#include <filesystem>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "harness/axes.h"
#include "harness/workload.h"

namespace ab::harness {

struct SuiteStep {
  std::string workload;
  std::vector<AxisOverride> overrides;
  OptionValues options;  // the step's `options:` block, checked against the workload's
  int line = 0;
};

struct Suite {
  std::string name, description;
  std::optional<double> min_time_s, max_noise_pct, timeout_s, warmup_s;
  std::optional<std::string> mode;
  std::optional<std::string> counters;            // hardware counters for every step: memory, compute, all (or off)
  std::map<std::string, std::string> setting_at;  // setting name -> "FILE:LINE", for errors found later
  std::vector<SuiteStep> steps;
};

// Throws UsageError "FILE:LINE: reason" for malformed YAML, a value of the wrong type, a key given
// twice in one mapping, unknown workloads, axes, options or settings.
Suite load_suite(const std::filesystem::path& file, const Registry& registry);
bool looks_like_suite(const std::string& name);  // ends in .yaml or .yml

// The bundled suites (docs/METHODOLOGY.md, "Suites"), looked for in order in: $ACCELBENCH_SUITES;
// share/accelbench/suites beside the folder of the running binary (an installed or unpacked
// package, wherever it was put); the install prefix the build was configured for; the source tree
// it was built from. A name found in an earlier folder hides a later folder's file.
std::vector<std::filesystem::path> suite_dirs();
struct BundledSuite {
  std::string name, description;  // description: the file's, "" where it has none or cannot be read
  std::filesystem::path path;
};
std::vector<BundledSuite> bundled_suites();  // by name
// The bundled suite named "quick" or "quick.yaml"; nullopt where none is.
std::optional<std::filesystem::path> find_bundled_suite(const std::string& name);

}  // namespace ab::harness
