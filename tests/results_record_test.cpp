// The record type: exact round trips of what the runner and the importer write (every field, missing
// blocks, old records), what from_json refuses, and the derived figures.
#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <limits>
#include <string>

#include <gtest/gtest.h>

#include "core/error.h"
#include "results/results.h"

namespace ab::results {
namespace {
using nlohmann::json;

// A measured gemm point as the runner writes it: every block present.
json full_record() {
  return json::parse(R"({
    "schema_version": 1, "run_id": "20261129-135501-3f9a1c", "seq": 3, "workload": "gemm", "device": "cuda:0",
    "device_name": "NVIDIA H200", "params": {"precision": "bf16", "m": 8192, "n": 8192, "k": 8192, "trans": "NN"},
    "options": {"algo": "heuristic"}, "started_at": "2026-11-29T13:55:01.123Z", "status": "ok", "wall_s": 3.25,
    "counts": {"samples": 1.0, "flops": 1.099511627776e12, "bytes": 4.02653184e8, "ops_unit": "FLOP"},
    "check": {"passed": true, "rel_error": 0.001},
    "metrics": {"algorithm": "cublasLt", "scaling_efficiency": 0.93, "nested": {"list": [1, 2.5]}},
    "time": {"mode": "batch", "converged": true, "stop_reason": "noise below target", "iterations_per_sample": 4,
             "total_iterations": 400, "measured_s": 1.5, "window_start_s": 10.25, "window_end_s": 11.75, "count": 100,
             "median_s": 0.0015, "mean_s": 0.00151, "min_s": 0.0014, "max_s": 0.0017, "p90_s": 0.0016, "p99_s": 0.00169,
             "q1_s": 0.00148, "q3_s": 0.00153, "iqr_s": 5e-05, "stddev_s": 2e-05, "rel_spread": 0.004,
             "samples_s": [0.0015, 0.0014, 0.0017]},
    "rates": {"samples_per_s": 666.6666666666666, "tflops": 733.0077518506667, "gbps": 268.435456, "pct_of_ceiling": 81.5,
              "ceiling": {"key": "gemm.bf16", "value": 899.0, "unit": "TFLOP/s", "source": "run r seq 1"}, "primary": "tflops"},
    "telemetry": {"mean_power_w": 650.5, "energy_j": 975.75, "gpus": [{"mean_sm_clock_mhz": 1980.0}]},
    "context": {"host": {"hostname": "node1"}, "build": {"type": "Release"}}
  })");
}

TEST(ResultsRecord, EveryFieldRoundTripsExactly) {
  const json j = full_record();
  const Record r = from_json(j);
  EXPECT_EQ(to_json(r).dump(), j.dump());
  EXPECT_EQ(r.seq, 3);
  EXPECT_EQ(r.status, Status::ok);
  EXPECT_EQ(r.device_name, "NVIDIA H200");
  EXPECT_EQ(r.options["algo"], "heuristic");
  ASSERT_TRUE(r.counts && r.time && r.rates);
  EXPECT_EQ(r.counts->ops_unit, "FLOP");
  EXPECT_EQ(r.time->median_s, 0.0015);
  EXPECT_EQ(r.time->count, 100);
  EXPECT_EQ(r.time->converged, true);
  ASSERT_TRUE(r.time->samples_s);
  EXPECT_EQ(r.time->samples_s->size(), 3u);
  EXPECT_EQ(r.rates->primary_value(), r.rates->tflops);
  ASSERT_TRUE(r.rates->ceiling);
  EXPECT_EQ(r.rates->ceiling->key, "gemm.bf16");
  EXPECT_EQ(r.scaling_efficiency(), 0.93);
  EXPECT_EQ(r.metric("nested.list.1"), 2.5);
  EXPECT_EQ(r.metric("algorithm"), std::nullopt);  // not a number
  EXPECT_EQ(r.telemetry_number("gpus.0.mean_sm_clock_mhz"), 1980.0);
  EXPECT_EQ(r.telemetry_number("gpus.1.mean_sm_clock_mhz"), std::nullopt);
}

TEST(ResultsRecord, MissingOptionalBlocksStayMissing) {
  const json j = json::parse(R"({"schema_version": 1, "run_id": "r", "seq": 0, "workload": "gemm", "device": "cpu",
    "device_name": "cpu", "params": {"m": 4}, "started_at": "2026-11-29T13:55:01.123Z", "status": "skipped",
    "reason": "precision not on this device", "wall_s": 0.01, "context": {}})");
  const Record r = from_json(j);
  EXPECT_EQ(to_json(r).dump(), j.dump());
  EXPECT_EQ(r.status, Status::skipped);
  EXPECT_FALSE(r.ok());
  EXPECT_FALSE(r.counts || r.time || r.rates);
  EXPECT_TRUE(r.check.is_null() && r.metrics.is_null() && r.scenario.is_null() && r.telemetry.is_null());
  EXPECT_EQ(r.scaling_efficiency(), std::nullopt);
  for (const char* block : {"counts", "time", "rates", "check", "metrics", "scenario", "telemetry", "options"})
    EXPECT_FALSE(to_json(r).contains(block)) << block;
}

TEST(ResultsRecord, ImportedAndOldRecordsRoundTrip) {
  // `accelbench import`: no seq, device_name or started_at, a partial time block, extra top-level fields.
  const json imported = json::parse(R"({"schema_version": 1, "run_id": "r", "workload": "resnet50", "device": "external",
    "system": "DGX A100", "params": {"batch": 256}, "status": "ok", "external": true, "source": "MLPerf v3.0",
    "rates": {"samples_per_s": 2500.0}, "time": {"median_s": 0.1, "p99_s": 0.2}, "units": {"samples_per_s": "images/s"},
    "sources": {"samples_per_s": "MLPerf v3.0"}, "context": {"external": true}})");
  const Record r = from_json(imported);
  EXPECT_EQ(to_json(r).dump(), imported.dump());
  EXPECT_TRUE(r.external);
  EXPECT_EQ(r.system, "DGX A100");
  EXPECT_FALSE(r.seq);
  EXPECT_FALSE(r.time->p90_s);
  EXPECT_EQ(r.rates->primary, "");
  EXPECT_EQ(r.rates->primary_value(), std::nullopt);
  EXPECT_EQ(r.extra["units"]["samples_per_s"], "images/s");

  // Non-finite numbers were written as null: they read back as NaN and are written as null again;
  // an explicit "external": false and unknown fields stay as written.
  const json odd = json::parse(R"({"schema_version": 1, "run_id": "r", "seq": 1, "workload": "stream", "params": {},
    "status": "diverged", "reason": "loss is nan", "external": false, "future_field": [1, 2],
    "time": {"median_s": null, "samples_s": [0.5, null]}})");
  const Record o = from_json(odd);
  EXPECT_EQ(to_json(o).dump(), odd.dump());
  EXPECT_TRUE(std::isnan(o.time->median_s.value()));
  EXPECT_TRUE(std::isnan(o.time->samples_s->at(1)));
}

TEST(ResultsRecord, StoredRecordsReadBackAsTheSameRecord) {
  const auto dir = std::filesystem::temp_directory_path() / ("ab_record_test_" + std::to_string(::getpid()));
  std::filesystem::remove_all(dir);
  const json written = to_json(from_json(full_record()));
  {
    ResultStore store(dir, RunInfo{"20261129-135501-3f9a1c", "2026-11-29T13:55:01.123Z", "accelbench run gemm", json::object()});
    store.append(written);
    store.finish("complete");
    const auto from_file = read_jsonl(store.points_path());
    ASSERT_EQ(from_file.records.size(), 1u);
    EXPECT_EQ(to_json(from_json(from_file.records[0])).dump(), written.dump());
  }
  const auto from_db = load_points(dir / "runs" / "accelbench.db", "20261129-135501-3f9a1c");
  ASSERT_EQ(from_db.size(), 1u);
  EXPECT_EQ(to_json(from_json(from_db[0])).dump(), written.dump());
  std::filesystem::remove_all(dir);
}

TEST(ResultsRecord, OptionsAreWrittenOnlyWhenNonEmpty) {
  Record r;
  r.run_id = "r", r.workload = "gemm";
  EXPECT_FALSE(to_json(r).contains("options"));
  r.options = json::object();
  EXPECT_FALSE(to_json(r).contains("options"));
  r.options["tile"] = 128;
  EXPECT_EQ(to_json(r)["options"], json({{"tile", 128}}));
  EXPECT_EQ(to_json(r)["schema_version"], kSchemaVersion);
}

TEST(ResultsRecord, StatusesParseAndPrint) {
  for (const Status s : {Status::ok, Status::skipped, Status::oom, Status::diverged, Status::invalid, Status::error,
                         Status::interrupted, Status::timeout})
    EXPECT_EQ(parse_status(to_string(s)), s);
  EXPECT_EQ(to_string(Status::interrupted), "interrupted");
  EXPECT_EQ(to_string(Status::timeout), "timeout");
  try {
    parse_status("running");
    FAIL() << "accepted an unknown status";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("valid: ok, skipped, oom, diverged, invalid, error, interrupted, timeout"),
              std::string::npos)
        << e.what();
  }
}

TEST(ResultsRecord, FromJsonRefusesWhatIsNotARecord) {
  auto refuses = [](const json& j, const std::string& words) {
    try {
      from_json(j);
      ADD_FAILURE() << "accepted " << j.dump();
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(words), std::string::npos) << e.what();
    }
  };
  refuses(json::array(), "not an accelbench record");
  refuses({{"workload", "gemm"}, {"status", "ok"}}, "no integer schema_version");
  refuses({{"schema_version", kSchemaVersion + 1}, {"workload", "gemm"}, {"status", "ok"}}, "newer accelbench");
  refuses({{"schema_version", 1}, {"status", "ok"}}, "no string workload and status");
  refuses({{"schema_version", 1}, {"workload", "gemm"}, {"status", "fine"}}, "unknown status 'fine'");
  refuses({{"schema_version", 1}, {"workload", "gemm"}, {"status", "ok"}, {"params", json::array()}}, "params is not an object");
  refuses({{"schema_version", 1}, {"workload", "gemm"}, {"status", "ok"}, {"time", {{"median_s", "1 ms"}}}},
          "time.median_s is not a number");
  refuses({{"schema_version", 1}, {"workload", "gemm"}, {"status", "ok"}, {"time", {{"count", 1.5}}}}, "time.count is not an integer");
}

TEST(ResultsDerived, RatesFromCountsAndTheMedian) {
  const auto r = rates_from_counts({4, 1e6, 2e6, "FLOP"}, 0.002, "gemm.fp32");
  ASSERT_TRUE(r);
  EXPECT_DOUBLE_EQ(r->samples_per_s.value(), 2000.0);
  EXPECT_DOUBLE_EQ(r->tflops.value(), 1e6 / 0.002 / 1e12);
  EXPECT_DOUBLE_EQ(r->gbps.value(), 2e6 / 0.002 / 1e9);
  EXPECT_EQ(r->primary, "tflops");
  EXPECT_EQ(rates_from_counts({4, 1e6, 2e6, "FLOP"}, 0.002, "memory.bandwidth")->primary, "gbps");
  const auto copy = rates_from_counts({0, 0, 1e9, "FLOP"}, 0.5, "");
  EXPECT_FALSE(copy->samples_per_s || copy->tflops);
  EXPECT_EQ(copy->primary, "gbps");
  EXPECT_EQ(rates_from_counts({64, 0, 0, "FLOP"}, 0.5, "")->primary, "samples_per_s") << "images alone (pipeline)";
  EXPECT_FALSE(rates_from_counts({1, 1, 1, "FLOP"}, 0, ""));

  Rates mem = *rates_from_counts({0, 1e9, 3e9, "FLOP"}, 1.0, "memory.bandwidth");
  divide_by_ceiling(mem, {"memory.bandwidth", "GB/s", "this point", 4.0});
  EXPECT_DOUBLE_EQ(mem.pct_of_ceiling.value(), 75.0);  // judged by bandwidth, not arithmetic
  EXPECT_EQ(mem.ceiling->unit, "GB/s");
  EXPECT_EQ(ceiling_unit("gemm.int8", "OP"), "TOP/s");
  EXPECT_EQ(ceiling_unit("gemm.bf16", "FLOP"), "TFLOP/s");
  EXPECT_EQ(ceiling_unit("memory.bandwidth", "FLOP"), "GB/s");

  const Rates sc = scenario_rates(100, 2e10);
  EXPECT_EQ(sc.primary, "samples_per_s");
  EXPECT_DOUBLE_EQ(sc.tflops.value(), 2.0);
  EXPECT_FALSE(scenario_rates(100, 0).tflops);
}

TEST(ResultsDerived, ScalingEfficiencyAndArithmeticIntensity) {
  EXPECT_DOUBLE_EQ(scaling_efficiency(360, 4, 100).value(), 0.9);
  EXPECT_FALSE(scaling_efficiency(360, 4, 0));
  EXPECT_DOUBLE_EQ(arithmetic_intensity(8, 2).value(), 4.0);
  EXPECT_FALSE(arithmetic_intensity(8, 0));
  EXPECT_DOUBLE_EQ(arithmetic_intensity(0, 8).value(), 0.0);  // a copy: placed at no arithmetic
}

}  // namespace
}  // namespace ab::results
