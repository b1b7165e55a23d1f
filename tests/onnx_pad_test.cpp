// A Pad before a Conv (TF-style exports, EfficientNet variants): constant zero padding of H and W
// alone becomes part of the convolution's padding; any other Pad stays a pad op. Either way the
// imported graph computes what the native pad + convolution graph computes (reference kernels,
// float64, fresh random weights and inputs), and inspect lists the merge.
#include <gtest/gtest.h>

#include <cmath>

#include "nn/ops.h"
#include "onnx/onnx.h"
#include "onnx_builder.h"
#include "test_support.h"

namespace ab {
namespace {

using onnx_test::f64_inference;
using onnx_test::max_rel_diff;
using onnx_test::run;

using onnx_test::OnnxBuilder;
using onnx_test::random_values;
using OB = OnnxBuilder;

constexpr std::int64_t kBatch = 2, kIn = 3, kOut = 4, kPx = 7;

struct PadConv {
  std::vector<std::int64_t> pads;       // ONNX's [N, C, H, W] begins, then ends
  double value = 0;                     // the constant
  std::vector<std::int64_t> conv_pads;  // the Conv's own [top, left, bottom, right]
  std::int64_t stride = 1;
  std::int64_t conv_in() const { return kIn + pads[1] + pads[5]; }  // channels after the Pad
};

struct PadConvNet {
  OnnxBuilder onnx;
  std::vector<double> weight;
};

PadConvNet pad_conv_onnx(const PadConv& p) {
  PadConvNet t;
  t.weight = random_values(test::seed(), kOut * p.conv_in() * 9, -0.5, 0.5);
  t.onnx.input("x", {-1, kIn, kPx, kPx});
  std::vector<std::string> pad_inputs{"x", t.onnx.init_ints("pads", {8}, p.pads)};
  if (p.value != 0.0) pad_inputs.push_back(t.onnx.init("value", {}, {p.value}));
  t.onnx.node("Pad", pad_inputs, {"padded"}, "pad0");
  auto* conv = t.onnx.node("Conv", {"padded", t.onnx.init("w", {kOut, p.conv_in(), 3, 3}, t.weight)}, {"c"}, "conv0");
  OB::attr(conv, "kernel_shape", std::vector<std::int64_t>{3, 3});
  OB::attr(conv, "pads", p.conv_pads);
  OB::attr(conv, "strides", std::vector<std::int64_t>{p.stride, p.stride});
  t.onnx.node("Relu", {"c"}, {"y"});
  t.onnx.output("y");
  return t;
}

// The native graph: nn::pad with the Pad's values, then the convolution with its own padding
// (asymmetric pads as a second nn::pad, as the importer would build them unmerged).
std::vector<double> native(const PadConv& p, const std::vector<double>& weight, const std::vector<double>& x) {
  nn::GraphBuilder b(f64_inference());
  const nn::Value in = b.input("x", Shape{kBatch, kIn, kPx, kPx});
  nn::Value v =
      nn::pad(b, "pad", in, {p.pads.begin(), p.pads.begin() + 4}, {p.pads.begin() + 4, p.pads.end()}, p.value);
  v = nn::pad(b, "conv_pad", v, {0, 0, p.conv_pads[0], p.conv_pads[1]}, {0, 0, p.conv_pads[2], p.conv_pads[3]}, 0.0);
  nn::Conv2dAttrs a;
  a.out_channels = kOut;
  a.kernel_h = a.kernel_w = 3;
  a.conv.stride_h = a.conv.stride_w = p.stride;
  const nn::Value y = nn::relu(b, "relu", nn::conv2d(b, "conv", v, a));
  return run(std::move(b), in, y, {{"conv.weight", weight}}, x);
}

struct Imported {
  std::vector<double> y;
  int pad_ops = 0;
  std::vector<std::string> fused;
};

Imported imported(const std::string& bytes, onnx::Fold fold, const std::vector<double>& x) {
  const auto model = onnx::Model::parse(bytes, "pad.onnx");
  nn::GraphBuilder b(f64_inference());
  onnx::Imported m = onnx::import(b, *model, {kBatch, fold});
  Imported r;
  r.fused = m.fused;
  b.mark_output(m.output);
  auto kernels = nn::make_ref_kernels();
  nn::Graph g(std::move(b));
  for (const auto& op : g.report()) r.pad_ops += op.kind == "pad";
  g.bind(*kernels);
  g.set_parameter_values(m.parameters);
  g.set_input(m.input, x);
  g.forward(false);
  r.y = g.read(m.output);
  return r;
}

// Each case: whether the Pad merges, and the pad ops left in the imported graph.
struct Case {
  const char* what;
  PadConv p;
  bool merges;
  int pad_ops;
};

TEST(OnnxPadMerge, ZeroSpatialPadsJoinTheConvolutionOthersStayPadOps) {
  const Case cases[] = {
      {"symmetric (SAME at stride 1)", {{0, 0, 1, 1, 0, 0, 1, 1}, 0, {0, 0, 0, 0}, 1}, true, 0},
      {"added to the convolution's own", {{0, 0, 1, 2, 0, 0, 1, 2}, 0, {1, 0, 1, 0}, 1}, true, 0},
      {"asymmetric (TF SAME at stride 2)", {{0, 0, 0, 0, 0, 0, 1, 1}, 0, {0, 0, 0, 0}, 2}, true, 1},
      {"a non-zero constant", {{0, 0, 1, 1, 0, 0, 1, 1}, 0.5, {0, 0, 0, 0}, 1}, false, 1},
      {"channels padded", {{0, 1, 1, 1, 0, 0, 1, 1}, 0, {0, 0, 0, 0}, 1}, false, 1},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.what);
    const PadConv& p = c.p;
    const PadConvNet net = pad_conv_onnx(p);
    const std::vector<double> x = random_values(test::seed(), kBatch * kIn * kPx * kPx);
    const std::vector<double> want = native(p, net.weight, x);
    for (onnx::Fold fold : {onnx::Fold::off, onnx::Fold::fused}) {
      const Imported got = imported(net.onnx.bytes(), fold, x);
      EXPECT_LT(max_rel_diff(got.y, want), 1e-12) << "fold " << static_cast<int>(fold);
      EXPECT_EQ(got.pad_ops, c.pad_ops) << "fold " << static_cast<int>(fold);
      if (fold == onnx::Fold::fused) {
        ASSERT_EQ(got.fused.size(), 1u);
        EXPECT_EQ(got.fused[0], std::string(c.merges ? "Pad+" : "") + "Conv+Relu: conv0");
      }
    }
  }
}

// A padded tensor that another op reads too (a max pool here) stays a pad op: that reader needs it.
TEST(OnnxPadMerge, APadWithASecondReaderIsNotMerged) {
  OnnxBuilder m;
  const std::vector<double> w = random_values(test::seed(), kOut * kIn * 9, -0.5, 0.5);
  m.input("x", {-1, kIn, kPx, kPx});
  m.node("Pad", {"x", m.init_ints("pads", {8}, {0, 0, 1, 1, 0, 0, 1, 1})}, {"padded"}, "pad0");
  auto* conv = m.node("Conv", {"padded", m.init("w", {kOut, kIn, 3, 3}, w)}, {"c"}, "conv0");
  OB::attr(conv, "kernel_shape", std::vector<std::int64_t>{3, 3});
  m.node("Relu", {"c"}, {"y"});
  auto* pool = m.node("MaxPool", {"padded"}, {"p"}, "pool");
  OB::attr(pool, "kernel_shape", std::vector<std::int64_t>{3, 3});
  OB::attr(m.node("Concat", {"y", "p"}, {"out"}, "cat"), "axis", std::int64_t{1});
  m.output("out");

  nn::GraphBuilder b(f64_inference());
  const nn::Value in = b.input("x", Shape{kBatch, kIn, kPx, kPx});
  const nn::Value padded = nn::pad(b, "pad", in, {0, 0, 1, 1}, {0, 0, 1, 1}, 0.0);
  nn::Conv2dAttrs a;
  a.out_channels = kOut;
  a.kernel_h = a.kernel_w = 3;
  const nn::Value y = nn::relu(b, "relu", nn::conv2d(b, "conv", padded, a));
  const nn::Value pooled = nn::maxpool2d(b, "pool", padded, nn::Pool2dDesc{3, 3, 1, 1, 0, 0});
  const nn::Value out = nn::concat(b, "cat", {y, pooled}, 1);
  const std::vector<double> x = random_values(test::seed(), kBatch * kIn * kPx * kPx);
  const std::vector<double> want = run(std::move(b), in, out, {{"conv.weight", w}}, x);

  const Imported got = imported(m.bytes(), onnx::Fold::fused, x);
  EXPECT_LT(max_rel_diff(got.y, want), 1e-12);
  EXPECT_EQ(got.pad_ops, 1);
  ASSERT_EQ(got.fused.size(), 1u);
  EXPECT_EQ(got.fused[0], "Conv+Relu: conv0");
}

TEST(OnnxPadMerge, InspectListsTheMerge) {
  const PadConvNet net = pad_conv_onnx({{0, 0, 1, 1, 0, 0, 1, 1}, 0, {0, 0, 0, 0}, 1});
  test::TempDir dir;
  dir.write("pad.onnx", net.onnx.bytes());
  const test::Ran o = test::accelbench({"inspect", (dir.path() / "pad.onnx").string()});
  ASSERT_EQ(o.code, 0) << o.output;
  EXPECT_NE(o.output.find("Pad+Conv+Relu: conv0"), std::string::npos) << o.output;
  EXPECT_EQ(o.output.find(" pad "), std::string::npos) << "no pad op is left: " << o.output;
}

}  // namespace
}  // namespace ab
