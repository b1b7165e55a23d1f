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

}  // namespace ab::results
