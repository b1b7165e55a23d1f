// Axes and sweeps: a workload declares named parameter lists; the sweep is their cartesian
// product, with zipped groups (m,n,k) varying together. Values are kept as text and parsed on use.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

namespace ab::harness {

enum class AxisKind { integer, real, text };

struct AxisSpec {
  std::string name;
  AxisKind kind = AxisKind::text;
  std::vector<std::string> defaults;  // the values swept when the user names none
  std::vector<std::string> choices;   // allowed values for text axes; empty = any; "*.onnx": any value so ending
  std::string help;
};

// Axes that vary together; `tables` are named row sets a user selects with `@name`.
struct ZipGroup {
  std::vector<std::string> names;
  std::map<std::string, std::vector<std::vector<std::string>>> tables;
};

// One point of a sweep: axis name -> value, in the workload's axis order.
struct Point {
  std::vector<std::pair<std::string, std::string>> values;
  const std::string& at(const std::string& name) const;  // throws Error if absent
  std::string label() const;                              // "precision=bf16 m=8192 ..."
};

// A user's override: `names` (one axis, or several of one zip group) and the raw value text.
struct AxisOverride {
  std::vector<std::string> names;
  std::string values;
};
AxisOverride parse_axis_argument(const std::string& arg);  // "m,n,k=4096" -> {{m,n,k}, "4096"}
// Overrides from one source (the command line, or one suite step) that name an axis twice are a
// conflict: throws UsageError naming both. (A command line's override of a suite's is not.)
void refuse_conflicting_overrides(const std::vector<AxisOverride>& overrides);

// Expands one value list: "1,2,8", ranges "1:256:pow2" (also "start:stop", ":+N", ":*N").
std::vector<std::string> expand_values(const std::string& text, AxisKind kind);

// The sweep for these axes and groups with the overrides applied; throws UsageError for unknown
// axes (listing the valid ones), values outside `choices`, malformed numbers or ranges.
std::vector<Point> build_sweep(const std::vector<AxisSpec>& axes, const std::vector<ZipGroup>& groups,
                               const std::vector<AxisOverride>& overrides);

std::string kind_name(AxisKind k);

}  // namespace ab::harness
