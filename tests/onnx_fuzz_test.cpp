// Mutated valid models (byte flips, truncations, field edits through the protobuf API): the
// importer refuses each with an ab::Error or imports it, and never crashes, hangs or throws
// anything else. Run under the sanitize preset too (ASan + UBSan catch what a plain build misses).
#include <gtest/gtest.h>

#include <chrono>
#include <typeinfo>

#include "nn/graph.h"
#include "onnx/onnx.h"
#include "onnx_builder.h"
#include "test_support.h"

namespace ab {
namespace {

using onnx_test::OnnxBuilder;
using onnx_test::random_values;
using OB = OnnxBuilder;

// A small CNN touching the importer's main paths: a zero Pad merged into a conv + bn + relu chain,
// a residual add, pooling, a PyTorch-style shape subgraph before a Reshape, concat, a Gemm.
std::string seed_model() {
  OnnxBuilder m;
  m.input("x", {-1, 2, 6, 6});
  m.node("Pad", {"x", m.init_ints("pads", {8}, {0, 0, 1, 1, 0, 0, 1, 1})}, {"xp"});
  m.node("Conv", {"xp", m.init("w1", {4, 2, 3, 3}, random_values(1, 72))}, {"c1"});
  m.node("BatchNormalization",
         {"c1", m.init("g", {4}, random_values(2, 4, 0.5, 1.5)), m.init("b", {4}, random_values(3, 4)),
          m.init("m", {4}, random_values(4, 4)), m.init("v", {4}, random_values(5, 4, 0.5, 1.5))},
         {"bn"});
  m.node("Relu", {"bn"}, {"r"});
  auto* c2 = m.node(
      "Conv", {"r", m.init("w2", {4, 4, 1, 1}, random_values(6, 16)), m.init("b2", {4}, random_values(7, 4))}, {"c2"});
  OB::attr(c2, "strides", std::vector<std::int64_t>{1, 1});
  m.node("Add", {"c2", "r"}, {"sum"});
  m.node("Relu", {"sum"}, {"r2"});
  OB::attr(m.node("Concat", {"r2", "r"}, {"cat"}), "axis", std::int64_t{1});
  auto* pool = m.node("MaxPool", {"cat"}, {"p"});
  OB::attr(pool, "kernel_shape", std::vector<std::int64_t>{2, 2});
  OB::attr(pool, "strides", std::vector<std::int64_t>{2, 2});
  m.node("Shape", {"p"}, {"shape"});
  m.node("Gather", {"shape", m.init_ints("zero", {}, {0})}, {"n"});
  m.node("Unsqueeze", {"n", m.init_ints("axes", {1}, {0})}, {"n1"});
  OB::attr(m.node("Concat", {"n1", m.init_ints("rest", {1}, {-1})}, {"target"}), "axis", std::int64_t{0});
  m.node("Reshape", {"p", "target"}, {"flat"});
  OB::attr(
      m.node("Gemm", {"flat", m.init("fw", {3, 72}, random_values(8, 216)), m.init("fb", {3}, random_values(9, 3))},
             {"y"}),
      "transB", std::int64_t{1});
  m.output("y");
  return m.bytes();
}

enum class Outcome { imported, refused };

Outcome try_import(const std::string& bytes, std::uint64_t seed) {
  try {
    const auto model = onnx::Model::parse(bytes, "fuzz.onnx");
    nn::GraphOptions o;
    o.training = false;
    nn::GraphBuilder b(o);
    const auto fold = static_cast<onnx::Fold>(seed % 3);
    onnx::import(b, *model, {static_cast<std::int64_t>(1 + seed % 2), fold});
    const nn::Graph g(std::move(b));  // planned, not bound: nothing allocated
    return Outcome::imported;
  } catch (const Error&) {
    return Outcome::refused;  // UsageError for the file, LayerError for a shape the engine refuses
  } catch (const std::exception& e) {
    ADD_FAILURE() << "case " << seed << ": " << typeid(e).name() << ": " << e.what();
    return Outcome::refused;
  }
}

// A field edit through the protobuf API: values a corrupt or hostile file could hold.
void edit_fields(::onnx::ModelProto& m, std::uint64_t seed) {
  auto* g = m.mutable_graph();
  const auto pick = [&](int n, std::uint64_t k) {
    return n <= 0 ? -1 : static_cast<int>(mix64(seed, k) % static_cast<std::uint64_t>(n));
  };
  const std::int64_t wild[] = {0,
                               -1,
                               -7,
                               1,
                               3,
                               1 << 20,
                               std::int64_t{1} << 40,
                               std::numeric_limits<std::int64_t>::max(),
                               std::numeric_limits<std::int64_t>::min()};
  const std::int64_t value = wild[mix64(seed, 1) % std::size(wild)];
  const char* ops[] = {"Conv",
                       "Relu",
                       "Add",
                       "Gemm",
                       "Reshape",
                       "Concat",
                       "Gather",
                       "Shape",
                       "MaxPool",
                       "Flatten",
                       "Slice",
                       "Unsqueeze",
                       "BatchNormalization",
                       "Identity",
                       "Cast",
                       "Squeeze",
                       "Transpose",
                       "NoSuchOp"};
  const int node = pick(g->node_size(), 3), init = pick(g->initializer_size(), 3);
  switch (mix64(seed, 2) % 8) {
    case 0:
      if (node >= 0) g->mutable_node(node)->set_op_type(ops[mix64(seed, 4) % std::size(ops)]);
      break;
    case 1:
      if (node >= 0 && g->node(node).attribute_size() > 0) {
        auto* at = g->mutable_node(node)->mutable_attribute(pick(g->node(node).attribute_size(), 5));
        at->set_i(value);
        for (int k = 0; k < at->ints_size(); ++k)
          if (mix64(seed, 6 + static_cast<std::uint64_t>(k)) % 2) at->set_ints(k, value);
      }
      break;
    case 2:
      if (init >= 0 && g->initializer(init).dims_size() > 0)
        g->mutable_initializer(init)->set_dims(pick(g->initializer(init).dims_size(), 5), value);
      break;
    case 3:
      if (init >= 0) g->mutable_initializer(init)->set_data_type(static_cast<std::int32_t>(mix64(seed, 5) % 18));
      break;
    case 4:
      g->mutable_input(0)
          ->mutable_type()
          ->mutable_tensor_type()
          ->mutable_shape()
          ->mutable_dim(pick(4, 3))
          ->set_dim_value(value);
      break;
    case 5:
      if (node >= 0) g->mutable_node()->DeleteSubrange(node, 1);
      break;
    case 6:
      if (node >= 0) g->mutable_node()->SwapElements(node, pick(g->node_size(), 4));
      break;
    default: m.mutable_opset_import(0)->set_version(value);
  }
}

TEST(OnnxFuzz, MutatedModelsAreRefusedOrImportedNeverWorse) {
  const std::string valid = seed_model();
  ASSERT_EQ(try_import(valid, 0), Outcome::imported);
  ::onnx::ModelProto proto;
  ASSERT_TRUE(proto.ParseFromString(valid));
  const std::uint64_t base = test::seed();
  int imported = 0, refused = 0;
  const auto started = std::chrono::steady_clock::now();
  constexpr int kCases = 10000;
  for (int c = 0; c < kCases; ++c) {
    const std::uint64_t seed = mix64(base, static_cast<std::uint64_t>(c));
    std::string bytes;
    switch (c % 3) {
      case 0: {  // byte flips
        bytes = valid;
        for (std::uint64_t k = 0, flips = 1 + seed % 8; k < flips; ++k)
          bytes[mix64(seed, 10 + k) % bytes.size()] ^= static_cast<char>(1 + mix64(seed, 30 + k) % 255);
        break;
      }
      case 1: bytes = valid.substr(0, mix64(seed, 1) % valid.size()); break;  // truncation
      default: {
        ::onnx::ModelProto edited = proto;
        edit_fields(edited, seed);
        bytes = edited.SerializeAsString();
      }
    }
    (try_import(bytes, seed) == Outcome::imported ? imported : refused) += 1;
  }
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
  EXPECT_EQ(imported + refused, kCases);
  EXPECT_GT(refused, kCases / 3) << "mutations that break nothing test nothing";
  RecordProperty("imported", imported);
  RecordProperty("seconds", std::to_string(seconds));
  std::printf("%d cases in %.2f s: %d imported, %d refused\n", kCases, seconds, imported, refused);
}

}  // namespace
}  // namespace ab
