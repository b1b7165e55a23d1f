// Tests for the conv micro workload: its shape tables, the FLOP and byte counts against hand
// counts, the host-side check against the reference kernels, the CPU run's records and the refusal
// of bad shapes; on a GPU (skipped without one) every pass and precision against float64.
#include <algorithm>
#include <atomic>
#include <set>
#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "test_support.h"

#include "backend/backend.h"
#include "backend/ref/ref.h"
#include "core/tensor.h"
#include "harness/axes.h"
#include "harness/runner.h"
#include "nn/kernels.h"
#include "workloads/micro/conv_check.h"
#include "workloads/micro/conv_shapes.h"
#include "workloads/registry.h"

namespace ab::workloads::micro {
namespace {

using harness::AxisOverride;
using harness::parse_axis_argument;
using nlohmann::json;

bool contains(const std::string& haystack, const std::string& needle) {
  return haystack.find(needle) != std::string::npos;
}

std::vector<harness::PlanEntry> conv_plan(const std::string& kind, const std::vector<std::string>& axis_args) {
  std::vector<AxisOverride> overrides;
  for (const auto& a : axis_args) overrides.push_back(parse_axis_argument(a));
  return harness::plan_for(find_workload("conv"), kind, overrides);
}

std::vector<json> run_conv(const std::string& device, const std::vector<std::string>& axis_args) {
  auto be = backend::make_backend(device);
  const auto plan = conv_plan(be->info().kind, axis_args);
  std::vector<json> records;
  harness::RunnerHooks hooks;
  hooks.sink = [&records](const json& r) { records.push_back(r); };
  measure::Settings fast;
  fast.min_time_s = 0.01;
  fast.warmup_s = 0;
  fast.timeout_s = 10;
  fast.max_noise_pct = 5;
  fast.target_sample_s = 1e-3;
  harness::Runner runner(*be, fast, json::object(), "run-conv", hooks, nullptr);
  const std::atomic<bool> cancel{false};
  runner.run(plan, cancel);
  return records;
}

ConvShape shape_of(const std::string& name) {
  const auto s = find_conv_shape(name);
  EXPECT_TRUE(s.has_value()) << name;
  return s.value_or(ConvShape{});
}

// ---------------------------------------------------------------------------------------------
// Tables and counts

TEST(ConvShapes, TablesHoldDeepBenchsSetsAndResNet50AsValidNamedRows) {
  const auto& tables = conv_tables();
  EXPECT_EQ(tables.at("deepbench-train").size(), 94u);
  EXPECT_EQ(tables.at("deepbench-infer-server").size(), 107u);
  EXPECT_EQ(tables.at("deepbench-infer-device").size(), 16u);
  EXPECT_EQ(tables.at("resnet50").size(), 23u);
  std::set<std::string> names;
  for (const auto& [table, rows] : tables)
    for (const NamedConvShape& row : rows) {
      SCOPED_TRACE(row.name);
      EXPECT_NO_THROW(check_conv_shape(row.shape));
      EXPECT_TRUE(names.insert(row.name).second) << "row names are unique";
      EXPECT_EQ(row.name.rfind(table + ".", 0), 0u);
      EXPECT_FALSE(contains(row.name, "x")) << "the axis parser splits values on 'x'";
      ASSERT_TRUE(find_conv_shape(row.name).has_value());
      EXPECT_EQ(find_conv_shape(row.name)->k, row.shape.k);
    }
  for (const NamedConvShape& row : tables.at("resnet50")) EXPECT_EQ(row.shape.n, 32) << row.name;
  EXPECT_FALSE(find_conv_shape("resnet50.nope").has_value());
  EXPECT_FALSE(find_conv_shape("nope.1").has_value());
  EXPECT_FALSE(find_conv_shape("resnet50").has_value());

  // DeepBench's columns are (w, h, c, n, k, s, r, pad_w, pad_h, stride_w, stride_h): its first
  // training row's output (341 x 79) is the input of its fifth.
  const ConvShape first = shape_of("deepbench-train.1"), fifth = shape_of("deepbench-train.5");
  EXPECT_EQ(first.n, 4);
  EXPECT_EQ(first.c, 1);
  EXPECT_EQ(first.h, 161);
  EXPECT_EQ(first.w, 700);
  EXPECT_EQ(first.r, 5);
  EXPECT_EQ(first.s, 20);
  EXPECT_EQ(first.p(), fifth.h);
  EXPECT_EQ(first.q(), fifth.w);
  // The one row with different strides and padding per dimension.
  const ConvShape device = shape_of("deepbench-infer-device.1");
  EXPECT_EQ(device.stride_h, 2);
  EXPECT_EQ(device.stride_w, 8);
  EXPECT_EQ(device.pad_h, 8);
  EXPECT_EQ(device.p(), (40 + 16 - 5) / 2 + 1);
  EXPECT_EQ(device.q(), (151 + 16 - 20) / 8 + 1);
  EXPECT_EQ(shape_of("resnet50.res5.out").p(), 7);
  EXPECT_EQ(shape_of("resnet50.res3.conv3-stride2").q(), 28);
}

TEST(ConvShapes, FlopsAndElementsAgainstHandCounts) {
  const ConvShape tiny{2, 8, 12, 12, 16, 3, 3, 1, 1, 1, 1};  // same padding: P = Q = 12
  EXPECT_EQ(conv_flops(tiny), 663552);                       // 2 * 2*16*12*12 * 8*3*3
  const ConvElements e = conv_elements(tiny);
  EXPECT_EQ(e.x, 2304);  // 2*8*12*12
  EXPECT_EQ(e.w, 1152);  // 16*8*3*3
  EXPECT_EQ(e.y, 4608);  // 2*16*12*12
  // ResNet-50's stem: 118,013,952 multiply-adds per 224 x 224 image (112*112*64 outputs of 3*7*7).
  EXPECT_EQ(conv_flops(shape_of("resnet50.conv1")), 2 * 32 * std::int64_t{118013952});
  // Stride 2 and no padding: P = (9 - 1) / 2 + 1 = 5.
  EXPECT_EQ(conv_flops(ConvShape{1, 4, 9, 9, 2, 1, 1, 0, 0, 2, 2}), 2 * 2 * 5 * 5 * 4);
}

TEST(ConvShapes, BadShapesAreRefusedNamingTheField) {
  const ConvShape ok{2, 8, 12, 12, 16, 3, 3, 1, 1, 1, 1};
  auto with = [&](auto change) {
    ConvShape s = ok;
    change(s);
    return test::usage_error([&] { check_conv_shape(s); });
  };
  EXPECT_TRUE(contains(with([](ConvShape& s) { s.n = -1; }), "n >= 1")) << with([](ConvShape& s) { s.n = -1; });
  EXPECT_TRUE(contains(with([](ConvShape& s) { s.k = 0; }), "k >= 1"));
  EXPECT_TRUE(contains(with([](ConvShape& s) { s.pad_w = -2; }), "padding >= 0"));
  EXPECT_TRUE(contains(with([](ConvShape& s) { s.stride_h = 0; }), "strides >= 1"));
  const std::string no_output = with([](ConvShape& s) { s.h = 2, s.r = 5, s.pad_h = 1; });
  EXPECT_TRUE(contains(no_output, "P or Q <= 0")) << no_output;
  EXPECT_TRUE(contains(test::usage_error([] {
                         conv_flops(ConvShape{1 << 30, 1 << 30, 1 << 20, 1 << 20, 1 << 20, 1, 1, 0, 0, 1, 1});
                       }),
                       "overflows 64 bits"));
}

// ---------------------------------------------------------------------------------------------
// The host check against the reference kernels (two independent float64 implementations)

TEST(ConvCheck, EveryPassAgreesWithTheReferenceKernelsAndCatchesAWrongEntry) {
  const ConvShape s{3, 3, 9, 11, 4, 3, 3, 1, 2, 2, 3};  // different strides and padding per dimension
  auto ref = nn::make_ref_kernels();
  const std::uint64_t seed = test::seed();
  auto make = [&](const Shape& shape, std::vector<double>& values, std::vector<Buffer>& keep, std::uint64_t salt) {
    const Tensor d = Tensor::describe(DType::f64, shape, Layout::nhwc);
    keep.emplace_back(ref->allocator(), d.size_bytes());
    const Tensor t = keep.back().view(d);
    values.resize(static_cast<std::size_t>(t.numel()));
    for (std::size_t i = 0; i < values.size(); ++i) values[i] = uniform(seed + salt, i, -1, 1);
    write_host(t, values);
    return t;
  };
  nn::Conv2dDesc d;
  d.stride_h = s.stride_h, d.stride_w = s.stride_w, d.pad_h = s.pad_h, d.pad_w = s.pad_w;
  for (const ConvPassKind pass : {ConvPassKind::forward, ConvPassKind::backward_data, ConvPassKind::backward_filter}) {
    SCOPED_TRACE(static_cast<int>(pass));
    std::vector<Buffer> keep;
    ConvHostValues v;
    const Tensor x = make(Shape{s.n, s.c, s.h, s.w}, v.x, keep, 1);
    const Tensor w = make(Shape{s.k, s.c, s.r, s.s}, v.w, keep, 2);
    const Tensor y = make(Shape{s.n, s.k, s.p(), s.q()}, v.y, keep, 3);
    if (pass == ConvPassKind::forward) ref->conv2d_forward(d, x, w, y, {});
    if (pass == ConvPassKind::backward_data) ref->conv2d_backward_data(d, y, w, x, false, {});
    if (pass == ConvPassKind::backward_filter) ref->conv2d_backward_filter(d, x, y, w, {});
    v = {read_host(x), read_host(w), read_host(y), {}};
    const ConvCheckSample whole = conv_check_sample(pass, s, v, 1 << 20);
    EXPECT_TRUE(whole.whole);
    const ConvElements e = conv_elements(s);
    EXPECT_EQ(static_cast<std::int64_t>(whole.got.size()), pass == ConvPassKind::forward         ? e.y
                                                           : pass == ConvPassKind::backward_data ? e.x
                                                                                                 : e.w);
    EXPECT_LE(backend::ref::rel_error(whole.got, whole.want), 1e-12);
    const ConvCheckSample spread = conv_check_sample(pass, s, v, 0);
    EXPECT_FALSE(spread.whole);
    EXPECT_EQ(spread.got.size(), 81u);  // {first, middle, last} of four dims of size >= 3
    EXPECT_LE(backend::ref::rel_error(spread.got, spread.want), 1e-12);
    // One wrong entry (the last, which the spread includes) is seen by both.
    std::vector<double>& out = pass == ConvPassKind::forward ? v.y : pass == ConvPassKind::backward_data ? v.x : v.w;
    out.back() += 1.0;
    for (const std::int64_t limit : {std::int64_t{1} << 20, std::int64_t{0}}) {
      const ConvCheckSample bad = conv_check_sample(pass, s, v, limit);
      EXPECT_GT(backend::ref::rel_error(bad.got, bad.want), conv_tolerance("bf16"));
    }
  }
}

TEST(ConvCheck, E4m3QuantizationScalesToTheLargestValueAndReturnsTheInverse) {
  std::vector<double> v{0.5, -2.0, 1.0};
  const double descale = quantize_e4m3_per_tensor(v);
  EXPECT_DOUBLE_EQ(descale, 2.0 / 448.0);
  EXPECT_DOUBLE_EQ(v[1], -448.0);
  EXPECT_DOUBLE_EQ(v[2], 224.0);
  std::vector<double> zeros{0.0, 0.0};
  EXPECT_DOUBLE_EQ(quantize_e4m3_per_tensor(zeros), 1.0);  // no finite scale: 1
}

// ---------------------------------------------------------------------------------------------
// Sweeps and runs on the CPU

TEST(ConvWorkload, ShapeAxisTakesTablesAndSingleRows) {
  EXPECT_EQ(conv_plan("cuda", {"shape=@deepbench-train", "precision=bf16", "pass=fwd"}).size(), 94u);
  EXPECT_EQ(conv_plan("cuda", {}).size(), 23u * 3 * 5);  // ResNet-50's rows x passes x precisions
  const auto one = conv_plan("cuda", {"shape=resnet50.conv1", "precision=bf16"});
  ASSERT_EQ(one.size(), 3u);
  EXPECT_EQ(one[0].point.at("shape"), "resnet50.conv1");
  EXPECT_EQ(conv_plan("cpu", {"shape=@tiny,resnet50.res2.conv3"}).size(), 4u * 3);
  const std::string unknown = test::usage_error([] { conv_plan("cpu", {"shape=@nope"}); });
  for (const char* table : {"@deepbench-train", "@deepbench-infer-server", "@deepbench-infer-device", "@resnet50"})
    EXPECT_TRUE(contains(unknown, table)) << unknown;
}

TEST(ConvWorkload, CpuRunRecordsCheckedPointsWithCountsAndTheAlgorithm) {
  const auto records = run_conv("cpu", {});
  ASSERT_EQ(records.size(), conv_tables().at("tiny").size() * 3);
  for (const json& r : records) {
    SCOPED_TRACE(r.dump());
    ASSERT_EQ(r["status"], "ok");
    EXPECT_EQ(r["check"]["passed"], true);
    EXPECT_TRUE(contains(r["check"]["what"].get<std::string>(), "every one of"));
    const ConvShape s = shape_of(r["params"]["shape"].get<std::string>());
    EXPECT_EQ(r["counts"]["flops"].get<double>(), static_cast<double>(conv_flops(s)));
    const ConvElements e = conv_elements(s);
    EXPECT_EQ(r["counts"]["bytes"].get<double>(), 4.0 * static_cast<double>(e.x + e.w + e.y));
    EXPECT_EQ(r["metrics"]["conv_shape"]["p"], s.p());
    EXPECT_EQ(r["metrics"]["algorithm"], "ref: float64 direct loops");
    EXPECT_GT(r["rates"]["tflops"].get<double>(), 0.0);
    EXPECT_EQ(r["params"]["n"], 0) << "a table row leaves the explicit axes unset";
  }
}

TEST(ConvWorkload, CustomShapesRunEveryPrecisionAndLayoutOnTheReference) {
  const auto records = run_conv("cpu", {"shape=custom", "n,c,h,w,k,r,s,pad,stride=2x32x9x9x16x3x3x1x2",
                                        "precision=fp32,bf16,fp8", "layout=nchw,nhwc"});
  ASSERT_EQ(records.size(), 3u * 3 * 2);
  for (const json& r : records) {
    SCOPED_TRACE(r.dump());
    EXPECT_EQ(r["metrics"]["conv_shape"]["q"], 5);
    if (r["params"]["precision"] == "fp8" && r["params"]["pass"] != "fwd") {
      EXPECT_EQ(r["status"], "skipped");
      EXPECT_TRUE(contains(r.value("reason", ""), "forward only"));
      continue;
    }
    ASSERT_EQ(r["status"], "ok");
    EXPECT_EQ(r["check"]["passed"], true);
    EXPECT_LE(r["check"]["rel_error"].get<double>(), r["check"]["tolerance"].get<double>());
  }
}

TEST(ConvWorkload, BadShapesAreInvalidWithTheReason) {
  const struct {
    std::vector<std::string> axes;
    std::string says;
  } cases[] = {
      {{"shape=custom", "n,c,h,w,k,r,s,pad,stride=-1x8x9x9x16x3x3x1x1"}, "n >= 1"},
      {{"shape=custom", "n,c,h,w,k,r,s,pad,stride=1x8x9x9x16x3x3x-1x1"}, "padding >= 0"},
      {{"shape=custom", "n,c,h,w,k,r,s,pad,stride=1x8x2x2x16x7x7x1x1"}, "P or Q <= 0"},
      {{"shape=custom", "n,c,h,w,k,r,s,pad,stride=1x8x9x9x16x3x3x1x0"}, "strides >= 1"},
      {{"shape=custom"}, "n >= 1"},  // the explicit axes left at 0
      {{"shape=resnet50.nope"}, "valid: custom"},
      {{"shape=resnet50.conv1", "n=4"}, "need shape=custom"},
      {{"shape=custom", "n,c,h,w,k,r,s,pad,stride=1048576x1048576x1024x1024x1x1x1x0x1"}, "bytes of memory of cpu"},
  };
  for (const auto& c : cases) {
    std::vector<std::string> axes = c.axes;
    axes.push_back("pass=fwd");
    const auto records = run_conv("cpu", axes);
    ASSERT_EQ(records.size(), 1u);
    const json& r = records[0];
    EXPECT_EQ(r["status"], "invalid") << r.dump();
    EXPECT_TRUE(contains(r.value("reason", ""), c.says)) << c.says << ": " << r.dump();
    EXPECT_FALSE(r.contains("rates")) << r.dump();
  }
}

// ---------------------------------------------------------------------------------------------
// On a GPU: cuDNN through the engine, every pass and precision on a small shape, checked

TEST(ConvWorkloadGpu, EveryPassAndPrecisionMatchesFloat64) {
  if (backend::best_device().rfind("cuda", 0) != 0) GTEST_SKIP() << "no CUDA device";
  const auto records =
      run_conv("cuda:0", {"shape=custom", "n,c,h,w,k,r,s,pad,stride=4x32x14x14x32x3x3x1x1", "layout=nchw,nhwc"});
  ASSERT_EQ(records.size(), 3u * 5 * 2);
  for (const json& r : records) {
    SCOPED_TRACE(r.dump());
    if (r["params"]["precision"] == "fp8" && (r["params"]["pass"] != "fwd" || r["params"]["layout"] == "nchw")) {
      EXPECT_EQ(r["status"], "skipped");  // cuDNN's fp8 graph: forward, NHWC only
      EXPECT_TRUE(contains(r.value("reason", ""), r["params"]["pass"] != "fwd" ? "forward only" : "NHWC"));
      continue;
    }
    ASSERT_EQ(r["status"], "ok");
    EXPECT_EQ(r["check"]["passed"], true);
    EXPECT_TRUE(contains(r["check"]["what"].get<std::string>(), "every one of"));
    const auto algorithm = r["metrics"]["algorithm"].get<std::string>();
    EXPECT_FALSE(algorithm.empty());
    if (r["params"]["precision"] != "fp8") {
      EXPECT_TRUE(contains(algorithm, " algo ")) << algorithm;
    }
    EXPECT_GT(r["metrics"]["search_s"].get<double>(), 0.0);
    EXPECT_GT(r["rates"]["tflops"].get<double>(), 0.0);
  }
}

}  // namespace
}  // namespace ab::workloads::micro
