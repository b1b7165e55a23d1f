// Chosen fields of result records, named by dotted paths into the record's JSON: "time.median_s",
// "metrics.fusion.fused_shapes", "telemetry.gpus.0.mean_sm_clock_mhz" (a number indexes a list).
// `accelbench results --fields` prints them; any field a workload writes can be named.
#pragma once

#include <ostream>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

namespace ab::results {

// The value at `dotted_path` in `record`, or nullptr where the record has no such path.
const nlohmann::json* find_field(const nlohmann::json& record, std::string_view dotted_path);

// "a.b,c.d" split at the commas; an empty path (",," or a trailing comma) is an ab::UsageError.
std::vector<std::string> split_field_list(std::string_view comma_separated);

// One row per record, one column per path, under a header row of the paths: aligned text, or
// CSV (RFC 4180 quoting) when `csv`. Strings print bare, numbers in their shortest round-trip
// form (to 6 significant digits in the text table), objects and lists as compact JSON, a path
// missing in a record as an empty cell. A path
// missing in every record is an ab::UsageError naming it (a typo, not a sparse field); nothing is
// written then.
void write_fields(std::ostream& out, const std::vector<nlohmann::json>& records, const std::vector<std::string>& paths,
                  bool csv);

}  // namespace ab::results
