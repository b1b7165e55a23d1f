// What a workload is written against: the harness's State, axes and point outcomes, named in the
// workloads' own namespace so that each workload reads as nvbench's would.
#pragma once

#include "harness/ranks.h"
#include "harness/workload.h"

namespace ab::workloads {

using harness::AxisKind;
using harness::AxisSpec;
using harness::CheckFailed;
using harness::Counts;
using harness::Diverged;
using harness::NotConverged;
using harness::on_all_ranks;
using harness::OptionSpec;
using harness::OptionValues;
using harness::Point;
using harness::ScenarioReport;
using harness::SkipPoint;
using harness::State;
using harness::Workload;
using harness::ZipGroup;

}  // namespace ab::workloads
