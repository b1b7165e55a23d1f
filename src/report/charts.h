// Internal to src/report: the chart builders. Each returns a Vega-Lite spec together with the table
// of every number it draws; points that were not measured, did not converge or are noisy appear in
// both, marked (docs/REPORTS.md lists which chart a workload gets and why).
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "report/model.h"

namespace ab::report::detail {

struct ChartInput {
  std::string workload;
  const std::vector<Point>& points;  // every point of the workload, every status, every run
  const AxisPlan& plan;
  bool multi_run = false;
};

// Lines need an x axis and few enough series with at least two points on average.
bool lines_fit(const ChartInput& in);

std::optional<Chart> throughput_chart(const ChartInput& in, const Metric& metric, const std::vector<Ceiling>& ceilings);
std::optional<Chart> per_point_chart(const ChartInput& in, const Metric& metric);  // no x axis fits
std::optional<Chart> latency_chart(const ChartInput& in);
std::optional<Chart> energy_chart(const ChartInput& in);
std::optional<Chart> precision_chart(const ChartInput& in, const Metric& metric);
std::optional<Chart> roofline_chart(const ChartInput& in, const std::vector<Ceiling>& ceilings);
std::optional<Chart> scaling_chart(const ChartInput& in, const Metric& metric);
// The study sections (studies.cpp): "Precision study" and "Batch-size study" with one sub-section per
// model; empty when the points hold no such comparison.
std::vector<Section> study_sections(const std::vector<Point>& all, const std::vector<Ceiling>& ceilings, bool multi_run);
// "Input pipeline against training" (feed.cpp): the pipeline workload's images/s by threads beside
// each training model's images/s per GPU; empty unless the points hold both.
std::vector<Section> feed_sections(const std::vector<Point>& all, bool multi_run);
// "Measured roofline" and "Suite character" (counter_charts.cpp) of the points whose hardware
// counters were read (metrics.counters.status ok); empty when none was.
std::vector<Section> counter_sections(const std::vector<Point>& all, const std::vector<Ceiling>& ceilings,
                                      bool multi_run);
// Power and host CPU over the run, from telemetry.json; empty without a trace.
std::vector<Block> telemetry_blocks(const Run& run);

// The load generator's points as MLPerf shows them: scenario, metric, value, VALID/INVALID and the
// latency percentiles (per query for multi-stream); none without a point that has a scenario block.
std::optional<Table> loadgen_table(const std::vector<Point>& points, const AxisPlan& plan, bool multi_run);
// A system name's merged runs side by side: started, status, points kept and each setting
// (command line, context) whose value differs between them; none for a run that merged nothing.
std::optional<Table> merged_runs_table(const Run& run);

// Shared by the builders: the shape legend of point quality, the ✕ layer of unmeasured points.
nlohmann::json quality_shape(const std::vector<std::string>& present);
std::string not_drawn_note(const std::vector<const Point*>& unmeasured, const std::string& where);
// Labels ({y, text}) of roofs within 5% of each other share one line of text, so none overprint.
nlohmann::json merge_close_labels(const nlohmann::json& labels);

}  // namespace ab::report::detail
