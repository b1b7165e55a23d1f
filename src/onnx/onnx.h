// Users' models: an ONNX file becomes an engine graph (nn::GraphBuilder), so the passes and kernels
// of the built-in models apply to it unchanged (batch-norm folding, the fused convolution epilogue,
// precision policies, one captured graph per batch). docs/ONNX.md lists the ops and the limits.
#pragma once

#include <cstdint>
#include <filesystem>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "nn/graph.h"

namespace ab::onnx {

// How Conv (+ BatchNormalization) (+ Add) (+ Relu) chains are built, as the infer workload's fold
// axis: off = conv2d, batchnorm2d, add, relu ops (a convolution's own bias as a bias_act); on = the
// batch norm folded into the weights, one bias_act epilogue; fused = that epilogue inside the
// convolution (conv_bias_act).
enum class Fold { off, on, fused };

// One graph input: its shape with the batch at 1; integer (int64/int32 in the file) inputs that
// only index Gather tables (token ids) with the fewest rows of those tables.
struct InputFacts {
  std::string name;
  Shape shape;
  bool integer = false;
  bool indices = false;
  std::int64_t index_rows = 0;
};

// What a record says about the model (the `onnx` block).
struct ModelFacts {
  std::string file_name;
  std::int64_t file_bytes = 0;                       // the .onnx file alone (external data not counted)
  std::string sha256;                                // of the .onnx file
  std::int64_t opset = 0;                            // of the default domain
  std::string producer;                              // "pytorch 2.11"
  std::map<std::string, std::int64_t> op_histogram;  // node count per op type, as in the file
  std::string input_name, output_name;               // input_name, input_shape: the first input's
  Shape input_shape;                                 // with the batch at 1
  bool symbolic_batch = false;                       // dim 0 of the inputs is a dim_param or unknown
  std::vector<InputFacts> inputs;                    // every input, the first included, in the file's order
  std::int64_t initializer_elements = 0;
};

// A parsed, validated ONNX model whose batch-independent constants are folded (Constant nodes,
// initializers, arithmetic on them). Immutable: one Model serves any number of graphs.
class Model {
 public:
  // Reads `path` and the external-data files beside it. UsageError (nothing built) for an unreadable,
  // truncated or corrupt file, a missing external-data file, an opset outside
  // [kMinOpset, max_opset()], an unsupported data type, an input dimension other than the batch
  // that is not fixed, batch dimensions that differ between inputs, or ops with no mapping: every such node listed
  // at once with its name and the counts per op type.
  static std::shared_ptr<const Model> load(const std::filesystem::path& path);
  // The same from bytes in memory (tests, fuzzing); external data is looked for under `dir`.
  static std::shared_ptr<const Model> parse(const std::string& bytes, const std::string& file_name,
                                            const std::filesystem::path& dir = {});
  ~Model();
  const ModelFacts& facts() const;

  struct State;
  explicit Model(std::unique_ptr<State> s);
  const State& state() const { return *s_; }

 private:
  std::unique_ptr<State> s_;
};

constexpr std::int64_t kMinOpset = 13;
std::int64_t max_opset();  // the newest opset of the default domain this build's libonnx knows

struct ImportOptions {
  std::int64_t batch = 1;  // bound to the symbolic batch dimension; must equal a fixed one
  Fold fold = Fold::fused;
};

// The model in a graph: its first input [batch, ...] (the graph's activation dtype; i32 for token
// ids) and every input in facts().inputs' order, its output (marked),
// and the parameter values by the names the builders gave them, for Graph::set_parameter_values
// after bind (batch norms already folded where options.fold asks).
struct Imported {
  nn::Value input, output;
  std::vector<nn::Value> inputs;
  nn::ParameterValues parameters;
  std::vector<std::string> fused;  // one line per fused chain: "Conv+BatchNormalization+Relu: <node>"
};
// Adds the model to `b`. UsageError for what only the bound batch shows (a shape that does not fit,
// a dynamic shape the folding cannot make static), naming the node. In a graph of precision fp8
// (fold must be fused) each conv_bias_act and linear layer the ResNet builder's rule lets run
// e4m3 (models::fp8_conv_eligible, fp8_linear_eligible) is built to, everything else in fp16;
// UsageError where no layer is.
Imported import(nn::GraphBuilder& b, const Model& m, const ImportOptions& options);

// What `accelbench inspect` prints: facts, the engine graph at batch 1 (parameters, FLOPs per
// sample, its op kinds), the fused chains, and every unsupported node (then no graph figures).
struct Inspection {
  ModelFacts facts;
  std::int64_t parameters = 0;
  std::int64_t flops_per_sample = 0;
  std::map<std::string, std::int64_t> engine_ops;  // op count per engine kind
  std::vector<std::string> fused;
  std::vector<std::string> unsupported;  // "Op (count): node, node, ..."
  std::string error;                     // why no graph could be built, if none could
};
// Never throws for a model that parses: what cannot be imported lands in `unsupported` or `error`.
Inspection inspect(const std::filesystem::path& path);
std::string to_text(const Inspection& i);

}  // namespace ab::onnx
