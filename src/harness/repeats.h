// MLPerf's olympic mean of the time to train over seeds, derived once by the harness: the records
// of one run that differ only in their `seed` axis form a group, and each record of a group from
// its third on gets metrics.time_to_train_olympic over the group so far (so the last seed's record
// holds the figure over all of them). docs/METHODOLOGY.md, "Time to train".
#pragma once

#include <map>
#include <string>
#include <vector>

#include "harness/workload.h"
#include "results/record.h"

namespace ab::harness {

class RepeatTracker {
 public:
  // Reads metrics.time_to_train of a point with a seed axis (others are left alone): an ok
  // record's time_to_train_s, or +infinity for a not_converged or diverged one; interrupted and
  // failed points take no part.
  void add(const Workload& workload, const Point& point, const OptionValues& options, results::Record& record);

 private:
  std::map<std::string, std::vector<double>> times_s_;  // by everything but the seed
};

}  // namespace ab::harness
