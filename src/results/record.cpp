#include "results/record.h"

#include <array>
#include <cmath>
#include <limits>
#include <utility>

#include "core/error.h"

namespace ab::results {
using nlohmann::json;

namespace {

constexpr std::array<std::pair<Status, std::string_view>, 9> kStatuses = {{{Status::ok, "ok"},
                                                                           {Status::skipped, "skipped"},
                                                                           {Status::oom, "oom"},
                                                                           {Status::diverged, "diverged"},
                                                                           {Status::invalid, "invalid"},
                                                                           {Status::error, "error"},
                                                                           {Status::interrupted, "interrupted"},
                                                                           {Status::timeout, "timeout"},
                                                                           {Status::not_converged, "not_converged"}}};

// Reads one field of an object; a field of the wrong type is an error naming it.
class Reader {
 public:
  Reader(const json& obj, std::string where) : obj_(obj), where_(std::move(where)) {}

  const json* find(const char* key) const {
    const auto it = obj_.find(key);
    return it == obj_.end() ? nullptr : &*it;
  }
  [[noreturn]] void wrong(const char* key, const char* expected) const {
    throw Error(where_ + key + " is not " + expected + ": " + find(key)->dump());
  }
  void text(const char* key, std::string& out) const {
    if (const json* v = find(key)) {
      if (!v->is_string()) wrong(key, "a string");
      out = v->get<std::string>();
    }
  }
  void text(const char* key, std::optional<std::string>& out) const {
    if (find(key)) text(key, out.emplace());
  }
  void boolean(const char* key, std::optional<bool>& out) const {
    if (const json* v = find(key)) {
      if (!v->is_boolean()) wrong(key, "a boolean");
      out = v->get<bool>();
    }
  }
  void integer(const char* key, std::optional<std::int64_t>& out) const {
    if (const json* v = find(key)) {
      if (!v->is_number_integer()) wrong(key, "an integer");
      out = v->get<std::int64_t>();
    }
  }
  // null is how JSON writes a non-finite number.
  static double number_of(const json& v) {
    return v.is_null() ? std::numeric_limits<double>::quiet_NaN() : v.get<double>();
  }
  void number(const char* key, std::optional<double>& out) const {
    if (const json* v = find(key)) {
      if (!v->is_number() && !v->is_null()) wrong(key, "a number");
      out = number_of(*v);
    }
  }
  void number(const char* key, double& out) const {
    std::optional<double> v;
    number(key, v);
    if (v) out = *v;
  }
  void numbers(const char* key, std::optional<std::vector<double>>& out) const {
    if (const json* v = find(key)) {
      if (!v->is_array()) wrong(key, "an array");
      auto& xs = out.emplace();
      for (const auto& x : *v) {
        if (!x.is_number() && !x.is_null()) wrong(key, "an array of numbers");
        xs.push_back(number_of(x));
      }
    }
  }
  const json* object(const char* key) const {
    const json* v = find(key);
    if (v && !v->is_object()) wrong(key, "an object");
    return v;
  }

 private:
  const json& obj_;
  std::string where_;
};

template <class T>
void put(json& j, const char* key, const std::optional<T>& v) {
  if (v) j[key] = *v;
}
void put(json& j, const char* key, const std::string& v) {
  if (!v.empty()) j[key] = v;
}

json time_to_json(const TimeStats& t) {
  json j = json::object();
  put(j, "mode", t.mode), put(j, "converged", t.converged), put(j, "stop_reason", t.stop_reason);
  put(j, "iterations_per_sample", t.iterations_per_sample), put(j, "total_iterations", t.total_iterations);
  put(j, "measured_s", t.measured_s), put(j, "window_start_s", t.window_start_s), put(j, "window_end_s", t.window_end_s);
  put(j, "count", t.count), put(j, "median_s", t.median_s), put(j, "mean_s", t.mean_s), put(j, "min_s", t.min_s);
  put(j, "max_s", t.max_s), put(j, "p90_s", t.p90_s), put(j, "p99_s", t.p99_s), put(j, "q1_s", t.q1_s);
  put(j, "q3_s", t.q3_s), put(j, "iqr_s", t.iqr_s), put(j, "stddev_s", t.stddev_s), put(j, "rel_spread", t.rel_spread);
  put(j, "samples_s", t.samples_s);
  return j;
}

TimeStats time_from_json(const json& j) {
  const Reader in(j, "time.");
  TimeStats t;
  in.text("mode", t.mode), in.boolean("converged", t.converged), in.text("stop_reason", t.stop_reason);
  in.integer("iterations_per_sample", t.iterations_per_sample), in.integer("total_iterations", t.total_iterations);
  in.number("measured_s", t.measured_s), in.number("window_start_s", t.window_start_s), in.number("window_end_s", t.window_end_s);
  in.integer("count", t.count), in.number("median_s", t.median_s), in.number("mean_s", t.mean_s), in.number("min_s", t.min_s);
  in.number("max_s", t.max_s), in.number("p90_s", t.p90_s), in.number("p99_s", t.p99_s), in.number("q1_s", t.q1_s);
  in.number("q3_s", t.q3_s), in.number("iqr_s", t.iqr_s), in.number("stddev_s", t.stddev_s), in.number("rel_spread", t.rel_spread);
  in.numbers("samples_s", t.samples_s);
  return t;
}

json rates_to_json(const Rates& r) {
  json j = json::object();
  put(j, "samples_per_s", r.samples_per_s), put(j, "tflops", r.tflops), put(j, "gbps", r.gbps);
  put(j, "tokens_per_s", r.tokens_per_s), put(j, "pct_of_ceiling", r.pct_of_ceiling), put(j, "primary", r.primary);
  if (r.ceiling) j["ceiling"] = {{"key", r.ceiling->key}, {"value", r.ceiling->value}, {"unit", r.ceiling->unit}, {"source", r.ceiling->source}};
  return j;
}

Rates rates_from_json(const json& j) {
  const Reader in(j, "rates.");
  Rates r;
  in.number("samples_per_s", r.samples_per_s), in.number("tflops", r.tflops), in.number("gbps", r.gbps);
  in.number("tokens_per_s", r.tokens_per_s), in.number("pct_of_ceiling", r.pct_of_ceiling),
      in.text("primary", r.primary);
  if (const json* c = in.object("ceiling")) {
    const Reader cin(*c, "rates.ceiling.");
    CeilingRef& ref = r.ceiling.emplace();
    cin.text("key", ref.key), cin.text("unit", ref.unit), cin.text("source", ref.source), cin.number("value", ref.value);
  }
  return r;
}

json counts_to_json(const Counts& c) {
  json j = {{"samples", c.samples}, {"flops", c.flops}, {"bytes", c.bytes}, {"ops_unit", c.ops_unit}};
  if (c.tokens > 0) j["tokens"] = c.tokens;
  return j;
}

Counts counts_from_json(const json& j) {
  const Reader in(j, "counts.");
  Counts c;
  in.number("samples", c.samples), in.number("flops", c.flops), in.number("bytes", c.bytes), in.text("ops_unit", c.ops_unit);
  if (j.contains("tokens")) in.number("tokens", c.tokens);
  return c;
}

// Fields with a typed member; every other top-level field goes to Record::extra.
constexpr std::array<const char*, 23> kTyped = {
    "schema_version", "run_id",  "seq",      "workload",  "device",  "device_name", "started_at", "params",
    "options",        "status",  "reason",   "wall_s",    "counts",  "check",       "metrics",    "time",
    "rates",          "scenario", "telemetry", "context", "external", "system",     "source"};
constexpr std::array<std::pair<const char*, json Record::*>, 5> kFreeForm = {{{"check", &Record::check},
                                                                              {"metrics", &Record::metrics},
                                                                              {"scenario", &Record::scenario},
                                                                              {"telemetry", &Record::telemetry},
                                                                              {"context", &Record::context}}};

bool typed(const std::string& key) {
  for (const char* k : kTyped)
    if (key == k) return true;
  return false;
}

std::optional<double> finite(const json* v) {
  if (v == nullptr || !v->is_number()) return std::nullopt;
  const double d = v->get<double>();
  return std::isfinite(d) ? std::optional<double>(d) : std::nullopt;
}

}  // namespace

std::string_view to_string(Status s) {
  for (const auto& [status, name] : kStatuses)
    if (status == s) return name;
  return "error";
}

Status parse_status(std::string_view s) {
  std::string valid;
  for (const auto& [status, name] : kStatuses) {
    if (name == s) return status;
    valid += (valid.empty() ? "" : ", ") + std::string(name);
  }
  throw Error("unknown status '" + std::string(s) + "'; valid: " + valid);
}

std::optional<double> Rates::primary_value() const {
  if (primary == "tflops") return tflops;
  if (primary == "gbps") return gbps;
  if (primary == "samples_per_s") return samples_per_s;
  return std::nullopt;
}

const json* find_path(const json& j, std::string_view dotted) {
  const json* cur = &j;
  while (!dotted.empty()) {
    const auto dot = dotted.find('.');
    const std::string part(dotted.substr(0, dot));
    dotted = dot == std::string_view::npos ? std::string_view() : dotted.substr(dot + 1);
    if (cur->is_object()) {
      const auto it = cur->find(part);
      if (it == cur->end()) return nullptr;
      cur = &*it;
    } else if (cur->is_array() && !part.empty() && part.find_first_not_of("0123456789") == std::string::npos) {
      const std::size_t i = std::stoul(part);
      if (i >= cur->size()) return nullptr;
      cur = &(*cur)[i];
    } else {
      return nullptr;
    }
  }
  return cur;
}

namespace {
std::optional<double> finite(const std::optional<double>& v) {
  return v && std::isfinite(*v) ? v : std::nullopt;
}
}  // namespace

std::optional<double> Record::time_of(std::optional<double> TimeStats::*field) const {
  return time ? finite((*time).*field) : std::nullopt;
}
std::optional<double> Record::rate_of(std::optional<double> Rates::*field) const {
  return rates ? finite((*rates).*field) : std::nullopt;
}

std::optional<double> Record::metric(std::string_view dotted) const { return finite(find_path(metrics, dotted)); }
std::optional<double> Record::telemetry_number(std::string_view dotted) const { return finite(find_path(telemetry, dotted)); }

json to_json(const Record& r) {
  json j = r.extra.is_object() ? r.extra : json::object();
  j["schema_version"] = r.schema_version;
  j["run_id"] = r.run_id;
  put(j, "seq", r.seq);
  j["workload"] = r.workload;
  put(j, "device", r.device), put(j, "device_name", r.device_name), put(j, "system", r.system);
  j["params"] = r.params;
  if (r.options.is_object() && !r.options.empty()) j["options"] = r.options;
  put(j, "started_at", r.started_at);
  j["status"] = std::string(to_string(r.status));
  put(j, "reason", r.reason), put(j, "wall_s", r.wall_s);
  if (r.external) j["external"] = true;
  put(j, "source", r.source);
  if (r.counts) j["counts"] = counts_to_json(*r.counts);
  if (r.time) j["time"] = time_to_json(*r.time);
  if (r.rates) j["rates"] = rates_to_json(*r.rates);
  for (const auto& [key, member] : kFreeForm)
    if (!(r.*member).is_null()) j[key] = r.*member;
  return j;
}

Record from_json(const json& j) {
  if (!j.is_object()) throw Error(std::string("a JSON ") + j.type_name() + ", not an accelbench record (an object)");
  const Reader in(j, "");
  Record r;
  std::optional<std::int64_t> version;
  in.integer("schema_version", version);
  if (!version) throw Error("no integer schema_version: not an accelbench record");
  if (*version > kSchemaVersion)
    throw Error("written by a newer accelbench (schema " + std::to_string(*version) + " > " + std::to_string(kSchemaVersion) + ")");
  r.schema_version = static_cast<int>(*version);
  if (!in.find("workload") || !in.find("workload")->is_string() || !in.find("status") || !in.find("status")->is_string())
    throw Error("no string workload and status: not an accelbench record");
  in.text("workload", r.workload);
  r.status = parse_status(j["status"].get_ref<const std::string&>());
  in.text("run_id", r.run_id), in.integer("seq", r.seq);
  in.text("device", r.device), in.text("device_name", r.device_name), in.text("started_at", r.started_at);
  in.text("reason", r.reason), in.text("system", r.system), in.text("source", r.source);
  if (const json* p = in.object("params")) r.params = *p;
  if (const json* o = in.object("options")) r.options = *o;
  std::optional<double> wall;
  in.number("wall_s", wall), r.wall_s = wall;
  if (const json* e = in.find("external")) {
    if (!e->is_boolean()) in.wrong("external", "a boolean");
    r.external = e->get<bool>();
  }
  if (const json* c = in.object("counts")) r.counts = counts_from_json(*c);
  if (const json* t = in.object("time")) r.time = time_from_json(*t);
  if (const json* x = in.object("rates")) r.rates = rates_from_json(*x);
  for (const auto& [key, member] : kFreeForm)
    if (const json* v = in.find(key)) r.*member = *v;
  for (const auto& [k, v] : j.items())
    if (!typed(k) || (k == "external" && !r.external)) r.extra[k] = v;  // an explicit false stays as written
  return r;
}

}  // namespace ab::results
