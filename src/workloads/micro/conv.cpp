// The conv micro-benchmark: one convolution pass (forward, backward data or backward filter) of a
// shape from a table (conv_shapes.h) or given explicitly, through the engine's kernels: cuDNN with
// the engine's algorithm search on CUDA (nn/cuda/conv.cpp), the float64 reference on the CPU.
#include <chrono>
#include <vector>

#include "backend/ref/ref.h"
#include "core/checked.h"
#include "core/error.h"
#include "core/rng.h"
#include "core/tensor.h"
#include "nn/cuda/device_kernels.h"
#include "nn/kernels.h"
#include "workloads/micro/conv_check.h"
#include "workloads/micro/conv_shapes.h"
#include "workloads/micro/micro.h"

namespace ab::workloads::micro {
namespace {

// Outputs recomputed whole on the host when that costs at most this many multiply-adds; above it
// a spread of entries (conv_check.h).
constexpr std::int64_t kWholeCheckMacs = std::int64_t{1} << 24;

const std::vector<std::string> kPasses{"fwd", "bwd_data", "bwd_filter"};
const std::vector<std::string> kPrecisions{"fp32", "tf32", "fp16", "bf16", "fp8"};
const std::vector<std::string> kExplicitAxes{"n", "c", "h", "w", "k", "r", "s", "pad", "stride"};

ConvPassKind parse_pass(const std::string& pass) {
  if (pass == "fwd") return ConvPassKind::forward;
  if (pass == "bwd_data") return ConvPassKind::backward_data;
  return ConvPassKind::backward_filter;
}

// The storage type of a precision's operands; fp8 stores 16 bits and the kernel quantizes to e4m3.
DType storage_dtype(const std::string& precision) {
  if (precision == "fp16") return DType::f16;
  if (precision == "bf16" || precision == "fp8") return DType::bf16;
  return DType::f32;
}

std::string valid_shapes() {
  std::string out = "custom (with n, c, h, w, k, r, s, pad, stride)";
  for (const auto& [table, rows] : conv_tables())
    out += ", " + rows.front().name + " .. " + rows.back().name + " (@" + table + ")";
  return out;
}

// The point's shape: a named table row, or shape=custom and the explicit axes (which a named row
// leaves at 0, so that a record never shows two different shapes).
ConvShape resolve_shape(const State& state) {
  const std::string& name = state.get_text("shape");
  std::vector<std::int64_t> given;
  bool any_given = false;
  for (const std::string& axis : kExplicitAxes) {
    given.push_back(state.get_int(axis));
    any_given = any_given || given.back() != 0;
  }
  if (name == "custom") {
    ConvShape s{given[0], given[1], given[2], given[3], given[4], given[5],
                given[6], given[7], given[7], given[8], given[8]};
    check_conv_shape(s);
    return s;
  }
  if (any_given)
    throw UsageError("conv shape '" + name +
                     "' is a table row; explicit n, c, h, w, k, r, s, pad, stride need "
                     "shape=custom");
  const auto row = find_conv_shape(name);
  if (!row) throw UsageError("unknown conv shape '" + name + "'; valid: " + valid_shapes());
  return *row;
}

// Fresh random values in [-1, 1) for every element (the output too, so that a pass which wrote
// nothing cannot pass the check), uploaded in the tensor's layout.
void fill_random(nn::Kernels& k, const Tensor& t, std::uint64_t seed) {
  std::vector<double> values(static_cast<std::size_t>(t.numel()));
  for (std::size_t i = 0; i < values.size(); ++i) values[i] = uniform(seed, i, -1.0, 1.0);
  nn::upload_values(k, t, values);
}

// The device operands of one point: x, w, y in the point's layout (one of them the pass's output),
// and for fp8 the forward's bias [K].
struct ConvOperands {
  Buffer x_buf, w_buf, y_buf, bias_buf, workspace_buf;
  Tensor x, w, y, bias;
  nn::Workspace workspace;
};

ConvOperands allocate(nn::Kernels& k, const ConvShape& s, DType dtype, Layout layout, bool bias) {
  const DeviceKind device = k.allocator().device();
  ConvOperands o;
  const Tensor xd = Tensor::describe(dtype, Shape{s.n, s.c, s.h, s.w}, layout, device);
  const Tensor wd = Tensor::describe(dtype, Shape{s.k, s.c, s.r, s.s}, layout, device);
  const Tensor yd = Tensor::describe(dtype, Shape{s.n, s.k, s.p(), s.q()}, layout, device);
  o.x_buf = Buffer(k.allocator(), xd.size_bytes());
  o.w_buf = Buffer(k.allocator(), wd.size_bytes());
  o.y_buf = Buffer(k.allocator(), yd.size_bytes());
  o.x = o.x_buf.view(xd);
  o.w = o.w_buf.view(wd);
  o.y = o.y_buf.view(yd);
  if (bias) {
    const Tensor bd = Tensor::describe(dtype, Shape{s.k}, Layout::nchw, device);
    o.bias_buf = Buffer(k.allocator(), bd.size_bytes());
    o.bias = o.bias_buf.view(bd);
  }
  const std::uint64_t seed = fresh_seed();
  std::uint64_t n = 0;
  for (const Tensor* t : {&o.x, &o.w, &o.y, &o.bias})
    if (t->defined()) fill_random(k, *t, seed + 0x100000000ULL * n++);
  return o;
}

// The engine's record of what it chose for this point's pass (cuDNN's algorithm with every timed
// candidate, or the fp8 engine), or what the reference runs.
std::string chosen_algorithm(const nn::Kernels& k, ConvPassKind pass, bool fp8) {
  if (k.name() == "ref") return "ref: float64 direct loops";
  const char* tag = pass == ConvPassKind::forward         ? ": forward algo"
                    : pass == ConvPassKind::backward_data ? ": backward-data algo"
                                                          : ": backward-filter algo";
  std::string out;
  for (const std::string& line : nn::device_conv_algorithm_notes(k))
    if (fp8 || line.find(tag) != std::string::npos) out += (out.empty() ? "" : "; ") + line;
  return out;
}

class ConvPoint {
 public:
  ConvPoint(State& state, const ConvShape& shape, ConvPassKind pass, const std::string& precision, Layout layout)
      : state_(state),
        shape_(shape),
        pass_(pass),
        precision_(precision),
        fp8_(precision == "fp8"),
        kernels_(nn::make_device_kernels(state.backend())) {
    if (precision == "tf32") kernels_->set_tf32(true);
    if (fp8_) kernels_->set_fp8_only_where_faster(false);  // measure the fp8 kernel itself
    ops_ = allocate(*kernels_, shape, storage_dtype(precision), layout, fp8_);
  }

  // The engine's algorithm search, outside the timed samples; the workspace it asks for.
  void prepare() {
    const auto start = std::chrono::steady_clock::now();
    const nn::Conv2dDesc d = desc();
    const std::int64_t bytes =
        fp8_ ? kernels_->conv2d_fp8_prepare(d, ops_.x, ops_.w, ops_.bias, Tensor{}, ops_.y, false)
             : kernels_->conv2d_prepare(
                   d, ops_.x, ops_.w, ops_.y,
                   nn::ConvPasses{pass_ == ConvPassKind::backward_data, pass_ == ConvPassKind::backward_filter});
    ops_.workspace_buf = Buffer(kernels_->allocator(), bytes);
    ops_.workspace = {ops_.workspace_buf.data(), bytes};
    kernels_->synchronize();
    state_.add_metric("search_s", std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
    state_.add_metric("workspace_bytes", bytes);
    state_.add_metric("algorithm", chosen_algorithm(*kernels_, pass_, fp8_));
  }

  void launch() {
    const nn::Conv2dDesc d = desc();
    if (fp8_) kernels_->conv2d_fp8_forward(d, ops_.x, ops_.w, ops_.bias, Tensor{}, ops_.y, false, ops_.workspace);
    else if (pass_ == ConvPassKind::forward) kernels_->conv2d_forward(d, ops_.x, ops_.w, ops_.y, ops_.workspace);
    else if (pass_ == ConvPassKind::backward_data)
      kernels_->conv2d_backward_data(d, ops_.y, ops_.w, ops_.x, false, ops_.workspace);
    else kernels_->conv2d_backward_filter(d, ops_.x, ops_.y, ops_.w, ops_.workspace);
  }

  // One run on the fresh operands, its output against float64 from the operands the device holds.
  void check() {
    launch();
    kernels_->synchronize();
    ConvHostValues v{nn::download_values(*kernels_, ops_.x),
                     nn::download_values(*kernels_, ops_.w),
                     nn::download_values(*kernels_, ops_.y),
                     {}};
    if (fp8_) {
      v.bias = nn::download_values(*kernels_, ops_.bias);
      v.forward_descale = quantize_e4m3_per_tensor(v.x) * quantize_e4m3_per_tensor(v.w);
    }
    const ConvCheckSample sample = conv_check_sample(pass_, shape_, v, kWholeCheckMacs);
    state_.check(backend::ref::rel_error(sample.got, sample.want), conv_tolerance(precision_),
                 (sample.whole ? "every one of " : "a spread of ") + std::to_string(sample.got.size()) +
                     " output entries against float64 from the definition on the same operands");
  }

 private:
  nn::Conv2dDesc desc() const {
    nn::Conv2dDesc d;
    d.stride_h = shape_.stride_h;
    d.stride_w = shape_.stride_w;
    d.pad_h = shape_.pad_h;
    d.pad_w = shape_.pad_w;
    return d;
  }

  State& state_;
  ConvShape shape_;
  ConvPassKind pass_;
  std::string precision_;
  bool fp8_;
  std::unique_ptr<nn::Kernels> kernels_;
  ConvOperands ops_;
};

// Bytes one pass must move: its two inputs read and its output written once, as stored (fp8: the
// 16-bit x and y and the filters' e4m3 image, which the engine keeps between calls).
std::int64_t conv_bytes(const ConvShape& s, const std::string& precision, const backend::DeviceInfo& device) {
  const ConvElements e = conv_elements(s);
  const auto element = static_cast<std::int64_t>(size_bytes(storage_dtype(precision)));
  const std::int64_t filter = precision == "fp8" ? 1 : element;
  const std::int64_t xy =
      checked_mul(checked_add(e.x, e.y, "conv input and output elements"), element, "conv input and output bytes");
  const std::int64_t bytes = checked_add(xy, checked_mul(e.w, filter, "conv filter bytes"), "conv bytes");
  check_fits_memory(bytes, device.memory_bytes, "conv operands x, w and y", device.id);
  return bytes;
}

void record_shape(State& state, const ConvShape& s) {
  state.add_metric("conv_shape", {{"n", s.n},
                                  {"c", s.c},
                                  {"h", s.h},
                                  {"w", s.w},
                                  {"k", s.k},
                                  {"r", s.r},
                                  {"s", s.s},
                                  {"pad_h", s.pad_h},
                                  {"pad_w", s.pad_w},
                                  {"stride_h", s.stride_h},
                                  {"stride_w", s.stride_w},
                                  {"p", s.p()},
                                  {"q", s.q()}});
}

class Conv final : public Workload {
 public:
  std::string name() const override { return "conv"; }
  bool has_counter_pass() const override { return true; }
  std::string description() const override {
    return "One 2-D convolution pass (forward, backward data, backward filter) of DeepBench's and ResNet-50's "
           "shapes or a custom one: the engine's cuDNN path with its algorithm search on CUDA, the float64 "
           "reference on CPU. TFLOP/s and % of the GEMM ceiling of the same precision.";
  }
  std::vector<AxisSpec> axes(const std::string& device_kind) const override {
    const bool gpu = device_kind == "cuda";
    std::vector<std::string> shapes;
    for (const NamedConvShape& row : conv_tables().at(gpu ? "resnet50" : "tiny")) shapes.push_back(row.name);
    std::vector<AxisSpec> out{{"shape",
                               AxisKind::text,
                               shapes,
                               {},
                               "a table row (tables: @deepbench-train, @deepbench-infer-server, "
                               "@deepbench-infer-device, @resnet50, @tiny), or custom with the axes below"}};
    for (const std::string& axis : kExplicitAxes)
      out.push_back({axis,
                     AxisKind::integer,
                     {"0"},
                     {},
                     axis == kExplicitAxes.front() ? "with shape=custom (zipped: n,c,h,w,k,r,s,pad,stride=...): "
                                                     "batch, channels, height, width, filters, filter rows and "
                                                     "columns, padding, stride; 0 with a table row"
                                                   : "with shape=custom (see n)"});
    out.push_back({"pass", AxisKind::text, kPasses, kPasses, "fwd, bwd_data (dx from dy) or bwd_filter (dw)"});
    out.push_back({"precision", AxisKind::text, gpu ? kPrecisions : std::vector<std::string>{"fp32"}, kPrecisions,
                   "operand precision; fp8 (e4m3 operands, bf16 output) runs forward only"});
    out.push_back({"layout",
                   AxisKind::text,
                   {gpu ? "nhwc" : "nchw"},
                   {"nchw", "nhwc"},
                   "memory order of x, y (and filters: KCRS or KRSC)"});
    return out;
  }
  std::vector<ZipGroup> zip_groups() const override {
    return {{{"shape"}, conv_shape_axis_tables()}, {kExplicitAxes, {}}};
  }
  void run(State& state) override {
    const ConvShape shape = resolve_shape(state);
    const ConvPassKind pass = parse_pass(state.get_text("pass"));
    const std::string& precision = state.get_text("precision");
    record_shape(state, shape);
    if (precision == "fp8" && pass != ConvPassKind::forward)
      state.skip(
          "fp8 convolutions run forward only: the engine's fp8 path (cuDNN's e4m3 graph) is an inference "
          "path with no backward passes");
    const std::int64_t bytes = conv_bytes(shape, precision, state.backend().info());
    state.set_counts({1.0, static_cast<double>(conv_flops(shape)), static_cast<double>(bytes), "FLOP"});
    state.set_ceiling_key("gemm." + precision);
    ConvPoint point(state, shape, pass, precision, parse_layout(state.get_text("layout")));
    point.prepare();
    point.check();
    state.exec([&point] { point.launch(); });
    state.measure_counters({{"conv", [&point] { point.launch(); }}});
  }
};

}  // namespace

std::unique_ptr<Workload> make_conv() { return std::make_unique<Conv>(); }

}  // namespace ab::workloads::micro
