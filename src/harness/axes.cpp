#include "harness/axes.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <limits>
#include <optional>
#include <set>
#include <sstream>
#include <string_view>

#include "core/error.h"
#include "harness/suggest.h"

namespace ab::harness {
namespace {

constexpr std::size_t kMaxAxisValues = 100000;

std::vector<std::string> split(const std::string& s, char sep) {
  std::vector<std::string> parts;
  std::string cur;
  std::istringstream in(s);
  while (std::getline(in, cur, sep)) parts.push_back(cur);
  if (!s.empty() && s.back() == sep) parts.emplace_back();
  return parts;
}

std::string trim(const std::string& s) {
  const auto b = s.find_first_not_of(" \t");
  if (b == std::string::npos) return "";
  return s.substr(b, s.find_last_not_of(" \t") - b + 1);
}

// Size suffixes on integer values (docs/METHODOLOGY.md, "Axis values"): k, M, G, T are powers of
// 1000 as in SI (and as the GB/s of the records); Ki, Mi, Gi, Ti powers of 1024 as in IEC; either
// may end in B, and B alone is 1. So 8G is 8000000000 and 64MiB 67108864; the record keeps the number.
std::optional<std::int64_t> size_multiplier(std::string_view suffix) {
  if (suffix.ends_with("B")) suffix.remove_suffix(1);
  if (suffix.empty()) return 1;
  static constexpr std::string_view kLetters = "kMGT";
  const bool iec = suffix.size() == 2 && suffix[1] == 'i';
  if (suffix.size() != (iec ? 2u : 1u)) return std::nullopt;
  const char letter = suffix[0] == 'K' ? 'k' : suffix[0];
  const auto power = kLetters.find(letter);
  if (power == std::string_view::npos) return std::nullopt;
  std::int64_t m = 1;
  for (std::size_t i = 0; i <= power; ++i) m *= iec ? 1024 : 1000;
  return m;
}

std::int64_t parse_int(const std::string& s, const std::string& context) {
  std::int64_t v = 0;
  const auto [ptr, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
  const std::string_view suffix(ptr, static_cast<std::size_t>(s.data() + s.size() - ptr));
  // A negative number takes no suffix (no size is negative; "-1k" is more likely a typo).
  const bool negative = !s.empty() && s.front() == '-';
  const std::optional<std::int64_t> multiplier =
      ec != std::errc() || (negative && !suffix.empty()) ? std::nullopt : size_multiplier(suffix);
  if (!multiplier)
    throw UsageError("'" + s + "' is not an integer (" + context +
                     "; a size may end in k, M, G, T (powers of 1000) or Ki, Mi, Gi, Ti (powers of 1024), with or "
                     "without B)");
  if (v > std::numeric_limits<std::int64_t>::max() / *multiplier)
    throw UsageError("'" + s + "' is too large (" + context + ")");
  return v * *multiplier;
}

// An integer axis's value as the plain number a workload parses ("64MiB" -> "67108864").
std::string normalized(const AxisSpec& axis, const std::string& v) {
  return axis.kind == AxisKind::integer ? std::to_string(parse_int(v, "axis " + axis.name)) : v;
}

std::vector<std::string> names_of(const std::vector<AxisSpec>& axes) {
  std::vector<std::string> names;
  for (const auto& a : axes) names.push_back(a.name);
  return names;
}

void check_value(const AxisSpec& axis, const std::string& v) {
  if (axis.kind == AxisKind::integer) {
    parse_int(v, "axis " + axis.name);
  } else if (axis.kind == AxisKind::real) {
    double d = 0;
    const auto [ptr, ec] = std::from_chars(v.data(), v.data() + v.size(), d);
    if (ec != std::errc() || ptr != v.data() + v.size() || !std::isfinite(d))
      throw UsageError("'" + v + "' is not a number (axis " + axis.name + ")");
  } else if (!axis.choices.empty() && std::find(axis.choices.begin(), axis.choices.end(), v) == axis.choices.end() &&
             std::none_of(axis.choices.begin(), axis.choices.end(), [&](const std::string& c) {
               return c.size() > 1 && c[0] == '*' && v.size() > c.size() - 1 && v.ends_with(c.substr(1));
             })) {
    std::string valid;
    for (const auto& c : axis.choices) valid += (valid.empty() ? "" : ", ") + c;
    throw UsageError("unknown " + axis.name + " '" + v + "'; valid: " + valid + did_you_mean(v, axis.choices));
  }
}

std::vector<std::string> expand_range(const std::string& item) {
  const auto parts = split(item, ':');
  if (parts.size() < 2 || parts.size() > 3)
    throw UsageError("malformed range '" + item + "'; expected start:stop[:step], step +N, *N or pow2");
  const std::int64_t start = parse_int(parts[0], "range start in '" + item + "'");
  const std::int64_t stop = parse_int(parts[1], "range stop in '" + item + "'");
  const std::string step = parts.size() == 3 ? parts[2] : "+1";
  if (start > stop) throw UsageError("empty range '" + item + "': start is after stop");
  bool multiply = false;
  std::int64_t factor = 1;
  if (step == "pow2" || step == "x2") {
    multiply = true;
    factor = 2;
  } else if (!step.empty() && (step[0] == '*' || step[0] == 'x')) {
    multiply = true;
    factor = parse_int(step.substr(1), "range step in '" + item + "'");
  } else {
    factor = parse_int(step[0] == '+' ? step.substr(1) : step, "range step in '" + item + "'");
  }
  if ((multiply && (factor < 2 || start < 1)) || (!multiply && factor < 1))
    throw UsageError("range '" + item + "' never advances; a multiplicative range needs start >= 1 and factor >= 2");
  std::vector<std::string> out;
  for (std::int64_t v = start; v <= stop; v = multiply ? v * factor : v + factor) {
    out.push_back(std::to_string(v));
    if (out.size() > kMaxAxisValues) throw UsageError("range '" + item + "' has too many values");
    if ((multiply && v > stop / factor) || (!multiply && v > stop - factor)) break;
  }
  return out;
}

const AxisSpec* find_axis(const std::vector<AxisSpec>& axes, const std::string& name) {
  for (const auto& a : axes)
    if (a.name == name) return &a;
  return nullptr;
}

const ZipGroup* find_group(const std::vector<ZipGroup>& groups, const std::string& name) {
  for (const auto& g : groups)
    if (std::find(g.names.begin(), g.names.end(), name) != g.names.end()) return &g;
  return nullptr;
}

// One dimension of the sweep: a lone axis or a zip group; rows of values for its names.
struct Dimension {
  std::vector<std::string> names;
  std::vector<std::vector<std::string>> rows;
};

std::vector<std::vector<std::string>> group_rows(const ZipGroup& g, const std::vector<AxisSpec>& axes,
                                                 const std::vector<std::string>& named, const std::string& text) {
  std::vector<std::vector<std::string>> rows;
  // Columns the user did not name take the axis's first default.
  std::vector<std::string> fill;
  for (const auto& n : g.names) fill.push_back(find_axis(axes, n)->defaults.at(0));
  for (const std::string& raw : split(text, ',')) {
    const std::string item = trim(raw);
    if (item.empty()) throw UsageError("empty value in '" + text + "'");
    if (item[0] == '@') {
      const auto t = g.tables.find(item.substr(1));
      if (t == g.tables.end()) {
        std::string valid;
        std::vector<std::string> names;
        for (const auto& [name, r] : g.tables) {
          valid += (valid.empty() ? "@" : ", @") + name;
          names.push_back("@" + name);
        }
        throw UsageError("unknown table '" + item + "'; valid: " + valid + did_you_mean(item, names));
      }
      rows.insert(rows.end(), t->second.begin(), t->second.end());
      continue;
    }
    if (item.find(':') != std::string::npos) {
      // A range for zipped axes sets every named column to each value: m,n,k=1024:8192:pow2.
      for (const auto& v : expand_range(item)) {
        std::vector<std::string> row = fill;
        for (const auto& name : named)
          row[static_cast<std::size_t>(std::find(g.names.begin(), g.names.end(), name) - g.names.begin())] = v;
        rows.push_back(row);
      }
      continue;
    }
    const auto fields = split(item, 'x');
    if (fields.size() != 1 && fields.size() != named.size())
      throw UsageError("value '" + item + "' for " + std::to_string(named.size()) +
                       " zipped axes needs one value or " + std::to_string(named.size()) + " joined by 'x'");
    std::vector<std::string> row = fill;
    for (std::size_t i = 0; i < named.size(); ++i) {
      const auto pos = std::find(g.names.begin(), g.names.end(), named[i]) - g.names.begin();
      row[static_cast<std::size_t>(pos)] =
          normalized(*find_axis(axes, named[i]), fields.size() == 1 ? fields[0] : fields[i]);
    }
    rows.push_back(row);
  }
  return rows;
}

// Columns of a zip group set one at a time can make rows that were distinct the same (m=64, n=64,
// k=64 on three square defaults: one point three times): refused rather than measured repeatedly.
void refuse_repeated_rows(const Dimension& d) {
  std::set<std::vector<std::string>> seen;
  for (const auto& row : d.rows) {
    if (seen.insert(row).second) continue;
    std::string names, values;
    for (std::size_t i = 0; i < d.names.size(); ++i) {
      names += (i ? "," : "") + d.names[i];
      values += (i ? "x" : "") + row[i];
    }
    throw UsageError("zipped axes " + names + " set one at a time give the point " + names + "=" + values +
                     " more than once; set them together (--axis " + names + "=VALUES)");
  }
}

}  // namespace

void refuse_conflicting_overrides(const std::vector<AxisOverride>& overrides) {
  std::map<std::string, std::string> set_by;
  for (const auto& o : overrides) {
    std::string text;
    for (const auto& n : o.names) text += (text.empty() ? "" : ",") + n;
    text += "=" + o.values;
    for (const auto& n : o.names) {
      const auto [it, added] = set_by.emplace(n, text);
      if (!added)
        throw UsageError("axis '" + n + "' is set twice ('" + it->second + "' and '" + text + "'): give it once");
    }
  }
}

const std::string& Point::at(const std::string& name) const {
  for (const auto& [n, v] : values)
    if (n == name) return v;
  throw Error("internal: point has no axis '" + name + "'");
}

std::string Point::label() const {
  std::string s;
  for (const auto& [n, v] : values) s += (s.empty() ? "" : " ") + n + "=" + v;
  return s;
}

std::string kind_name(AxisKind k) {
  switch (k) {
    case AxisKind::integer: return "integer";
    case AxisKind::real: return "number";
    case AxisKind::text: return "text";
  }
  return "?";
}

AxisOverride parse_axis_argument(const std::string& arg) {
  const auto eq = arg.find('=');
  if (eq == std::string::npos || eq == 0 || eq + 1 == arg.size())
    throw UsageError("malformed --axis '" + arg + "'; expected name=values, e.g. batch=1:256:pow2 or m,n,k=4096");
  AxisOverride o;
  for (const auto& n : split(arg.substr(0, eq), ',')) {
    if (trim(n).empty()) throw UsageError("empty axis name in '" + arg + "'");
    o.names.push_back(trim(n));
  }
  o.values = arg.substr(eq + 1);
  return o;
}

std::vector<std::string> expand_values(const std::string& text, AxisKind kind) {
  std::vector<std::string> out;
  for (const std::string& raw : split(text, ',')) {
    const std::string item = trim(raw);
    if (item.empty()) throw UsageError("empty value in '" + text + "'");
    if (kind == AxisKind::integer && item.find(':') != std::string::npos) {
      const auto r = expand_range(item);
      out.insert(out.end(), r.begin(), r.end());
    } else {
      out.push_back(item);
    }
  }
  return out;
}

std::vector<Point> build_sweep(const std::vector<AxisSpec>& axes, const std::vector<ZipGroup>& groups,
                               const std::vector<AxisOverride>& overrides) {
  std::string valid_names;
  for (const auto& a : axes) valid_names += (valid_names.empty() ? "" : ", ") + a.name;

  // Default dimensions in declaration order; a group takes the place of its first axis.
  std::vector<Dimension> dims;
  for (const auto& a : axes) {
    const ZipGroup* g = find_group(groups, a.name);
    if (g == nullptr) {
      dims.push_back({{a.name}, {}});
      for (const auto& v : a.defaults) dims.back().rows.push_back({v});
    } else if (g->names.front() == a.name) {
      Dimension d{g->names, {}};
      const std::size_t n_rows = find_axis(axes, a.name)->defaults.size();
      for (std::size_t r = 0; r < n_rows; ++r) {
        std::vector<std::string> row;
        for (const auto& n : g->names) row.push_back(find_axis(axes, n)->defaults.at(r));
        d.rows.push_back(row);
      }
      dims.push_back(d);
    }
  }

  std::vector<std::size_t> set_by_member;  // group dimensions whose columns overrides set one at a time
  for (const auto& o : overrides) {
    for (const auto& n : o.names)
      if (find_axis(axes, n) == nullptr)
        throw UsageError("unknown axis '" + n + "'; valid: " + valid_names + did_you_mean(n, names_of(axes)));
    const ZipGroup* g = find_group(groups, o.names.front());
    auto dim = std::find_if(dims.begin(), dims.end(), [&](const Dimension& d) {
      return std::find(d.names.begin(), d.names.end(), o.names.front()) != d.names.end();
    });
    if (g == nullptr) {
      if (o.names.size() != 1)
        throw UsageError("axes '" + o.values + "' cannot be zipped: only declared groups vary together");
      const AxisSpec& axis = *find_axis(axes, o.names.front());
      dim->rows.clear();
      for (const auto& v : expand_values(o.values, axis.kind)) dim->rows.push_back({normalized(axis, v)});
    } else {
      for (const auto& n : o.names)
        if (find_group(groups, n) != g)
          throw UsageError("axes in '--axis " + o.names.front() + ",...' belong to different groups");
      // A group of one axis (a table of named rows) takes its values as the rows themselves.
      const bool whole_group_from_text =
          o.names.size() == 1 && g->names.size() > 1 && o.values.find('@') == std::string::npos;
      if (whole_group_from_text) {
        // One axis of a group: replace that column in every existing row, product over the values.
        const auto col = static_cast<std::size_t>(std::find(g->names.begin(), g->names.end(), o.names[0]) -
                                                  g->names.begin());
        std::vector<std::vector<std::string>> rows;
        const AxisSpec& axis = *find_axis(axes, o.names[0]);
        for (const auto& v : expand_values(o.values, axis.kind))
          for (auto row : dim->rows) {
            row[col] = normalized(axis, v);
            rows.push_back(row);
          }
        dim->rows = rows;
        set_by_member.push_back(static_cast<std::size_t>(dim - dims.begin()));
      } else {
        dim->rows = group_rows(*g, axes, o.names, o.values);
      }
    }
    if (dim->rows.empty()) throw UsageError("axis '" + o.names.front() + "' has no values");
  }

  for (const std::size_t d : set_by_member) refuse_repeated_rows(dims[d]);

  // Validate every value once, then take the cartesian product (last dimension fastest).
  for (const auto& d : dims)
    for (const auto& row : d.rows)
      for (std::size_t i = 0; i < d.names.size(); ++i) check_value(*find_axis(axes, d.names[i]), row.at(i));

  std::vector<Point> points{Point{}};
  for (const auto& d : dims) {
    std::vector<Point> next;
    for (const auto& p : points)
      for (const auto& row : d.rows) {
        Point q = p;
        for (std::size_t i = 0; i < d.names.size(); ++i) q.values.emplace_back(d.names[i], row[i]);
        next.push_back(std::move(q));
      }
    points = std::move(next);
    if (points.size() > kMaxAxisValues) throw UsageError("sweep has more than 100000 points");
  }
  // Restore declaration order within each point.
  for (auto& p : points) {
    std::vector<std::pair<std::string, std::string>> ordered;
    for (const auto& a : axes) ordered.emplace_back(a.name, p.at(a.name));
    p.values = std::move(ordered);
  }
  return points;
}

}  // namespace ab::harness
