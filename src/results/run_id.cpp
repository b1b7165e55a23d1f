#include <chrono>
#include <cstdio>
#include <ctime>
#include <random>
#include <string>

#include "core/error.h"
#include "results/results.h"

namespace ab::results {
namespace {

struct UtcTime {
  std::tm tm{};
  int millis = 0;
};

UtcTime utc_now() {
  using namespace std::chrono;
  const auto now = system_clock::now();
  const auto ms = duration_cast<milliseconds>(now.time_since_epoch()).count();
  const std::time_t secs = static_cast<std::time_t>(ms / 1000);
  UtcTime t;
  t.millis = static_cast<int>(ms % 1000);
  if (gmtime_r(&secs, &t.tm) == nullptr) throw Error("gmtime_r failed for the current time");
  return t;
}

}  // namespace

std::string utc_now_iso8601() {
  const UtcTime t = utc_now();
  char buf[96];  // room for any int the compiler imagines
  std::snprintf(buf, sizeof buf, "%04d-%02d-%02dT%02d:%02d:%02d.%03dZ", t.tm.tm_year + 1900, t.tm.tm_mon + 1,
                t.tm.tm_mday, t.tm.tm_hour, t.tm.tm_min, t.tm.tm_sec, t.millis);
  return buf;
}

std::string new_run_id() {
  const UtcTime t = utc_now();
  // 24 random bits keep ids of runs started in the same second (on other nodes too) apart.
  std::random_device rd;
  const unsigned suffix = rd() & 0xffffffu;
  char buf[96];
  std::snprintf(buf, sizeof buf, "%04d%02d%02d-%02d%02d%02d-%06x", t.tm.tm_year + 1900, t.tm.tm_mon + 1,
                t.tm.tm_mday, t.tm.tm_hour, t.tm.tm_min, t.tm.tm_sec, suffix);
  return buf;
}

std::optional<std::string> resolve_run_id(const std::vector<RunRow>& runs, const std::string& typed) {
  if (typed == "latest") {
    if (runs.empty()) throw UsageError("`latest`: the store holds no runs");
    return runs.front().run_id;  // list_runs is newest first
  }
  if (typed.empty()) return std::nullopt;
  std::vector<std::string> matches;
  for (const auto& r : runs) {
    if (r.run_id == typed) return typed;
    if (r.run_id.compare(0, typed.size(), typed) == 0) matches.push_back(r.run_id);
  }
  if (matches.empty()) return std::nullopt;
  if (matches.size() == 1) return matches.front();
  std::string named;
  constexpr std::size_t kNamed = 5;
  for (std::size_t i = 0; i < matches.size() && i < kNamed; ++i) named += (i ? ", " : "") + matches[i];
  throw UsageError("run id prefix '" + typed + "' matches " + std::to_string(matches.size()) + " runs (" + named +
                   (matches.size() > kNamed ? ", ..." : "") + "): give more of it");
}

}  // namespace ab::results
