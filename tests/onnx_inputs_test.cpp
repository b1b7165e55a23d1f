// Bad ONNX input: each refused as a UsageError with the reason, before any graph is built.
#include <gtest/gtest.h>

#include "onnx/onnx.h"
#include "onnx_builder.h"
#include "test_support.h"

namespace ab {
namespace {

using onnx_test::OnnxBuilder;
using onnx_test::random_values;
using OB = OnnxBuilder;

// x [N, 4] -> Gemm -> Relu -> y: a valid model the cases below break one way each.
OnnxBuilder small_model(std::int64_t opset = 17) {
  OnnxBuilder m(opset);
  m.input("x", {-1, 4});
  OB::attr(
      m.node("Gemm", {"x", m.init("w", {3, 4}, random_values(1, 12)), m.init("b", {3}, random_values(2, 3))}, {"h"}),
      "transB", std::int64_t{1});
  m.node("Relu", {"h"}, {"y"});
  m.output("y");
  return m;
}

std::string refusal(const std::string& bytes, const std::filesystem::path& dir = {}) {
  return test::usage_error([&] { onnx::Model::parse(bytes, "bad.onnx", dir); });
}

bool has(const std::string& text, const std::string& part) { return text.find(part) != std::string::npos; }

TEST(OnnxInput, AValidModelLoadsAndSaysWhatItIs) {
  const auto m = onnx::Model::parse(small_model().bytes(), "small.onnx");
  EXPECT_EQ(m->facts().opset, 17);
  EXPECT_EQ(m->facts().op_histogram.at("Gemm"), 1);
  EXPECT_EQ(m->facts().sha256.size(), 64u);
  EXPECT_EQ(m->facts().input_shape, (Shape{1, 4}));
  EXPECT_GE(onnx::max_opset(), 17);
}

TEST(OnnxInput, UnsupportedOpsAreListedAllAtOnceWithNamesAndCounts) {
  OnnxBuilder m = small_model();
  m.node("NonMaxSuppression", {"y"}, {"z1"}, "nms_a");
  m.node("NonMaxSuppression", {"z1"}, {"z2"}, "nms_b");
  m.node("TopK", {"z2"}, {"z3"}, "topk");
  const std::string e = refusal(m.bytes());
  EXPECT_TRUE(has(e, "2 op type(s)")) << e;
  EXPECT_TRUE(has(e, "NonMaxSuppression (2): nms_a, nms_b")) << e;
  EXPECT_TRUE(has(e, "TopK (1): topk")) << e;
}

TEST(OnnxInput, TruncatedOrCorruptFilesAreRefused) {
  const std::string bytes = small_model().bytes();
  for (std::size_t keep : {std::size_t{0}, std::size_t{1}, bytes.size() / 3, bytes.size() / 2, bytes.size() - 3}) {
    const std::string e = refusal(bytes.substr(0, keep));
    EXPECT_FALSE(e.empty()) << "kept " << keep << " of " << bytes.size() << " bytes";
  }
  EXPECT_TRUE(has(refusal("this is not a protobuf at all, just text"), "not an ONNX model"));
  EXPECT_TRUE(has(test::usage_error([] { onnx::Model::load("/nonexistent/model.onnx"); }), "cannot open"));
}

TEST(OnnxInput, ExternalDataIsReadAndAMissingFileIsRefused) {
  test::TempDir dir;
  OnnxBuilder m = small_model();
  ::onnx::TensorProto* w = m.graph()->mutable_initializer(0);
  const std::string raw = w->raw_data();
  w->clear_raw_data();
  w->set_data_location(::onnx::TensorProto_DataLocation_EXTERNAL);
  auto* loc = w->add_external_data();
  loc->set_key("location");
  loc->set_value("weights.bin");
  auto* off = w->add_external_data();
  off->set_key("offset");
  off->set_value("8");
  EXPECT_TRUE(has(refusal(m.bytes(), dir.path()), "weights.bin is missing")) << refusal(m.bytes(), dir.path());
  dir.write("weights.bin", std::string(8, 'x') + raw);
  const auto loaded = onnx::Model::parse(m.bytes(), "ext.onnx", dir.path());
  EXPECT_EQ(loaded->facts().initializer_elements, 15);
  dir.write("weights.bin", std::string(8, 'x') + raw.substr(0, 20));  // short
  EXPECT_TRUE(has(refusal(m.bytes(), dir.path()), "does not hold its 48 bytes"));
  loc->set_value("../weights.bin");
  EXPECT_TRUE(has(refusal(m.bytes(), dir.path()), "beside the model"));
}

TEST(OnnxInput, UnsupportedDataTypesAreRefused) {
  OnnxBuilder m = small_model();
  ::onnx::TensorProto* t = m.graph()->add_initializer();
  t->set_name("names");
  t->set_data_type(::onnx::TensorProto_DataType_STRING);
  t->add_dims(1);
  t->add_string_data("a");
  EXPECT_TRUE(has(refusal(m.bytes()), "data type STRING")) << refusal(m.bytes());
  // int64 and int32 inputs (token ids, masks) import; other integer widths are refused.
  OnnxBuilder tokens;
  tokens.input("ids", {-1, 16}, ::onnx::TensorProto_DataType_INT16);
  tokens.node("Relu", {"ids"}, {"y"});
  tokens.output("y");
  EXPECT_TRUE(has(refusal(tokens.bytes()), "int64 or int32")) << refusal(tokens.bytes());
}

TEST(OnnxInput, ADynamicDimensionOtherThanTheBatchIsRefused) {
  OnnxBuilder m;
  m.input("x", {-1, 3, -1, 8});
  m.node("Relu", {"x"}, {"y"});
  m.output("y");
  const std::string e = refusal(m.bytes());
  EXPECT_TRUE(has(e, "dimension 2 is symbolic")) << e;
  EXPECT_TRUE(has(e, "only the batch")) << e;
}

TEST(OnnxInput, OpsetsOutsideTheRangeAreRefused) {
  EXPECT_TRUE(has(refusal(small_model(12).bytes()), "opset 12 is outside")) << refusal(small_model(12).bytes());
  const std::int64_t newer = onnx::max_opset() + 1;
  EXPECT_TRUE(has(refusal(small_model(newer).bytes()), "opset " + std::to_string(newer) + " is outside"));
  EXPECT_NO_THROW(onnx::Model::parse(small_model(13).bytes(), "ok.onnx"));
}

TEST(OnnxInput, ADanglingTensorReferenceIsRefused) {
  OnnxBuilder m = small_model();
  m.graph()->mutable_node(1)->set_input(0, "nowhere");
  EXPECT_TRUE(has(refusal(m.bytes()), "'nowhere', which no earlier node")) << refusal(m.bytes());
}

}  // namespace
}  // namespace ab
