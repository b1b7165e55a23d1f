// The transformer side of the ONNX importer, on the reference backend in float64 with fresh random
// weights and inputs: Mod folded in shape arithmetic, integer (token-id, mask) inputs through
// Gather, several inputs, and exported attention mapped onto nn::attention (or, where the pattern
// does not fit, node by node), each against the same computation done directly on the host.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <map>

#include "core/rng.h"
#include "nn/ops.h"
#include "onnx/onnx.h"
#include "onnx_builder.h"
#include "test_support.h"

namespace ab {
namespace {

using onnx_test::max_rel_diff;
using onnx_test::OnnxBuilder;
using onnx_test::random_values;
using OB = OnnxBuilder;
constexpr int kInt64 = ::onnx::TensorProto_DataType_INT64;

struct Result {
  std::vector<double> y;
  std::vector<std::string> fused;
  std::int64_t attention_ops = 0;  // engine ops of kind "attention"
  std::map<std::string, std::int64_t> ops;  // engine ops by kind
};

// The model at `batch` in a float64 inference graph, each input given its values in file order.
Result run_imported(const std::string& bytes, std::int64_t batch, const std::vector<std::vector<double>>& inputs) {
  const auto model = onnx::Model::parse(bytes, "test.onnx");
  nn::GraphOptions o;
  o.dtype = DType::f64;
  o.training = false;
  nn::GraphBuilder b(o);
  const onnx::Imported m = onnx::import(b, *model, {batch, onnx::Fold::fused});
  b.mark_output(m.output);
  auto kernels = nn::make_ref_kernels();
  nn::Graph g(std::move(b));
  g.bind(*kernels);
  g.set_parameter_values(m.parameters);
  EXPECT_EQ(m.inputs.size(), inputs.size());
  for (std::size_t i = 0; i < inputs.size() && i < m.inputs.size(); ++i) g.set_input(m.inputs[i], inputs[i]);
  g.forward(false);
  Result r{g.read(m.output), m.fused, 0, {}};
  for (const auto& op : g.report()) {
    r.attention_ops += op.kind == "attention";
    ++r.ops[op.kind];
  }
  return r;
}

::onnx::NodeProto* constant_ints(OnnxBuilder& m, const std::string& out, const std::vector<std::int64_t>& dims,
                                 const std::vector<std::int64_t>& values) {
  auto* n = m.node("Constant", {}, {out});
  auto* a = n->add_attribute();
  a->set_name("value");
  a->set_type(::onnx::AttributeProto_AttributeType_TENSOR);
  auto* t = a->mutable_t();
  t->set_data_type(kInt64);
  for (auto d : dims) t->add_dims(d);
  for (auto v : values) t->add_int64_data(v);
  return n;
}

::onnx::NodeProto* constant_float(OnnxBuilder& m, const std::string& out, double value) {
  auto* n = m.node("Constant", {}, {out});
  auto* a = n->add_attribute();
  a->set_name("value");
  a->set_type(::onnx::AttributeProto_AttributeType_TENSOR);
  auto* t = a->mutable_t();
  t->set_data_type(::onnx::TensorProto_DataType_FLOAT);
  t->add_float_data(static_cast<float>(value));
  return n;
}

TEST(OnnxTransformer, ModFoldsWithTheSignOfEitherOperand) {
  // x [N, 6] reshaped to [N, a, b] with a = -7 mod 5 = 3 (fmod 0: the divisor's sign) and
  // b = -(-7 fmod 5) = 2 (fmod 1: the dividend's), then scaled by 5.5 fmod -2 = 1.5 and
  // 5.5 mod -2 = -0.5: wrong semantics give another shape or other values.
  OnnxBuilder m;
  m.input("x", {-1, 6});
  constant_ints(m, "minus7", {}, {-7});
  constant_ints(m, "five", {}, {5});
  OB::attr(m.node("Mod", {"minus7", "five"}, {"a"}), "fmod", std::int64_t{0});
  OB::attr(m.node("Mod", {"minus7", "five"}, {"b_neg"}), "fmod", std::int64_t{1});
  m.node("Neg", {"b_neg"}, {"b"});
  constant_ints(m, "axes", {1}, {0});
  m.node("Unsqueeze", {"a", "axes"}, {"a1"});
  m.node("Unsqueeze", {"b", "axes"}, {"b1"});
  constant_ints(m, "keep", {1}, {-1});
  OB::attr(m.node("Concat", {"keep", "a1", "b1"}, {"shape"}), "axis", std::int64_t{0});
  m.node("Reshape", {"x", "shape"}, {"r"});
  constant_float(m, "f55", 5.5);
  constant_float(m, "fm2", -2.0);
  OB::attr(m.node("Mod", {"f55", "fm2"}, {"c_style"}), "fmod", std::int64_t{1});
  OB::attr(m.node("Mod", {"f55", "fm2"}, {"floor_style"}), "fmod", std::int64_t{0});
  m.node("Mul", {"r", "c_style"}, {"s1"});
  m.node("Add", {"s1", "floor_style"}, {"y"});
  m.output("y");
  const std::int64_t batch = 2;
  const std::vector<double> x = random_values(301, batch * 6);
  const Result r = run_imported(m.bytes(), batch, {x});
  std::vector<double> want;
  for (double v : x) want.push_back(v * 1.5 - 0.5);
  EXPECT_LT(max_rel_diff(r.y, want), 1e-12);
  OnnxBuilder zero;
  zero.input("x", {-1, 2});
  constant_ints(zero, "seven", {}, {7});
  constant_ints(zero, "nought", {}, {0});
  zero.node("Mod", {"seven", "nought"}, {"bad"});
  zero.node("Mul", {"x", "bad"}, {"y"});
  zero.output("y");
  try {
    onnx::Model::parse(zero.bytes(), "zero.onnx");
    ADD_FAILURE() << "an integer Mod by zero must be refused";
  } catch (const UsageError& e) {
    EXPECT_NE(std::string(e.what()).find("by zero"), std::string::npos) << e.what();
  }
}

// BERT's embeddings in small: word[ids] + type[token_types], scaled by a mask (int64 cast to
// float), averaged over the sequence. ids and types only index tables: i32 token ids; the mask is
// read otherwise: integers in a float value.
struct Embeddings {
  static constexpr std::int64_t vocab = 11, seq = 5, width = 4;
  std::vector<double> words = random_values(311, vocab*width), types = random_values(312, 2 * width);

  std::string model() const {
    OnnxBuilder m;
    m.input("input_ids", {-1, seq}, kInt64);
    m.input("attention_mask", {-1, seq}, kInt64);
    m.input("token_type_ids", {-1, seq}, kInt64);
    m.node("Gather", {m.init("word", {vocab, width}, words), "input_ids"}, {"e"});
    m.node("Gather", {m.init("type", {2, width}, types), "token_type_ids"}, {"t"});
    m.node("Add", {"e", "t"}, {"sum"});
    OB::attr(m.node("Cast", {"attention_mask"}, {"mask_f"}), "to", std::int64_t{::onnx::TensorProto_DataType_FLOAT});
    m.node("Unsqueeze", {"mask_f", m.init_ints("last", {1}, {2})}, {"mask3"});
    m.node("Mul", {"sum", "mask3"}, {"masked"});
    OB::attr(m.node("ReduceMean", {"masked"}, {"y"}), "axes", std::vector<std::int64_t>{1});
    m.output("y");
    return m.bytes();
  }
  std::vector<double> host(std::int64_t batch, const std::vector<double>& ids, const std::vector<double>& mask,
                           const std::vector<double>& token_types) const {
    std::vector<double> want(static_cast<std::size_t>(batch * width), 0.0);
    for (std::int64_t b = 0; b < batch; ++b)
      for (std::int64_t t = 0; t < seq; ++t)
        for (std::int64_t c = 0; c < width; ++c) {
          const auto i = static_cast<std::size_t>(b * seq + t);
          const double e = words[static_cast<std::size_t>(ids[i]) * width + c] +
                           types[static_cast<std::size_t>(token_types[i]) * width + c];
          want[static_cast<std::size_t>(b * width + c)] += e * mask[i] / static_cast<double>(seq);
        }
    return want;
  }
};

std::vector<double> random_ids(std::uint64_t seed, std::int64_t count, std::uint64_t rows) {
  std::vector<double> v;
  for (std::int64_t i = 0; i < count; ++i)
    v.push_back(static_cast<double>(mix64(seed, static_cast<std::uint64_t>(i)) % rows));
  return v;
}

TEST(OnnxTransformer, TokenIdsMaskAndTokenTypesAreSeveralIntegerInputs) {
  const Embeddings e;
  const std::int64_t batch = 3, count = batch * Embeddings::seq;
  const auto model = onnx::Model::parse(e.model(), "bert_embeddings.onnx");
  const auto& in = model->facts().inputs;
  ASSERT_EQ(in.size(), 3u);
  EXPECT_TRUE(in[0].indices && in[0].index_rows == Embeddings::vocab);
  EXPECT_TRUE(in[1].integer && !in[1].indices);
  EXPECT_TRUE(in[2].indices && in[2].index_rows == 2);
  const std::vector<double> ids = random_ids(313, count, Embeddings::vocab), types = random_ids(315, count, 2);
  std::vector<double> mask = random_ids(314, count, 2);
  mask[0] = mask[Embeddings::seq] = 1;
  const Result r = run_imported(e.model(), batch, {ids, mask, types});
  EXPECT_LT(max_rel_diff(r.y, e.host(batch, ids, mask, types)), 1e-12);
}

// infer's inputs: NAME:FILE (int64) for the ids; the mask synthetic ones and the token types 0.
TEST(OnnxTransformer, InferFeedsNamedIntegerFilesAndSynthesisesTheRest) {
  const Embeddings e;
  const std::int64_t batch = 2, count = batch * Embeddings::seq;
  test::TempDir dir;
  dir.write("bert.onnx", e.model());
  const std::vector<double> ids = random_ids(316, count, Embeddings::vocab);
  const std::vector<std::int64_t> raw(ids.begin(), ids.end());
  dir.write("ids.i64", std::string(reinterpret_cast<const char*>(raw.data()), raw.size() * sizeof(std::int64_t)));
  const std::string file = (dir.path() / "bert.onnx").string();
  test::Ran o = test::accelbench({"run", "infer", "--device", "cpu", "--axis", "model=" + file, "--axis",
                                  "batch=" + std::to_string(batch), "--option",
                                  "inputs=input_ids:" + (dir.path() / "ids.i64").string(), "--option",
                                  "dump_outputs=on", "--min-time", "0.02", "--out", dir.path().string(), "-q"});
  ASSERT_EQ(o.code, 0) << o.output;
  const std::vector<nlohmann::json> records = test::read_records(dir.path());
  ASSERT_EQ(records.size(), 1u);
  const auto& r = records[0];
  ASSERT_EQ(r["status"], "ok") << r.dump();
  const auto& inputs = r["metrics"]["onnx"]["inputs"];
  ASSERT_EQ(inputs.size(), 3u);
  EXPECT_EQ(inputs[0]["kind"], "token_ids");
  EXPECT_EQ(inputs[1]["kind"], "integers");
  std::ifstream f(r["metrics"]["outputs_file"].get<std::string>(), std::ios::binary);
  std::vector<float> got(static_cast<std::size_t>(batch * Embeddings::width));
  f.read(reinterpret_cast<char*>(got.data()), static_cast<std::streamsize>(got.size() * sizeof(float)));
  ASSERT_TRUE(f);
  const std::vector<double> ones(static_cast<std::size_t>(count), 1.0), zeros(static_cast<std::size_t>(count), 0.0);
  EXPECT_LT(max_rel_diff({got.begin(), got.end()}, e.host(batch, ids, ones, zeros)), 1e-6);
}

// loadgen's model SUT holds every input of each sample in its pool and copies each into every
// batch. The reference Gather refuses an index outside its table, so a run that completes issued
// only ids inside the vocabulary and token types inside the 2-row type table (the ids pool fed to
// the type input would not be).
TEST(OnnxTransformer, LoadgenFeedsTokenIdsMaskAndTokenTypesToEveryBatch) {
  const Embeddings e;
  test::TempDir dir;
  dir.write("bert.onnx", e.model());
  const std::string file = (dir.path() / "bert.onnx").string();
  const test::Ran o = test::accelbench({"run", "loadgen", "--device", "cpu", "--axis", "sut=" + file, "--axis",
                                        "scenario=single-stream,offline", "--axis", "samples=8", "--axis",
                                        "max_batch=4", "--out", dir.path().string(), "-q"});
  ASSERT_EQ(o.code, 0) << o.output;
  const std::vector<nlohmann::json> records = test::read_records(dir.path());
  ASSERT_EQ(records.size(), 2u) << o.output;
  for (const auto& r : records) {
    SCOPED_TRACE(r.dump());
    ASSERT_EQ(r["status"], "ok");
    EXPECT_EQ(r["scenario"]["result"], "VALID");
    EXPECT_NE(r["scenario"]["sut"].get<std::string>().find("bert.onnx"), std::string::npos);
    EXPECT_EQ(r["metrics"]["model"]["inputs"], 3);
    EXPECT_GT(r["metrics"]["batcher"]["samples"].get<double>(), 0.0);
    EXPECT_GT(r["counts"]["flops"].get<double>(), 0.0);
    EXPECT_GT(r["scenario"]["completed_samples_per_s"].get<double>(), 0.0);
    // Offline's batches hold several samples, each row of each input its own sample's.
    if (r["params"]["scenario"] == "offline") {
      EXPECT_GT(r["metrics"]["batcher"]["mean_batch"].get<double>(), 1.0);
    }
  }
  EXPECT_NE(records[0]["params"]["scenario"], records[1]["params"]["scenario"]);
}

// loadgen's `inputs` option fills the SUT's pool from the user's file (here the token ids; the
// mask and token types stay synthetic), and refuses a file holding fewer than max_batch samples.
TEST(OnnxTransformer, LoadgenPoolTakesTheSamplesOfAnInputsFile) {
  const Embeddings e;
  test::TempDir dir;
  dir.write("bert.onnx", e.model());
  const std::string file = (dir.path() / "bert.onnx").string();
  const auto write_ids = [&](const std::string& name, std::int64_t samples) {
    std::vector<std::int64_t> ids;
    for (double v : random_ids(test::seed(), samples * Embeddings::seq, Embeddings::vocab))
      ids.push_back(static_cast<std::int64_t>(v));
    dir.write(name, std::string(reinterpret_cast<const char*>(ids.data()), ids.size() * sizeof(std::int64_t)));
    return (dir.path() / name).string();
  };
  const std::string ids = write_ids("ids.i64", 4), short_ids = write_ids("short.i64", 3);
  const auto loadgen = [&](const std::string& inputs) {
    return test::accelbench({"run", "loadgen", "--device", "cpu", "--axis", "sut=" + file, "--axis", "scenario=offline",
                             "--axis", "samples=8", "--axis", "max_batch=4", "--option", "inputs=input_ids:" + inputs,
                             "--out", dir.path().string(), "-q"});
  };
  const test::Ran o = loadgen(ids);
  ASSERT_EQ(o.code, 0) << o.output;
  const std::vector<nlohmann::json> records = test::read_records(dir.path());
  ASSERT_EQ(records.size(), 1u) << o.output;
  EXPECT_EQ(records[0]["status"], "ok") << records[0].dump();
  EXPECT_EQ(records[0]["metrics"]["model"]["inputs_file"], "input_ids:" + ids);

  const test::Ran short_run = loadgen(short_ids);
  EXPECT_NE(short_run.code, 0) << short_run.output;
  EXPECT_NE(short_run.output.find("holds fewer than 4 samples"), std::string::npos) << short_run.output;
  const test::Ran builtin = test::accelbench({"run", "loadgen", "--device", "cpu", "--axis", "sut=gemm", "--option",
                                              "inputs=" + ids, "--out", dir.path().string(), "-q"});
  EXPECT_NE(builtin.code, 0);
  EXPECT_NE(builtin.output.find("feeds an ONNX model SUT"), std::string::npos) << builtin.output;
}

// ---- attention

struct AttentionSpec {
  bool shared = false;       // one projection for Q, K and V (their head transpose read thrice)
  bool sqrt_scales = false;  // scaled_dot_product_attention's export: sqrt(scale) on Q and on K^T
  double scale = 0;          // the scores' scale; 0: 1/sqrt(D)
  bool transpose_k = true;   // false: Q K with K [B, H, T, D] (T == D), not attention
  bool mask = false;         // an attention_mask input, added as (1 - mask) * -10000
  bool nan_guard = false;    // Where(IsNaN(p), 0, p) after the softmax, as SDPA's export zeroes masked rows
  int other_input = -1;      // 0, 1, 2: Q's, K's or V's linear reads a second input x2, not x
  bool q_read_twice = false;  // Q's linear is added to the output too (read by more than its Reshape)
  bool merged = false;        // expected: the three linears built as one
};
constexpr std::int64_t kSeq = 4, kHeads = 2, kDim = 4, kWidth = kHeads * kDim, kBatch = 2;

struct Projections {
  std::vector<double> w[3], b[3];  // W [C, C] as ONNX's MatMul reads it (in, out)
};

Projections projections(std::uint64_t seed) {
  Projections p;
  for (int i = 0; i < 3; ++i) {
    p.w[i] = random_values(seed + 2 * static_cast<std::uint64_t>(i), kWidth * kWidth, -0.6, 0.6);
    p.b[i] = random_values(seed + 2 * static_cast<std::uint64_t>(i) + 1, kWidth, -0.2, 0.2);
  }
  return p;
}

double spec_scale(const AttentionSpec& s) { return s.scale != 0 ? s.scale : 1.0 / std::sqrt(double(kDim)); }

// x [B, T, C] -> heads: PyTorch's export of a BERT self-attention (or, sqrt_scales, of
// scaled_dot_product_attention), context [B, T, C] out.
std::string attention_model(const AttentionSpec& s, const Projections& p) {
  OnnxBuilder m;
  m.input("x", {-1, kSeq, kWidth});
  if (s.mask) m.input("attention_mask", {-1, kSeq}, kInt64);
  if (s.other_input >= 0) m.input("x2", {-1, kSeq, kWidth});
  const char* names[] = {"q", "k", "v"};
  m.init_ints("heads_shape", {4}, {0, 0, kHeads, kDim});
  for (int i = 0; i < (s.shared ? 1 : 3); ++i) {
    const std::string n = names[i];
    m.node("MatMul", {i == s.other_input ? "x2" : "x", m.init(n + ".w", {kWidth, kWidth}, p.w[i])}, {n + ".mm"},
           n + "/MatMul");
    m.node("Add", {m.init(n + ".b", {kWidth}, p.b[i]), n + ".mm"}, {n + ".lin"}, n + "/Add");
    m.node("Reshape", {n + ".lin", "heads_shape"}, {n + ".bthd"});
  }
  OB::attr(m.node("Transpose", {"q.bthd"}, {"q4"}), "perm", std::vector<std::int64_t>{0, 2, 1, 3});
  if (!s.shared) OB::attr(m.node("Transpose", {"v.bthd"}, {"v4"}), "perm", std::vector<std::int64_t>{0, 2, 1, 3});
  if (s.shared) {
    OB::attr(m.node("Transpose", {"q4"}, {"kT"}), "perm", std::vector<std::int64_t>{0, 1, 3, 2});
  } else {
    const std::vector<std::int64_t> perm =
        s.transpose_k ? std::vector<std::int64_t>{0, 2, 3, 1} : std::vector<std::int64_t>{0, 2, 1, 3};
    OB::attr(m.node("Transpose", {"k.bthd"}, {"kT"}), "perm", perm);
  }
  std::string q = "q4", kt = "kT", scores = "scores";
  if (s.sqrt_scales) {
    m.init("root", {}, {std::sqrt(spec_scale(s))});
    m.node("Mul", {"q4", "root"}, {"q_s"});
    m.node("Mul", {"kT", "root"}, {"k_s"});
    q = "q_s", kt = "k_s";
  }
  m.node("MatMul", {q, kt}, {s.sqrt_scales ? "scores" : "raw"});
  if (!s.sqrt_scales) m.node("Div", {"raw", m.init("divisor", {}, {1.0 / spec_scale(s)})}, {"scores"});
  if (s.mask) {
    OB::attr(m.node("Cast", {"attention_mask"}, {"mask_f"}), "to", std::int64_t{::onnx::TensorProto_DataType_FLOAT});
    m.node("Unsqueeze", {"mask_f", m.init_ints("mask_axes", {2}, {1, 2})}, {"mask4"});
    m.node("Sub", {m.init("one", {}, {1.0}), "mask4"}, {"inverted"});
    m.node("Mul", {"inverted", m.init("big", {}, {-10000.0})}, {"additive"});
    m.node("Add", {"scores", "additive"}, {"masked"});
    scores = "masked";
  }
  OB::attr(m.node("Softmax", {scores}, {"probs"}, "self/Softmax"), "axis", std::int64_t{-1});
  std::string probs = "probs";
  if (s.nan_guard) {
    m.node("IsNaN", {"probs"}, {"nan"});
    m.node("Where", {"nan", m.init("zero", {1}, {0.0}), "probs"}, {"guarded"});
    probs = "guarded";
  }
  m.node("MatMul", {probs, s.shared ? "q4" : "v4"}, {"ctx4"});
  OB::attr(m.node("Transpose", {"ctx4"}, {"ctx"}), "perm", std::vector<std::int64_t>{0, 2, 1, 3});
  m.node("Reshape", {"ctx", m.init_ints("out_shape", {3}, {0, 0, kWidth})}, {s.q_read_twice ? "context" : "y"});
  if (s.q_read_twice) m.node("Add", {"context", "q.lin"}, {"y"});
  m.output("y");
  return m.bytes();
}

// The same on the host: softmax(scale Q K^T + mask) V per head (Q K where !transpose_k); the scale
// as the file's float32 constants give it, or (exact_scale) the engine op's own 1/sqrt(D), which
// the importer takes for a file's scale within 1e-6 of it.
std::vector<double> host_attention(const AttentionSpec& s, const Projections& p, const std::vector<double>& x_in,
                                   const std::vector<double>& x2, const std::vector<double>& mask, bool exact_scale) {
  const auto proj = [&](int which) {
    const int i = s.shared ? 0 : which;
    const std::vector<double>& x = which == s.other_input ? x2 : x_in;
    std::vector<double> y(static_cast<std::size_t>(kBatch * kSeq * kWidth));
    for (std::int64_t r = 0; r < kBatch * kSeq; ++r)
      for (std::int64_t o = 0; o < kWidth; ++o) {
        double acc = p.b[i][static_cast<std::size_t>(o)];
        for (std::int64_t c = 0; c < kWidth; ++c)
          acc += x[static_cast<std::size_t>(r * kWidth + c)] * p.w[i][static_cast<std::size_t>(c * kWidth + o)];
        y[static_cast<std::size_t>(r * kWidth + o)] = acc;
      }
    return y;
  };
  const std::vector<double> q = proj(0), k = proj(1), v = proj(2);
  const auto at = [](const std::vector<double>& t, std::int64_t b, std::int64_t pos, std::int64_t h, std::int64_t d) {
    return t[static_cast<std::size_t>(((b * kSeq + pos) * kHeads + h) * kDim + d)];
  };
  const double root = static_cast<float>(std::sqrt(spec_scale(s)));
  const double scale = exact_scale     ? spec_scale(s)
                       : s.sqrt_scales ? root * root
                                       : 1.0 / static_cast<float>(1.0 / spec_scale(s));
  std::vector<double> out(static_cast<std::size_t>(kBatch * kSeq * kWidth));
  for (std::int64_t b = 0; b < kBatch; ++b)
    for (std::int64_t h = 0; h < kHeads; ++h)
      for (std::int64_t i = 0; i < kSeq; ++i) {
        std::vector<double> w(kSeq);
        double top = -1e300, sum = 0;
        for (std::int64_t j = 0; j < kSeq; ++j) {
          double dot = 0;
          for (std::int64_t d = 0; d < kDim; ++d)
            dot += at(q, b, i, h, d) * (s.transpose_k ? at(k, b, j, h, d) : at(k, b, d, h, j));
          w[static_cast<std::size_t>(j)] = dot * scale;
          if (s.mask) w[static_cast<std::size_t>(j)] += (1 - mask[static_cast<std::size_t>(b * kSeq + j)]) * -10000.0;
          top = std::max(top, w[static_cast<std::size_t>(j)]);
        }
        for (double& e : w) sum += (e = std::exp(e - top));
        for (std::int64_t d = 0; d < kDim; ++d) {
          double acc = 0;
          for (std::int64_t j = 0; j < kSeq; ++j) acc += w[static_cast<std::size_t>(j)] / sum * at(v, b, j, h, d);
          const auto at_out = static_cast<std::size_t>(((b * kSeq + i) * kHeads + h) * kDim + d);
          out[at_out] = acc + (s.q_read_twice ? q[at_out] : 0.0);
        }
      }
  return out;
}

// Imported and run; against the host with the engine's scale where it ran the attention op, else
// with the file's.
Result run_attention(const AttentionSpec& s, std::uint64_t seed, bool expect_op) {
  const Projections p = projections(seed);
  const std::vector<double> x = random_values(seed + 10, kBatch * kSeq * kWidth);
  const std::vector<double> x2 = random_values(seed + 11, kBatch * kSeq * kWidth);
  std::vector<double> mask;
  for (std::int64_t i = 0; i < kBatch * kSeq; ++i) mask.push_back(i % kSeq == 0 || mix64(seed, i) % 2 ? 1.0 : 0.0);
  std::vector<std::vector<double>> inputs{x};
  if (s.mask) inputs.push_back(mask);
  if (s.other_input >= 0) inputs.push_back(x2);
  Result r = run_imported(attention_model(s, p), kBatch, inputs);
  EXPECT_EQ(r.attention_ops, expect_op ? 1 : 0);
  EXPECT_LT(max_rel_diff(r.y, host_attention(s, p, x, x2, mask, expect_op)), 1e-12);
  EXPECT_LT(max_rel_diff(r.y, host_attention(s, p, x, x2, mask, false)), 1e-6);
  // Three linears of x as one: no concat, two linear ops fewer (the output's Reshape is a view).
  const bool one_linear = std::any_of(r.fused.begin(), r.fused.end(), [](const std::string& f) {
    return f.find("q/k/v one linear") != std::string::npos;
  });
  EXPECT_EQ(one_linear, s.merged);
  if (s.merged) {
    EXPECT_EQ(r.ops["concat"], 0);
    EXPECT_EQ(r.ops["linear"], 1);
  } else if (!s.shared && expect_op) {
    EXPECT_EQ(r.ops["concat"], 1);
    EXPECT_EQ(r.ops["linear"], 3);
  }
  return r;
}

bool lists_attention(const Result& r) {
  return std::any_of(r.fused.begin(), r.fused.end(),
                     [](const std::string& f) { return f.find("attention") != std::string::npos; });
}

TEST(OnnxTransformer, ExportedAttentionRunsTheEngineAttentionOp) {
  AttentionSpec bert;  // Div by sqrt(D); three linears of x, built as one
  bert.merged = true;
  EXPECT_TRUE(lists_attention(run_attention(bert, 401, true)));
  AttentionSpec sdpa;
  sdpa.sqrt_scales = true;  // sqrt(1/sqrt(D)) on Q and on K^T, the NaN guard after the softmax
  sdpa.nan_guard = true;
  sdpa.merged = true;
  run_attention(sdpa, 402, true);
  AttentionSpec shared;  // one head transpose read by Q, K and V: packed by the engine
  shared.shared = true;
  shared.sqrt_scales = true;
  EXPECT_TRUE(lists_attention(run_attention(shared, 403, true)));
}

// Q, K and V from linears of two inputs, or Q's linear read by another node too: three linears and
// a concat, as the heads are read in place.
TEST(OnnxTransformer, ProjectionsOfAnotherInputStayThreeLinears) {
  for (int other = 0; other < 3; ++other) {
    SCOPED_TRACE(other);
    AttentionSpec s;
    s.other_input = other;
    EXPECT_TRUE(lists_attention(run_attention(s, 421 + static_cast<std::uint64_t>(other), true)));
  }
  AttentionSpec twice;
  twice.q_read_twice = true;
  EXPECT_TRUE(lists_attention(run_attention(twice, 425, true)));
}

// torchvision's MultiheadAttention as ViT exports it: x [B, T, C] transposed to [T, B, C], one
// in-projection linear [C, 3C], then Reshape [T, B, 3, C], Unsqueeze, Transpose [3, 1, 2, 0, 4],
// Squeeze, a Gather per part, Reshape [T, B*H, D], Transpose and Reshape to [B, H, T, D]; after
// scaled_dot_product_attention, [B, H, T, D] back to [T*B, C], [T, B, C] and [B, T, C].
std::string sequence_first_attention_model(const Projections& p) {
  OnnxBuilder m;
  m.input("x", {-1, kSeq, kWidth});
  std::vector<double> w(static_cast<std::size_t>(kWidth * 3 * kWidth)), b;
  for (std::int64_t c = 0; c < kWidth; ++c)
    for (std::int64_t part = 0; part < 3; ++part)
      for (std::int64_t o = 0; o < kWidth; ++o)
        w[static_cast<std::size_t>(c * 3 * kWidth + part * kWidth + o)] =
            p.w[part][static_cast<std::size_t>(c * kWidth + o)];
  for (const auto& part : p.b) b.insert(b.end(), part.begin(), part.end());
  const auto perm = [&](::onnx::NodeProto* n, std::vector<std::int64_t> v) { OB::attr(n, "perm", v); };
  perm(m.node("Transpose", {"x"}, {"xt"}), {1, 0, 2});
  m.node("MatMul", {"xt", m.init("in_proj.w", {kWidth, 3 * kWidth}, w)}, {"mm"}, "in_proj/MatMul");
  m.node("Add", {m.init("in_proj.b", {3 * kWidth}, b), "mm"}, {"proj"}, "in_proj/Add");
  m.node("Reshape", {"proj", m.init_ints("split3", {4}, {0, 0, 3, kWidth})}, {"tb3c"});
  m.node("Unsqueeze", {"tb3c", m.init_ints("axis0", {1}, {0})}, {"u"});
  perm(m.node("Transpose", {"u"}, {"parts"}), {3, 1, 2, 0, 4});
  m.node("Squeeze", {"parts", m.init_ints("axis3", {1}, {3})}, {"sq"});
  const char* names[] = {"q", "k", "v"};
  for (std::int64_t i = 0; i < 3; ++i) {
    const std::string n = names[i];
    OB::attr(m.node("Gather", {"sq", m.init_ints(n + ".index", {}, {i})}, {n + ".tbc"}), "axis", std::int64_t{0});
    m.node("Reshape", {n + ".tbc", m.init_ints(n + ".rows", {3}, {0, -1, kDim})}, {n + ".t_bh_d"});
    perm(m.node("Transpose", {n + ".t_bh_d"}, {n + ".bh_t_d"}), {1, 0, 2});
    m.node("Reshape", {n + ".bh_t_d", m.init_ints(n + ".heads", {4}, {-1, kHeads, kSeq, kDim})}, {n + "4"});
  }
  perm(m.node("Transpose", {"k4"}, {"kT"}), {0, 1, 3, 2});
  m.init("root", {}, {std::sqrt(1.0 / std::sqrt(double(kDim)))});
  m.node("Mul", {"q4", "root"}, {"q_s"});
  m.node("Mul", {"kT", "root"}, {"k_s"});
  m.node("MatMul", {"q_s", "k_s"}, {"scores"});
  OB::attr(m.node("Softmax", {"scores"}, {"probs"}, "self/Softmax"), "axis", std::int64_t{-1});
  m.node("MatMul", {"probs", "v4"}, {"ctx4"});
  perm(m.node("Transpose", {"ctx4"}, {"tbhd"}), {2, 0, 1, 3});
  m.node("Reshape", {"tbhd", m.init_ints("tb_c", {2}, {-1, kWidth})}, {"rows"});
  m.node("Reshape", {"rows", m.init_ints("t_b_c", {3}, {kSeq, -1, kWidth})}, {"tbc"});
  perm(m.node("Transpose", {"tbc"}, {"y"}), {1, 0, 2});
  m.output("y");
  return m.bytes();
}

// The heads are traced back to the one in-projection: the op reads it through one [T, B] -> [B, T]
// transpose, and the Unsqueeze ... Reshape chains (left feeding nothing) are not run.
TEST(OnnxTransformer, SequenceFirstHeadsAreReadFromTheInProjection) {
  const Projections p = projections(431);
  const std::vector<double> x = random_values(441, kBatch * kSeq * kWidth);
  const Result r = run_imported(sequence_first_attention_model(p), kBatch, {x});
  EXPECT_EQ(r.attention_ops, 1);
  AttentionSpec sdpa;
  sdpa.sqrt_scales = true;
  EXPECT_LT(max_rel_diff(r.y, host_attention(sdpa, p, x, x, {}, true)), 1e-12);
  EXPECT_TRUE(std::any_of(r.fused.begin(), r.fused.end(), [](const std::string& f) {
    return f.find("q/k/v read from one tensor") != std::string::npos;
  }));
  EXPECT_EQ(r.ops.count("concat"), 0u);
  EXPECT_EQ(r.ops.count("slice"), 0u) << "the Gathers feed nothing";
  // x^T for the in-projection, its [T, B] -> [B, T], the op's output back to heads, and the two after.
  EXPECT_EQ(r.ops.at("transpose"), 5);
  EXPECT_EQ(r.ops.at("linear"), 1);
}

TEST(OnnxTransformer, AttentionThatAlmostMatchesRunsNodeByNode) {
  AttentionSpec scale;  // the scale is not 1/sqrt(D), the engine op's
  scale.scale = 0.3;
  EXPECT_FALSE(lists_attention(run_attention(scale, 411, false)));
  AttentionSpec no_transpose;  // K's heads transposed [0, 2, 1, 3] (T == D): Q K, not Q K^T
  no_transpose.transpose_k = false;
  run_attention(no_transpose, 412, false);
  AttentionSpec masked;  // a padding mask from an input: the op's key lengths cannot hold any mask
  masked.mask = true;
  run_attention(masked, 413, false);
  masked.nan_guard = true;  // IsNaN then as x - x, Where's condition
  run_attention(masked, 414, false);
}

}  // namespace
}  // namespace ab
