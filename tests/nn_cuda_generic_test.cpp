// The generic inference ops on the CUDA kernels against the reference kernels: the same graph
// built on both, fresh random inputs (and parameters) stored in the same dtype, the outputs
// compared within what one rounding to that dtype and f32 arithmetic allow; copies exactly. Both
// layouts, f32, f16 and bf16, the flat and the strided paths, every batch form of matmul. Skips
// where no GPU answers.
#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "backend/cuda/cuda_backend.h"
#include "nn/broadcast.h"
#include "nn/cuda/kernels.h"
#include "nn/graph.h"
#include "nn/ops.h"
#include "test_support.h"

namespace ab::nn {
namespace {

using Body = std::function<Value(GraphBuilder&, const std::vector<Value>&)>;

struct In {
  In(Shape s, double low = -2, double high = 2, DType t = DType::f32) : shape(s), lo(low), hi(high), dtype(t) {}
  Shape shape;
  double lo, hi;
  DType dtype;  // f32: the graph's activation dtype; i32: integers drawn in [lo, hi]
};

const DType kTypes[] = {DType::f32, DType::f16, DType::bf16};
const Layout kLayouts[] = {Layout::nchw, Layout::nhwc};

// One rounding to t, with room for an f32 result on the other side of a rounding boundary than
// the f64 reference's (an ulp), and f32's transcendental functions (a few ulps) for f32 itself.
double rounding(DType t) {
  switch (t) {
    case DType::bf16: return 8e-3;
    case DType::f16: return 1e-3;
    default: return 4e-6;
  }
}

Precision precision_of(DType t) {
  return t == DType::f16 ? Precision::fp16 : t == DType::bf16 ? Precision::bf16 : Precision::fp32;
}

class CudaGeneric : public ::testing::Test {
 protected:
  void SetUp() override {
    if (backend::cuda::device_count() == 0) GTEST_SKIP() << "no CUDA device (cudaGetDeviceCount found none)";
    backend_ = backend::make_backend("cuda:0");
    cuda_ = make_cuda_kernels(*backend_);
    ref_ = make_ref_kernels();
  }

  // Builds `body` on both backends, feeds both the same random inputs and parameters, and checks
  // every output element within rel * |ref| + abs_of_max * max |ref| (0, 0: bit-equal).
  void compare(const std::string& what, DType t, Layout layout, const std::vector<In>& ins, const Body& body,
               double rel, double abs_of_max = 1e-6) {
    GraphOptions o;
    o.training = false;
    o.precision = precision_of(t);
    o.layout = layout;
    std::vector<std::vector<double>> values;
    for (const In& in : ins) {
      std::uniform_real_distribution<double> d(in.lo, in.hi);
      std::vector<double> v(static_cast<std::size_t>(in.shape.numel()));
      for (double& e : v) e = in.dtype == DType::i32 ? std::floor(d(rng_)) : d(rng_);
      values.push_back(v);
    }
    const auto run = [&](Kernels& k, const ParameterValues* params) {
      GraphBuilder b(o);
      std::vector<Value> xs;
      for (std::size_t i = 0; i < ins.size(); ++i)
        xs.push_back(ins[i].dtype == DType::f32 ? b.input("x" + std::to_string(i), ins[i].shape)
                                                : b.input("x" + std::to_string(i), ins[i].shape, ins[i].dtype));
      const Value y = body(b, xs);
      b.mark_output(y);
      Graph g(std::move(b));
      g.bind(k);
      if (params != nullptr) g.set_parameter_values(*params);
      for (std::size_t i = 0; i < xs.size(); ++i) g.set_input(xs[i], values[i]);
      g.forward(false);
      return std::make_pair(g.read(y), g.parameter_values());
    };
    // Random parameters (layer norm's scale and shift), the same on both backends.
    auto [ref_y, params] = run(*ref_, nullptr);
    for (auto& [name, v] : params)
      for (double& e : v) e = std::uniform_real_distribution<double>(0.5, 1.5)(rng_);
    ref_y = run(*ref_, &params).first;
    const std::vector<double> cuda_y = run(*cuda_, &params).first;
    ASSERT_EQ(ref_y.size(), cuda_y.size()) << what;
    double peak = 0;
    for (double v : ref_y) peak = std::max(peak, std::abs(v));
    std::size_t bad = 0, worst = 0;
    for (std::size_t i = 0; i < ref_y.size(); ++i) {
      const double bound = rel * std::abs(ref_y[i]) + abs_of_max * peak;
      if (!(std::abs(cuda_y[i] - ref_y[i]) <= bound) && !(std::isnan(ref_y[i]) && std::isnan(cuda_y[i]))) {
        if (bad == 0) worst = i;
        ++bad;
      }
    }
    EXPECT_EQ(bad, 0u) << what << " " << to_string(t) << " " << to_string(layout) << ": " << bad << " of "
                       << ref_y.size() << " elements differ; first at " << worst << ": cuda " << cuda_y[worst]
                       << ", ref " << ref_y[worst] << " (seed " << seed_ << ")";
  }

  std::uint64_t seed_ = test::seed();
  std::mt19937_64 rng_{seed_};
  std::unique_ptr<backend::Backend> backend_;
  std::unique_ptr<Kernels> cuda_, ref_;
};

TEST_F(CudaGeneric, UnaryFunctionsInEveryDtype) {
  const UnaryAttrs kinds[] = {{UnaryKind::sigmoid},
                              {UnaryKind::hard_sigmoid, 0.2, 0.5},
                              {UnaryKind::hard_swish},
                              {UnaryKind::silu},
                              {UnaryKind::leaky_relu, 0.01},
                              {UnaryKind::clip, -0.5, 1.25},
                              {UnaryKind::erf},
                              {UnaryKind::gelu_erf},
                              {UnaryKind::gelu_tanh},
                              {UnaryKind::sqrt},
                              {UnaryKind::exp},
                              {UnaryKind::tanh},
                              {UnaryKind::neg},
                              {UnaryKind::abs},
                              {UnaryKind::reciprocal}};
  for (const DType t : kTypes)
    for (const UnaryAttrs& a : kinds) {
      const bool positive = a.kind == UnaryKind::sqrt || a.kind == UnaryKind::reciprocal;
      compare(
          "unary " + std::to_string(static_cast<int>(a.kind)), t, Layout::nchw,
          {In(Shape{3, 5, 37, 41}, positive ? 0.2 : -4, 4)},
          [&](GraphBuilder& b, const std::vector<Value>& v) { return unary(b, "f", v[0], a); }, rounding(t));
    }
  // Over two vectors per thread of a full grid (132 SMs x 2048 threads), an odd tail: the
  // prefetching loop's later iterations and its scalar tail.
  for (const DType t : kTypes)
    for (const UnaryAttrs& a : {UnaryAttrs{UnaryKind::gelu_erf}, UnaryAttrs{UnaryKind::clip, -0.5, 1.25}})
      compare(
          "large unary " + std::to_string(static_cast<int>(a.kind)), t, Layout::nchw,
          {In(Shape{7, 63, 97, 111}, -4, 4)},
          [&](GraphBuilder& b, const std::vector<Value>& v) { return unary(b, "f", v[0], a); }, rounding(t));
}

TEST_F(CudaGeneric, BinaryOpsFlatAndBroadcastInBothLayouts) {
  const Shape x{2, 8, 9, 11};
  const Shape others[] = {Shape{2, 8, 9, 11}, Shape{2, 8, 1, 1}, Shape{8, 1, 1}, Shape{11}, Shape{1, 1, 9, 1}};
  const BinaryKind kinds[] = {BinaryKind::add, BinaryKind::sub, BinaryKind::mul, BinaryKind::div,
                              BinaryKind::pow, BinaryKind::max, BinaryKind::min};
  for (const DType t : kTypes)
    for (const Layout l : kLayouts)
      for (const Shape& s : others)
        for (const BinaryKind k : kinds) {
          const bool pow = k == BinaryKind::pow;
          // pow's error grows with |b log a|: f32's powf is within a few ulps of the result.
          compare(
              "binary " + std::to_string(static_cast<int>(k)) + " with " + s.to_string(), t, l,
              {In(x, pow ? 0.5 : -2, 2), In(s, pow ? -2 : 0.25, 2)},
              [&](GraphBuilder& b, const std::vector<Value>& v) { return binary(b, "op", v[0], v[1], k); },
              rounding(t) * (pow ? 2 : 1));
        }
}

TEST_F(CudaGeneric, WhereExpandAndGather) {
  for (const DType t : kTypes)
    for (const Layout l : kLayouts) {
      compare(
          "where", t, l, {In(Shape{1, 6, 1, 7}, -1, 2, DType::i32), In(Shape{3, 6, 5, 7}), In(Shape{6, 1, 1})},
          [](GraphBuilder& b, const std::vector<Value>& v) { return where(b, "w", v[0], v[1], v[2]); }, 0, 0);
      compare(
          "expand", t, l, {In(Shape{6, 1, 7})},
          [](GraphBuilder& b, const std::vector<Value>& v) {
            return expand(b, "e", v[0], Shape{2, 1, 5, 1});
          },
          0, 0);
      compare(
          "gather rows", t, l, {In(Shape{50, 24}), In(Shape{3, 7}, -50, 50, DType::i32)},
          [](GraphBuilder& b, const std::vector<Value>& v) { return gather(b, "g", v[0], v[1], 0); }, 0, 0);
      compare(
          "gather channels", t, l, {In(Shape{2, 9, 4, 5}), In(Shape{4}, 0, 9, DType::i32)},
          [](GraphBuilder& b, const std::vector<Value>& v) { return gather(b, "g", v[0], v[1], 1); }, 0, 0);
    }
}

TEST_F(CudaGeneric, DataMovementIsExactInBothLayouts) {
  for (const DType t : kTypes)
    for (const Layout l : kLayouts) {
      const std::vector<In> x{In(Shape{2, 6, 7, 9}), In(Shape{2, 3, 7, 9})};
      compare(
          "concat and split", t, l, x,
          [](GraphBuilder& b, const std::vector<Value>& v) {
            const Value cat = concat(b, "cat", {v[0], v[1]}, 1);
            const auto parts = split(b, "split", cat, 1, {4, 5});
            return concat(b, "again", {parts[1], parts[0]}, 1);
          },
          0, 0);
      compare(
          "slice and transpose", t, l, {x[0]},
          [](GraphBuilder& b, const std::vector<Value>& v) {
            const Value s = slice(b, "s", v[0], {1, 1, 0, 2}, {2, 6, 7, 9}, {1, 2, 3, 2});
            return transpose(b, "t", s, {0, 2, 3, 1});
          },
          0, 0);
      // Transposes of leading dims move whole runs of the last dim in 16, 8 or 4 bytes where its
      // length and alignment allow, elements otherwise; the slice's copy starts one element in.
      for (const std::int64_t inner : {64, 12, 6, 5})
        compare(
            "heads transpose, last dim " + std::to_string(inner), t, l, {In(Shape{3, 5, 4, inner})},
            [](GraphBuilder& b, const std::vector<Value>& v) {
              return transpose(b, "t", v[0], {0, 2, 1, 3});
            },
            0, 0);
      compare(
          "an unaligned slice, then a transpose", t, l, {In(Shape{3, 5, 4, 66})},
          [](GraphBuilder& b, const std::vector<Value>& v) {
            const Value s = slice(b, "s", v[0], {0, 0, 0, 1}, {3, 5, 4, 65}, {1, 1, 1, 1});
            return transpose(b, "t", s, {1, 0, 2, 3});
          },
          0, 0);
      compare(
          "reshape and pad", t, l, {x[0]},
          [](GraphBuilder& b, const std::vector<Value>& v) {
            const Value p = pad(b, "p", v[0], {0, 1, 2, -1}, {1, 0, 1, 3}, -0.75);
            return reshape(b, "r", p, Shape{3, 7 * 10, 11});
          },
          0, 0);
    }
}

TEST_F(CudaGeneric, SoftmaxAndMeansAlongContiguousAndStridedAxes) {
  for (const DType t : kTypes)
    for (const Layout l : kLayouts) {
      for (const int axis : {-1, 1, 2})
        compare(
            "softmax axis " + std::to_string(axis), t, l, {In(Shape{2, 12, 5, 300}, -8, 8)},
            [&](GraphBuilder& b, const std::vector<Value>& v) { return softmax(b, "sm", v[0], axis); }, rounding(t),
            1e-6);
      const std::vector<std::vector<int>> axes{{2, 3}, {1}, {}, {0, 2}};
      for (const auto& a : axes)
        compare(
            "reduce_mean", t, l, {In(Shape{3, 16, 9, 13})},
            [&](GraphBuilder& b, const std::vector<Value>& v) { return reduce_mean(b, "m", v[0], a, a.size() != 1); },
            rounding(t), 1e-5);
    }
}

TEST_F(CudaGeneric, AveragePoolingAndResize) {
  for (const DType t : kTypes)
    for (const Layout l : kLayouts) {
      for (const bool include : {true, false})
        compare(
            "avgpool", t, l, {In(Shape{2, 5, 17, 14})},
            [&](GraphBuilder& b, const std::vector<Value>& v) {
              return avgpool2d(b, "ap", v[0], Pool2dDesc{3, 3, 2, 2, 1, 1}, include);
            },
            rounding(t), 1e-6);
      for (const bool linear : {false, true}) {
        compare(
            "resize up", t, l, {In(Shape{2, 3, 7, 5})},
            [&](GraphBuilder& b, const std::vector<Value>& v) { return resize(b, "up", v[0], 14, 15, linear); },
            linear ? rounding(t) : 0, linear ? 1e-6 : 0);
        compare(
            "resize down", t, l, {In(Shape{2, 3, 13, 9})},
            [&](GraphBuilder& b, const std::vector<Value>& v) { return resize(b, "down", v[0], 5, 4, linear); },
            linear ? rounding(t) : 0, linear ? 1e-6 : 0);
      }
    }
}

TEST_F(CudaGeneric, MatmulInEveryBatchForm) {
  struct Case {
    Shape a, b;
  };
  const Case cases[] = {{Shape{17, 33}, Shape{33, 19}},
                        {Shape{4, 17, 33}, Shape{33, 19}},
                        {Shape{2, 3, 17, 33}, Shape{2, 3, 33, 19}},
                        {Shape{1, 17, 33}, Shape{3, 33, 19}},
                        {Shape{2, 1, 17, 33}, Shape{1, 3, 33, 19}},
                        {Shape{3, 17, 64}, Shape{1, 64, 8}}};
  for (const DType t : kTypes)
    for (const Layout l : kLayouts)
      for (const Case& c : cases)
        // The products are summed in f32 (no TF32 under fp32) and rounded once; cancellation makes
        // an element small next to its terms, so the bound also takes a share of the largest.
        compare(
            "matmul " + c.a.to_string() + " x " + c.b.to_string(), t, l, {In(c.a), In(c.b)},
            [](GraphBuilder& b, const std::vector<Value>& v) { return matmul(b, "mm", v[0], v[1]); }, rounding(t),
            t == DType::f32 ? 4e-6 : rounding(t) / 4);
}

TEST_F(CudaGeneric, LayerNormOverTheLastDimAndOverSeveral) {
  for (const DType t : kTypes)
    for (const Layout l : kLayouts)
      for (const int axis : {-1, 1})
        compare(
            "layer_norm axis " + std::to_string(axis), t, l, {In(Shape{4, 6, 7, 96}, -3, 5)},
            [&](GraphBuilder& b, const std::vector<Value>& v) { return layer_norm(b, "ln", v[0], axis, 1e-5); },
            rounding(t), 1e-5);
}

// The strided path of unary and the copy kernel's reshape path on views no graph makes.
TEST_F(CudaGeneric, StridedViewsAndReshapesOfViews) {
  const Shape full{4, 6, 10};
  std::vector<double> values(static_cast<std::size_t>(full.numel()));
  for (double& v : values) v = std::uniform_real_distribution<double>(-2, 2)(rng_);
  const auto run = [&](Kernels& k) {
    const Tensor desc = Tensor::describe(DType::f32, full, Layout::nchw, k.allocator().device());
    Buffer xb(k.allocator(), desc.size_bytes()), yb(k.allocator(), desc.size_bytes()),
        zb(k.allocator(), desc.size_bytes());
    const Tensor x = xb.view(desc);
    std::vector<float> host(values.begin(), values.end());
    k.upload(x, host.data());
    k.fill(yb.view(desc), 0.0);
    // A transposed view of x's middle rows into a narrowed y, then that view reshaped flat.
    Tensor xv = narrow_view(x, 1, 1, 4);
    std::swap(xv.shape[1], xv.shape[2]);
    std::swap(xv.strides[1], xv.strides[2]);
    const Tensor yv =
        narrow_view(yb.view(Tensor::describe(DType::f32, Shape{4, 10, 6}, Layout::nchw, desc.device)), 2, 1, 4);
    k.unary_forward({UnaryKind::tanh}, xv, yv);
    const Tensor z = zb.view(Tensor::describe(DType::f32, Shape{160}, Layout::nchw, desc.device));
    k.copy_strided(yv, z);
    std::vector<float> out(160);
    k.download(z, out.data());
    k.synchronize();
    return out;
  };
  const auto want = run(*ref_), got = run(*cuda_);
  for (std::size_t i = 0; i < want.size(); ++i)
    ASSERT_NEAR(want[i], got[i], 4e-7 * std::max(1.0f, std::abs(want[i]))) << i;
}

}  // namespace
}  // namespace ab::nn
