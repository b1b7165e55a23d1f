// The generic inference ops' rules beside their values (nn_generic_test.cpp): training graphs
// refused, the cost model's counts, and the strided index the CUDA kernels coalesce.
#include <gtest/gtest.h>

#include <algorithm>
#include <vector>

#include "nn/broadcast.h"
#include "nn/graph.h"
#include "nn/ops.h"
#include "test_support.h"

namespace ab::nn {
namespace {

GraphOptions inference() {
  GraphOptions o;
  o.training = false;
  return o;
}

TEST(GenericOps, TrainingGraphsAreRefusedAtBindNamingTheOp) {
  GraphBuilder b(GraphOptions{});
  const Value x = b.input("x", Shape{2, 4});
  const Value h = linear(b, "fc", x, 3);
  const Value s = unary(b, "act", h, {UnaryKind::sigmoid});
  const Value labels = b.input("labels", Shape{2}, DType::i32);
  b.set_loss(softmax_cross_entropy(b, "loss", s, labels));
  Graph g(std::move(b));
  auto k = make_ref_kernels();
  try {
    g.bind(*k);
    FAIL() << "expected a refusal";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("'act'"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("inference only"), std::string::npos) << e.what();
  }
}

TEST(GenericOps, CostsCountArithmeticAndTheBytesMoved) {
  GraphBuilder b(inference());
  const Value x = b.input("x", Shape{2, 3, 4, 5}), s = b.input("s", Shape{2, 3, 1, 1});
  binary(b, "mul", x, s, BinaryKind::mul);
  pad(b, "pad", x, {0, 0, 1, 1}, {0, 0, 1, -1}, 0.0);
  gather(b, "g", x, b.input("i", Shape{7}, DType::i32), 0);
  unary(b, "swish", x, {UnaryKind::hard_swish});
  Graph g(std::move(b));
  EXPECT_EQ(g.op(0).flops(Pass::forward), 120);
  EXPECT_EQ(g.op(0).bytes(Pass::forward), (120 + 6 + 120) * 4);
  EXPECT_EQ(g.op(1).flops(Pass::forward), 0);
  EXPECT_EQ(g.op(1).bytes(Pass::forward),
            (2 * 3 * 6 * 5 + 2 * 2 * 3 * 4 * 4) * 4);  // fill y, read and write x's kept part
  EXPECT_EQ(g.op(2).bytes(Pass::forward), 7 * 4 + 2 * 7 * 3 * 4 * 5 * 4);
  EXPECT_EQ(g.op(3).flops(Pass::forward), 5 * 120);
}

// The CUDA kernels walk coalesced indices: the same offsets for every element, fewer dims.
TEST(GenericOps, CoalescedIndicesWalkTheSameOffsets) {
  const Tensor y = Tensor::describe(DType::f32, Shape{2, 3, 4, 5}, Layout::nhwc);
  const Tensor cases[][2] = {
      {Tensor::describe(DType::f32, Shape{2, 3, 4, 5}), Tensor::describe(DType::f32, Shape{3, 1, 1})},
      {Tensor::describe(DType::f32, Shape{2, 3, 4, 5}, Layout::nhwc), Tensor::describe(DType::f32, Shape{2, 3, 1, 1})},
      {Tensor::describe(DType::f32, Shape{1, 3, 4, 5}), Tensor::describe(DType::f32, Shape{5})}};
  for (const auto& c : cases) {
    const StridedIndex ix = broadcast_index("test", y, {c[0], c[1]});
    StridedIndex merged = ix;
    coalesce(merged);
    EXPECT_LE(merged.rank, ix.rank);
    for (std::int64_t i = 0; i < y.numel(); ++i) {
      std::int64_t a[kMaxIndexOperands], b[kMaxIndexOperands];
      ix.offsets(i, a);
      merged.offsets(i, b);
      for (int k = 0; k < 3; ++k) ASSERT_EQ(a[k], b[k]) << "element " << i << " operand " << k;
    }
  }
  // In the output's memory order the same tuples come out; one layout throughout is one run.
  for (const auto& c : cases) {
    const StridedIndex ix = broadcast_index("test", y, {c[0], c[1]});
    StridedIndex ordered = ix;
    order_by_output(ordered);
    coalesce(ordered);
    std::vector<std::vector<std::int64_t>> want, got;
    for (std::int64_t i = 0; i < y.numel(); ++i) {
      std::int64_t a[kMaxIndexOperands], b[kMaxIndexOperands];
      ix.offsets(i, a);
      ordered.offsets(i, b);
      want.push_back({a[0], a[1], a[2]});
      got.push_back({b[0], b[1], b[2]});
      ASSERT_EQ(b[0], i) << "the output is walked in memory order";
    }
    std::sort(want.begin(), want.end());
    std::sort(got.begin(), got.end());
    EXPECT_EQ(want, got);
  }
  StridedIndex flat = broadcast_index("test", y, {y});
  order_by_output(flat);
  coalesce(flat);
  EXPECT_EQ(flat.rank, 1);
  EXPECT_EQ(flat.dims[0], y.numel());
}

}  // namespace
}  // namespace ab::nn
