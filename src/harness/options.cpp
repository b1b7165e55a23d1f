// A workload's options: its declared tuning knobs at their defaults or the values a run gives.
#include <algorithm>
#include <charconv>
#include <cmath>

#include "core/error.h"
#include "harness/suggest.h"
#include "harness/workload.h"

namespace ab::harness {
namespace {

std::string names_of(const std::vector<OptionSpec>& specs) {
  std::string out;
  for (const auto& o : specs) out += (out.empty() ? "" : ", ") + o.name;
  return out.empty() ? "none" : out;
}

void check_option_value(const OptionSpec& o, const std::string& v) {
  if (o.kind == AxisKind::integer) {
    std::int64_t i = 0;
    const auto [ptr, ec] = std::from_chars(v.data(), v.data() + v.size(), i);
    if (ec != std::errc() || ptr != v.data() + v.size())
      throw UsageError("'" + v + "' is not an integer (option " + o.name + ")");
  } else if (o.kind == AxisKind::real) {
    double d = 0;
    const auto [ptr, ec] = std::from_chars(v.data(), v.data() + v.size(), d);
    if (ec != std::errc() || ptr != v.data() + v.size() || !std::isfinite(d))
      throw UsageError("'" + v + "' is not a number (option " + o.name + ")");
  } else if (!o.choices.empty() && std::find(o.choices.begin(), o.choices.end(), v) == o.choices.end()) {
    std::string valid;
    for (const auto& c : o.choices) valid += (valid.empty() ? "" : ", ") + c;
    throw UsageError("unknown " + o.name + " '" + v + "'; valid: " + valid + did_you_mean(v, o.choices));
  }
}

}  // namespace

OptionValues resolve_options(const std::string& workload, const std::vector<OptionSpec>& specs,
                             const OptionValues& given) {
  for (const auto& [name, value] : given) {
    const bool known = std::any_of(specs.begin(), specs.end(), [&](const OptionSpec& o) { return o.name == name; });
    if (!known) {
      std::vector<std::string> names;
      for (const auto& o : specs) names.push_back(o.name);
      throw UsageError(workload + " has no option '" + name + "'; valid: " + names_of(specs) +
                       did_you_mean(name, names));
    }
  }
  OptionValues out;
  for (const OptionSpec& o : specs) {
    const auto it = given.find(o.name);
    const std::string& v = it == given.end() ? o.default_value : it->second;
    check_option_value(o, v);
    out[o.name] = v;
  }
  return out;
}

std::pair<std::string, std::string> parse_option_argument(const std::string& arg) {
  const auto eq = arg.find('=');
  if (eq == std::string::npos || eq == 0) throw UsageError("option '" + arg + "' must be name=value");
  return {arg.substr(0, eq), arg.substr(eq + 1)};
}

}  // namespace ab::harness
