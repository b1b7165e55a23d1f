// The generic inference ops (nn/ops_generic.h) on the reference kernels, each against a plain
// computation written here: elementwise with broadcasting, constants, data movement in both
// layouts, softmax, means, pooling, resize, matmul, gather, layer norm, costs and refusals.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <numbers>
#include <vector>

#include "core/rng.h"
#include "nn/graph.h"
#include "nn/ops.h"
#include "test_support.h"

namespace ab::nn {
namespace {

std::size_t sz(std::int64_t i) { return static_cast<std::size_t>(i); }

struct In {
  In(Shape s, std::vector<double> v = {}, DType t = DType::f32) : shape(s), values(std::move(v)), dtype(t) {}
  Shape shape;
  std::vector<double> values;  // empty: drawn from the test's seed in [-2, 2]
  DType dtype;                 // f32 means the graph's activation dtype
};

GraphOptions inference() {
  GraphOptions o;
  o.training = false;
  return o;
}

struct Out {
  std::vector<std::vector<double>> in;
  std::vector<double> y;
  Shape shape;
  Graph* graph = nullptr;
  Value value;  // the output read
};

// Runs an inference graph on the reference kernels: `body` adds the layers under test to the
// inputs and returns the value to read.
class GraphRun {
 public:
  explicit GraphRun(Layout layout = Layout::nchw, DType dtype = DType::f64) {
    opts_.layout = layout;
    opts_.dtype = dtype;
    opts_.training = false;
  }
  Out run(const std::vector<In>& ins, const std::function<Value(GraphBuilder&, const std::vector<Value>&)>& body) {
    GraphBuilder b(opts_);
    std::vector<Value> xs;
    Out out;
    for (std::size_t i = 0; i < ins.size(); ++i) {
      const In& in = ins[i];
      xs.push_back(in.dtype == DType::f32 ? b.input("x" + std::to_string(i), in.shape)
                                          : b.input("x" + std::to_string(i), in.shape, in.dtype));
      std::vector<double> v = in.values;
      if (v.empty())
        for (std::int64_t j = 0; j < in.shape.numel(); ++j) v.push_back(uniform(seed_, counter_++, -2.0, 2.0));
      out.in.push_back(v);
    }
    const Value y = body(b, xs);
    b.mark_output(y);
    out.shape = b.desc(y).shape;
    graph_ = std::make_unique<Graph>(std::move(b));
    graph_->bind(*kernels_);
    for (std::size_t i = 0; i < xs.size(); ++i) graph_->set_input(xs[i], out.in[i]);
    graph_->forward(false);
    out.y = graph_->read(y);
    out.graph = graph_.get();
    out.value = y;
    return out;
  }

 private:
  GraphOptions opts_;
  std::unique_ptr<Kernels> kernels_ = make_ref_kernels();
  std::unique_ptr<Graph> graph_;
  std::uint64_t seed_ = test::seed(), counter_ = 0;
};

// Logical row-major offset of coordinates c in shape s (dims of size 1 broadcast: their coordinate is 0).
std::int64_t at(const Shape& s, const std::vector<std::int64_t>& c) {
  std::int64_t off = 0;
  const int shift = static_cast<int>(c.size()) - s.rank();
  for (int d = 0; d < s.rank(); ++d) off = off * s[d] + (s[d] == 1 ? 0 : c[sz(d + shift)]);
  return off;
}
std::vector<std::int64_t> coords(const Shape& s, std::int64_t i) {
  std::vector<std::int64_t> c(sz(s.rank()));
  for (int d = s.rank() - 1; d >= 0; --d) {
    c[sz(d)] = i % s[d];
    i /= s[d];
  }
  return c;
}

void expect_all_near(const std::vector<double>& want, const std::vector<double>& got, double tol,
                     const std::string& what) {
  ASSERT_EQ(want.size(), got.size()) << what;
  for (std::size_t i = 0; i < want.size(); ++i)
    ASSERT_NEAR(want[i], got[i], tol * std::max(1.0, std::abs(want[i]))) << what << " element " << i;
}

const Layout kLayouts[] = {Layout::nchw, Layout::nhwc};

double sigmoid(double x) { return 1 / (1 + std::exp(-x)); }

TEST(GenericOps, UnaryFunctionsMatchTheirFormulas) {
  struct Case {
    UnaryAttrs a;
    double (*f)(double, double, double);
  };
  const Case cases[] = {
      {{UnaryKind::sigmoid}, [](double x, double, double) { return sigmoid(x); }},
      {{UnaryKind::hard_sigmoid, 0.2, 0.5},
       [](double x, double a, double b) { return std::max(0.0, std::min(1.0, a * x + b)); }},
      {{UnaryKind::hard_swish}, [](double x, double, double) { return x * std::max(0.0, std::min(1.0, (x + 3) / 6)); }},
      {{UnaryKind::silu}, [](double x, double, double) { return x * sigmoid(x); }},
      {{UnaryKind::leaky_relu, 0.01}, [](double x, double a, double) { return x > 0 ? x : a * x; }},
      {{UnaryKind::clip, -0.5, 1.5}, [](double x, double lo, double hi) { return std::clamp(x, lo, hi); }},
      {{UnaryKind::erf}, [](double x, double, double) { return std::erf(x); }},
      {{UnaryKind::gelu_erf}, [](double x, double, double) { return x * 0.5 * std::erfc(-x / std::numbers::sqrt2); }},
      {{UnaryKind::gelu_tanh},
       [](double x, double, double) {
         return 0.5 * x * (1 + std::tanh(std::sqrt(2 / std::numbers::pi) * (x + 0.044715 * std::pow(x, 3))));
       }},
      {{UnaryKind::sqrt}, [](double x, double, double) { return std::sqrt(std::abs(x)); }},
      {{UnaryKind::exp}, [](double x, double, double) { return std::exp(x); }},
      {{UnaryKind::tanh}, [](double x, double, double) { return std::tanh(x); }},
      {{UnaryKind::neg}, [](double x, double, double) { return -x; }},
      {{UnaryKind::abs}, [](double x, double, double) { return std::abs(x); }},
      {{UnaryKind::reciprocal}, [](double x, double, double) { return 1 / x; }},
  };
  for (const Case& c : cases) {
    GraphRun g;
    const bool positive = c.a.kind == UnaryKind::sqrt;
    std::vector<double> x;
    for (int i = 0; i < 24; ++i) x.push_back(positive ? 0.1 + 0.3 * i : -3.1 + 0.27 * i);
    const Out o = g.run({{Shape{2, 3, 4}, x}},
                        [&](GraphBuilder& b, const std::vector<Value>& v) { return unary(b, "f", v[0], c.a); });
    std::vector<double> want;
    for (double e : x) want.push_back(c.f(positive ? std::abs(e) : e, c.a.alpha, c.a.beta));
    expect_all_near(want, o.y, 1e-12, std::string(o.graph->op(0).kind()));
  }
}

TEST(GenericOps, BinaryOpsBroadcastLikeNumpyInBothLayouts) {
  const Shape x{2, 3, 4, 5};
  const Shape others[] = {Shape{2, 3, 1, 1}, Shape{3, 1, 1}, Shape{5}, Shape{2, 1, 4, 1}, Shape{2, 3, 4, 5}};
  const BinaryKind kinds[] = {BinaryKind::add, BinaryKind::sub, BinaryKind::mul, BinaryKind::div,
                              BinaryKind::pow, BinaryKind::max, BinaryKind::min};
  for (const Layout layout : kLayouts)
    for (const Shape& s : others)
      for (const BinaryKind kind : kinds) {
        GraphRun g(layout);
        const bool pow = kind == BinaryKind::pow;
        std::vector<double> a, bv;
        for (std::int64_t i = 0; i < x.numel(); ++i)
          a.push_back(pow ? 0.5 + 0.01 * static_cast<double>(i) : -1.5 + 0.03 * static_cast<double>(i));
        for (std::int64_t i = 0; i < s.numel(); ++i)
          bv.push_back(0.25 + 0.5 * static_cast<double>(i % 7) - (pow ? 0 : 1.6));
        const Out o = g.run({{x, a}, {s, bv}}, [&](GraphBuilder& b, const std::vector<Value>& v) {
          return binary(b, "op", v[0], v[1], kind);
        });
        ASSERT_EQ(o.shape, x);
        for (std::int64_t i = 0; i < x.numel(); ++i) {
          const double p = a[sz(i)], q = bv[sz(at(s, coords(x, i)))];
          const double want = kind == BinaryKind::add   ? p + q
                              : kind == BinaryKind::sub ? p - q
                              : kind == BinaryKind::mul ? p * q
                              : kind == BinaryKind::div ? p / q
                              : kind == BinaryKind::pow ? std::pow(p, q)
                              : kind == BinaryKind::max ? std::max(p, q)
                                                        : std::min(p, q);
          ASSERT_NEAR(want, o.y[sz(i)], 1e-12 * std::max(1.0, std::abs(want))) << s.to_string() << " element " << i;
        }
      }
}

TEST(GenericOps, BinaryBroadcastsBothOperandsAndRefusesShapesThatDoNot) {
  GraphRun g;
  const Out o = g.run({{Shape{3, 1}}, {Shape{1, 4}}}, [](GraphBuilder& b, const std::vector<Value>& v) {
    return binary(b, "outer", v[0], v[1], BinaryKind::mul);
  });
  ASSERT_EQ(o.shape, (Shape{3, 4}));
  for (int i = 0; i < 3; ++i)
    for (int j = 0; j < 4; ++j) EXPECT_NEAR(o.in[0][sz(i)] * o.in[1][sz(j)], o.y[sz(i * 4 + j)], 1e-14);
  GraphBuilder b(inference());
  const Value x = b.input("x", Shape{2, 3}), y = b.input("y", Shape{4});
  try {
    binary(b, "bad_add", x, y, BinaryKind::add);
    FAIL() << "expected a LayerError";
  } catch (const LayerError& e) {
    EXPECT_NE(std::string(e.what()).find("bad_add"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("do not broadcast"), std::string::npos) << e.what();
  }
}

TEST(GenericOps, WhereSelectsByABroadcastIntegerCondition) {
  GraphRun g;
  const Out o = g.run({{Shape{1, 4}, {1, 0, 0, 7}, DType::i32}, {Shape{3, 4}}, {Shape{3, 1}}},
                      [](GraphBuilder& b, const std::vector<Value>& v) { return where(b, "w", v[0], v[1], v[2]); });
  ASSERT_EQ(o.shape, (Shape{3, 4}));
  for (int i = 0; i < 3; ++i)
    for (int j = 0; j < 4; ++j)
      EXPECT_EQ(o.y[sz(i * 4 + j)], o.in[0][sz(j)] != 0 ? o.in[1][sz(i * 4 + j)] : o.in[2][sz(i)]);
}

TEST(GenericOps, ConstantIsANonTrainableParameterBindSetsToItsValues) {
  GraphRun g(Layout::nhwc);
  const std::vector<double> c{1, 2, 3, 4, 5, 6};
  const Out o = g.run({{Shape{2, 3, 1, 1}}}, [&](GraphBuilder& b, const std::vector<Value>& v) {
    return binary(b, "scaled", v[0], constant(b, "scale", Shape{1, 3, 1, 1}, {0.5, -1, 2}), BinaryKind::mul);
  });
  for (int n = 0; n < 2; ++n)
    for (int ch = 0; ch < 3; ++ch)
      EXPECT_DOUBLE_EQ(o.in[0][sz(n * 3 + ch)] * (std::vector<double>{0.5, -1, 2})[sz(ch)], o.y[sz(n * 3 + ch)]);
  ASSERT_EQ(o.graph->parameters().size(), 1u);
  const Parameter& p = o.graph->parameters()[0];
  EXPECT_EQ(p.name, "scale.value");
  EXPECT_FALSE(p.spec.trainable());
  EXPECT_EQ(o.graph->parameter_count(), 0);
  EXPECT_EQ(o.graph->initial_parameter_values().at("scale.value"), (std::vector<double>{0.5, -1, 2}));
  GraphBuilder b(inference());
  EXPECT_THROW(constant(b, "short", Shape{2, 2}, c), LayerError);
}

TEST(GenericOps, ConcatAndSplitAlongEveryAxisInBothLayouts) {
  for (const Layout layout : kLayouts)
    for (int axis = 0; axis < 4; ++axis) {
      Shape a{2, 3, 4, 5}, bshape = a;
      bshape[axis] = 2;
      GraphRun g(layout);
      const Out o = g.run({{a}, {bshape}}, [&](GraphBuilder& b, const std::vector<Value>& v) {
        const Value cat = concat(b, "cat", {v[0], v[1]}, axis - 4);  // a negative axis counts from the end
        const auto parts = split(b, "split", cat, axis, {1, a[axis] - 1, 2});
        return concat(b, "again", {parts[2], parts[0], parts[1]}, axis);
      });
      Shape cat = a;
      cat[axis] += 2;
      ASSERT_EQ(o.shape, cat);
      for (std::int64_t i = 0; i < cat.numel(); ++i) {
        std::vector<std::int64_t> c = coords(cat, i);
        // again = [b, a] along the axis
        const bool from_b = c[sz(axis)] < 2;
        if (!from_b) c[sz(axis)] -= 2;
        const std::vector<double>& src = from_b ? o.in[1] : o.in[0];
        ASSERT_EQ(src[sz(at(from_b ? bshape : a, c))], o.y[sz(i)])
            << to_string(layout) << " axis " << axis << " element " << i;
      }
    }
}

TEST(GenericOps, SliceTransposeReshapeAndExpandMoveElementsInLogicalOrder) {
  for (const Layout layout : kLayouts) {
    const Shape x{2, 3, 5, 4};
    GraphRun g(layout);
    const Out s = g.run({{x}}, [](GraphBuilder& b, const std::vector<Value>& v) {
      return slice(b, "s", v[0], {0, 1, 1, 0}, {2, 3, 99, 4}, {1, 1, 2, 3});
    });
    ASSERT_EQ(s.shape, (Shape{2, 2, 2, 2}));
    for (std::int64_t i = 0; i < s.shape.numel(); ++i) {
      const auto c = coords(s.shape, i);
      ASSERT_EQ(s.in[0][sz(at(x, {c[0], 1 + c[1], 1 + 2 * c[2], 3 * c[3]}))], s.y[sz(i)]);
    }
    const Out t = g.run({{x}}, [](GraphBuilder& b, const std::vector<Value>& v) {
      return transpose(b, "t", v[0], {0, 2, 3, 1});
    });
    ASSERT_EQ(t.shape, (Shape{2, 5, 4, 3}));
    for (std::int64_t i = 0; i < t.shape.numel(); ++i) {
      const auto c = coords(t.shape, i);
      ASSERT_EQ(t.in[0][sz(at(x, {c[0], c[3], c[1], c[2]}))], t.y[sz(i)]);
    }
    // A reshape keeps logical row-major order whatever the input's layout (a flatten of NHWC data).
    const Out r = g.run({{x}}, [](GraphBuilder& b, const std::vector<Value>& v) {
      return reshape(b, "r", v[0], Shape{6, 20});
    });
    EXPECT_EQ(r.in[0], r.y);
    const Out e = g.run({{Shape{3, 1, 1}}}, [](GraphBuilder& b, const std::vector<Value>& v) {
      return expand(b, "e", v[0], Shape{2, 1, 4, 5});
    });
    ASSERT_EQ(e.shape, (Shape{2, 3, 4, 5}));
    for (std::int64_t i = 0; i < e.shape.numel(); ++i) ASSERT_EQ(e.in[0][sz(coords(e.shape, i)[1])], e.y[sz(i)]);
  }
  GraphBuilder b(inference());
  const Value x = b.input("x", Shape{2, 3});
  EXPECT_THROW(reshape(b, "r", x, Shape{4, 2}), LayerError);
  EXPECT_THROW(transpose(b, "t", x, {0, 0}), LayerError);
  EXPECT_THROW(expand(b, "e", x, Shape{4, 3, 3}), LayerError);
}

// In an inference graph a reshape between row-major tensors is its input's bytes: it moves nothing
// (no modelled bytes, no buffer of its own), and values reshaped from an op's output stay right
// when read after ops that could reuse that output's memory were it not kept for them. A rank-4
// reshape of NHWC data reorders bytes and stays a copy.
TEST(GenericOps, ARowMajorReshapeIsItsInputsBytes) {
  GraphRun g;
  const Shape x{2, 3, 4};
  const Out o = g.run({{x}}, [&](GraphBuilder& b, const std::vector<Value>& v) {
    const Value rows = reshape(b, "rows", relu(b, "relu", v[0]), Shape{6, 4});  // relu's last direct reader
    const Value twice = add(b, "twice", v[0], v[0]);
    const Value four = add(b, "four", twice, twice);
    const Value relu_x = reshape(b, "back", reshape(b, "cols", rows, Shape{4, 6}), x);
    return add(b, "sum", four, relu_x);
  });
  for (std::size_t i = 0; i < o.y.size(); ++i) ASSERT_EQ(o.y[i], 4 * o.in[0][i] + std::max(o.in[0][i], 0.0)) << i;
  int reshapes = 0;
  for (const OpReport& r : o.graph->report())
    if (r.kind == "reshape") {
      ++reshapes;
      EXPECT_EQ(r.forward_bytes, 0) << r.name;
    }
  EXPECT_EQ(reshapes, 3);
  // x, relu's output (and its three reshapes), twice, four, sum: 5 buffers for 8 values.
  EXPECT_EQ(o.graph->buffers().size(), 5u);

  GraphRun nhwc(Layout::nhwc);
  const Out n = nhwc.run({{Shape{2, 3, 5, 4}}}, [](GraphBuilder& b, const std::vector<Value>& v) {
    return reshape(b, "r", v[0], Shape{6, 20});
  });
  EXPECT_EQ(n.in[0], n.y);
  for (const OpReport& r : n.graph->report())
    if (r.kind == "reshape") {
      EXPECT_GT(r.forward_bytes, 0) << "an NHWC reshape moves bytes";
    }
}

// ConvNeXt's block moves its channels last around a layer norm: in an NHWC graph each transpose
// and reshape of that chain keeps the bytes as they lie (the generic ops keep the layout that
// spares a copy), so none moves a byte; the values are the NCHW graph's. A built-in op handed a
// row-major rank-4 tensor reads it through a relayout copy into the graph's layout.
TEST(GenericOps, ChannelsLastViewsOfAnNhwcGraphMoveNoBytes) {
  const auto block = [](GraphBuilder& b, const std::vector<Value>& v) {
    const Value act = relu(b, "act", v[0]);  // a built-in op: the graph's layout
    const Value last = transpose(b, "to_last", act, {0, 2, 3, 1});
    const Value norm = layer_norm(b, "norm", last, 3, 1e-5);
    const Value rows = reshape(b, "rows", norm, Shape{60, 8});
    const Value back = reshape(b, "unrows", unary(b, "sig", rows, {UnaryKind::sigmoid}), Shape{2, 5, 6, 8});
    return add(b, "sum", act, transpose(b, "to_first", back, {0, 3, 1, 2}));
  };
  GraphRun nchw(Layout::nchw), nhwc(Layout::nhwc);
  const Out a = nchw.run({{Shape{2, 8, 5, 6}}}, block), c = nhwc.run({In(Shape{2, 8, 5, 6}, a.in[0])}, block);
  ASSERT_EQ(a.y.size(), c.y.size());
  for (std::size_t i = 0; i < a.y.size(); ++i) ASSERT_NEAR(a.y[i], c.y[i], 1e-12) << i;
  std::vector<std::string> copies;
  for (const OpReport& r : c.graph->report())
    if ((r.kind == "transpose" || r.kind == "reshape" || r.kind == "relayout") && r.forward_bytes != 0)
      copies.push_back(r.name);
  EXPECT_TRUE(copies.empty()) << copies.front();
  for (const OpReport& r : a.graph->report())
    if (r.name == "to_last") {
      EXPECT_GT(r.forward_bytes, 0) << "NCHW permutes channels last";
    }

  const Out d = nhwc.run({{Shape{2, 8, 30}}}, [](GraphBuilder& b, const std::vector<Value>& v) {
    return relu(b, "act", reshape(b, "image", v[0], Shape{2, 8, 5, 6}));
  });
  for (std::size_t i = 0; i < d.y.size(); ++i) ASSERT_EQ(d.y[i], std::max(d.in[0][i], 0.0)) << i;
  std::vector<std::string> kinds;
  for (const OpReport& r : d.graph->report()) kinds.emplace_back(r.kind);
  EXPECT_EQ(kinds, (std::vector<std::string>{"reshape", "relayout", "relu"}));
  EXPECT_EQ(d.graph->report()[0].forward_bytes, 0) << "the reshape of a row-major input is its bytes";
}

// An inference graph's ops that no marked output depends on (a branch an importer left unused)
// neither run nor appear in the report; the used ones give the same values.
TEST(GenericOps, OpsNoOutputNeedsAreLeftOut) {
  GraphRun g;
  const Out o = g.run({{Shape{2, 3, 4}}}, [](GraphBuilder& b, const std::vector<Value>& v) {
    const Value unused = transpose(b, "unused", v[0], {2, 1, 0});
    relu(b, "unused_relu", unused);
    return relu(b, "relu", v[0]);
  });
  for (std::size_t i = 0; i < o.y.size(); ++i) ASSERT_EQ(o.y[i], std::max(o.in[0][i], 0.0)) << i;
  std::vector<std::string> names;
  std::int64_t flops = 0;
  for (const OpReport& r : o.graph->report()) {
    names.push_back(r.name);
    flops += r.forward_flops;
  }
  EXPECT_EQ(names, std::vector<std::string>{"relu"});
  EXPECT_EQ(o.graph->forward_flops(), flops) << "the unused relu's FLOPs are not the graph's";
  EXPECT_GT(flops, 0);
}

TEST(GenericOps, PadFillsTheBorderAndNegativePadsCrop) {
  for (const Layout layout : kLayouts) {
    const Shape x{1, 2, 3, 4};
    GraphRun g(layout);
    const Out o = g.run({{x}}, [](GraphBuilder& b, const std::vector<Value>& v) {
      return pad(b, "p", v[0], {0, 1, 2, -1}, {1, 0, 1, 1}, -7.5);
    });
    ASSERT_EQ(o.shape, (Shape{2, 3, 6, 4}));
    for (std::int64_t i = 0; i < o.shape.numel(); ++i) {
      const auto c = coords(o.shape, i);
      const std::int64_t n = c[0], ch = c[1] - 1, h = c[2] - 2, w = c[3] + 1;
      const bool inside = n < 1 && ch >= 0 && h >= 0 && h < 3 && w < 4;
      ASSERT_EQ(inside ? o.in[0][sz(at(x, {n, ch, h, w}))] : -7.5, o.y[sz(i)]) << to_string(layout) << " element " << i;
    }
  }
}

TEST(GenericOps, SoftmaxIsStableAndSumsToOneAlongItsAxis) {
  for (const Layout layout : kLayouts)
    for (int axis : {1, 3, -1}) {
      const Shape x{2, 3, 2, 5};
      std::vector<double> v;
      for (std::int64_t i = 0; i < x.numel(); ++i)
        v.push_back(800.0 + static_cast<double>((i * 37) % 11));  // exp overflows unshifted
      GraphRun g(layout);
      const Out o =
          g.run({{x, v}}, [&](GraphBuilder& b, const std::vector<Value>& in) { return softmax(b, "sm", in[0], axis); });
      const int ax = axis < 0 ? axis + 4 : axis;
      for (std::int64_t i = 0; i < x.numel(); ++i) {
        auto c = coords(x, i);
        double sum = 0;
        for (std::int64_t j = 0; j < x[ax]; ++j) {
          c[sz(ax)] = j;
          sum += std::exp(v[sz(at(x, c))] - 800.0);
        }
        ASSERT_NEAR(std::exp(v[sz(i)] - 800.0) / sum, o.y[sz(i)], 1e-14);
      }
      EXPECT_EQ(o.graph->op(0).flops(Pass::forward), 5 * x.numel());
    }
}

TEST(GenericOps, ReduceMeanOverAnyAxesWithAndWithoutKeptDims) {
  for (const Layout layout : kLayouts)
    for (bool keep : {true, false}) {
      const Shape x{2, 3, 4, 5};
      GraphRun g(layout);
      const Out o = g.run({{x}}, [&](GraphBuilder& b, const std::vector<Value>& v) {
        return reduce_mean(b, "m", v[0], {-1, 2}, keep);
      });
      ASSERT_EQ(o.shape, keep ? (Shape{2, 3, 1, 1}) : (Shape{2, 3}));
      for (int n = 0; n < 2; ++n)
        for (int c = 0; c < 3; ++c) {
          double sum = 0;
          for (int h = 0; h < 4; ++h)
            for (int w = 0; w < 5; ++w) sum += o.in[0][sz(at(x, {n, c, h, w}))];
          ASSERT_NEAR(sum / 20, o.y[sz(n * 3 + c)], 1e-14);
        }
    }
  GraphRun g;
  const Out all = g.run({{Shape{3, 4}}}, [](GraphBuilder& b, const std::vector<Value>& v) {
    return reduce_mean(b, "m", v[0], {}, false);
  });
  double sum = 0;
  for (double e : all.in[0]) sum += e;
  ASSERT_EQ(all.y.size(), 1u);
  EXPECT_NEAR(sum / 12, all.y[0], 1e-14);
}

TEST(GenericOps, AveragePoolingCountsPaddingOnlyWhenAsked) {
  const Pool2dDesc d{3, 3, 2, 2, 1, 1};
  for (const Layout layout : kLayouts)
    for (bool include : {true, false}) {
      const Shape x{2, 2, 5, 6};
      GraphRun g(layout);
      const Out o = g.run(
          {{x}}, [&](GraphBuilder& b, const std::vector<Value>& v) { return avgpool2d(b, "ap", v[0], d, include); });
      ASSERT_EQ(o.shape, (Shape{2, 2, 3, 3}));
      for (std::int64_t i = 0; i < o.shape.numel(); ++i) {
        const auto c = coords(o.shape, i);
        double sum = 0;
        int count = 0;
        for (std::int64_t h = c[2] * 2 - 1; h < c[2] * 2 + 2; ++h)
          for (std::int64_t w = c[3] * 2 - 1; w < c[3] * 2 + 2; ++w)
            if (h >= 0 && h < 5 && w >= 0 && w < 6) {
              sum += o.in[0][sz(at(x, {c[0], c[1], h, w}))];
              ++count;
            }
        ASSERT_NEAR(sum / (include ? 9 : count), o.y[sz(i)], 1e-14) << "element " << i;
      }
      EXPECT_EQ(o.graph->op(0).flops(Pass::forward), o.shape.numel() * 10);
    }
}

TEST(GenericOps, ResizeNearestIsAsymmetricFloorAndLinearIsHalfPixel) {
  for (const Layout layout : kLayouts) {
    GraphRun g(layout);
    const Out lin = g.run({{Shape{1, 1, 2, 2}, {1, 2, 3, 4}}}, [](GraphBuilder& b, const std::vector<Value>& v) {
      return resize(b, "up", v[0], 4, 4, true);
    });
    // PyTorch's interpolate(scale_factor=2, mode="bilinear", align_corners=False) of [[1, 2], [3, 4]].
    expect_all_near({1, 1.25, 1.75, 2, 1.5, 1.75, 2.25, 2.5, 2.5, 2.75, 3.25, 3.5, 3, 3.25, 3.75, 4}, lin.y, 1e-15,
                    "bilinear");
    const Out near = g.run({{Shape{1, 2, 5, 2}}}, [](GraphBuilder& b, const std::vector<Value>& v) {
      return resize(b, "down", v[0], 3, 4, false);
    });
    const std::int64_t rows[] = {0, 1, 3}, cols[] = {0, 0, 1, 1};  // floor(o * 5 / 3), floor(o * 2 / 4)
    for (std::int64_t i = 0; i < near.shape.numel(); ++i) {
      const auto c = coords(near.shape, i);
      ASSERT_EQ(near.in[0][sz(at(Shape{1, 2, 5, 2}, {0, c[1], rows[c[2]], cols[c[3]]}))], near.y[sz(i)]);
    }
  }
}

TEST(GenericOps, MatmulBroadcastsBatchDimsAndStagesNhwcOperands) {
  for (const Layout layout : kLayouts) {
    const Shape a{2, 1, 3, 4}, bs{3, 4, 5};
    GraphRun g(layout);
    const Out o =
        g.run({{a}, {bs}}, [](GraphBuilder& b, const std::vector<Value>& v) { return matmul(b, "mm", v[0], v[1]); });
    ASSERT_EQ(o.shape, (Shape{2, 3, 3, 5}));
    for (std::int64_t i = 0; i < o.shape.numel(); ++i) {
      const auto c = coords(o.shape, i);
      double sum = 0;
      for (std::int64_t k = 0; k < 4; ++k)
        sum += o.in[0][sz(at(a, {c[0], 0, c[2], k}))] * o.in[1][sz(at(bs, {c[1], k, c[3]}))];
      ASSERT_NEAR(sum, o.y[sz(i)], 1e-13) << to_string(layout) << " element " << i;
    }
    EXPECT_EQ(o.graph->op(0).flops(Pass::forward), 2 * 2 * 3 * 3 * 5 * 4);
    EXPECT_EQ(o.graph->op(0).flops(Pass::backward), 0);
  }
}

TEST(GenericOps, GatherTakesIntegerOrFloatIndicesCountingNegativesFromTheEnd) {
  GraphRun g;
  const Out rows = g.run({{Shape{5, 3}}, {Shape{2, 2}, {4, 0, -1, 2}, DType::i32}},
                         [](GraphBuilder& b, const std::vector<Value>& v) { return gather(b, "g", v[0], v[1], 0); });
  ASSERT_EQ(rows.shape, (Shape{2, 2, 3}));
  const int picked[] = {4, 0, 4, 2};
  for (int i = 0; i < 4; ++i)
    for (int j = 0; j < 3; ++j) ASSERT_EQ(rows.in[0][sz(picked[i] * 3 + j)], rows.y[sz(i * 3 + j)]);
  const Out cols = g.run({{Shape{2, 4, 3}}, {Shape{3}, {3, 1, 1}}},
                         [](GraphBuilder& b, const std::vector<Value>& v) { return gather(b, "g", v[0], v[1], 1); });
  ASSERT_EQ(cols.shape, (Shape{2, 3, 3}));
  for (std::int64_t i = 0; i < cols.shape.numel(); ++i) {
    const auto c = coords(cols.shape, i);
    const std::int64_t idx[] = {3, 1, 1};
    ASSERT_EQ(cols.in[0][sz(at(Shape{2, 4, 3}, {c[0], idx[c[1]], c[2]}))], cols.y[sz(i)]);
  }
  EXPECT_THROW(g.run({{Shape{5, 3}}, {Shape{1}, {5}, DType::i32}},
                     [](GraphBuilder& b, const std::vector<Value>& v) { return gather(b, "g", v[0], v[1], 0); }),
               Error);
}

TEST(GenericOps, LayerNormOverTrailingDimsWithItsParameters) {
  for (const Layout layout : kLayouts)
    for (int axis : {-1, 1}) {
      const Shape x{2, 3, 2, 4};
      GraphRun g(layout);
      const Out o = g.run(
          {{x}}, [&](GraphBuilder& b, const std::vector<Value>& v) { return layer_norm(b, "ln", v[0], axis, 1e-5); });
      const std::int64_t cols = axis == -1 ? 4 : 24, rows = x.numel() / cols;
      ASSERT_EQ(o.graph->parameters().size(), 2u);
      EXPECT_EQ(o.graph->parameters()[0].name, "ln.weight");
      EXPECT_EQ(o.graph->parameters()[0].value.numel(), cols);
      // Non-trivial parameters: a scale and shift per normalised element.
      ParameterValues p;
      for (std::int64_t j = 0; j < cols; ++j) {
        p["ln.weight"].push_back(0.5 + 0.1 * static_cast<double>(j));
        p["ln.bias"].push_back(-0.3 + 0.05 * static_cast<double>(j));
      }
      o.graph->set_parameter_values(p);
      o.graph->forward(false);
      const std::vector<double> y = o.graph->read(o.value);
      for (std::int64_t r = 0; r < rows; ++r) {
        double mean = 0, var = 0;
        for (std::int64_t j = 0; j < cols; ++j) mean += o.in[0][sz(r * cols + j)] / static_cast<double>(cols);
        for (std::int64_t j = 0; j < cols; ++j)
          var += std::pow(o.in[0][sz(r * cols + j)] - mean, 2) / static_cast<double>(cols);
        for (std::int64_t j = 0; j < cols; ++j) {
          const double want =
              (o.in[0][sz(r * cols + j)] - mean) / std::sqrt(var + 1e-5) * p["ln.weight"][sz(j)] + p["ln.bias"][sz(j)];
          ASSERT_NEAR(want, y[sz(r * cols + j)], 1e-12) << to_string(layout) << " axis " << axis;
        }
      }
    }
}

}  // namespace
}  // namespace ab::nn
