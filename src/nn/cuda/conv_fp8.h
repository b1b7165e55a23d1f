// fp8 (e4m3) convolution; ConvEngine::conv2d_fp8_* (conv_fp8_layer.cpp) runs it:
// - Fp8ConvPlan: one NHWC convolution on cuDNN's backend (graph) API,
//     y = act(conv(x, w) * descale (+ bias)),
//   x [N, H, W, C] and w [K, R, S, C] e4m3, accumulated in f32, y [N, P, Q, K] f16 or bf16.
// - The quantization kernels (fp8_quant.cu): amax of a tensor and its e4m3 image with the
//   per-tensor scale 448 / amax computed on the device, plus the descale the convolution takes.
// Free of CUDA and cuDNN headers (streams travel as void*, as backend::cuda::native_stream gives
// them), so tests and later callers need neither include path. Device pointers throughout.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "core/dtype.h"
#include "nn/kernels.h"

namespace ab::nn::cuda {

// One fp8 convolution: x [N, H, W, C] e4m3 NHWC, w [K, R, S, C] e4m3 KRSC (groups = 1), an
// optional f32 bias [K] added after the descale, an optional ReLU, y [N, P, Q, K] in `out`.
struct Fp8ConvShape {
  std::int64_t n = 1, h = 1, w = 1, c = 16;
  std::int64_t k = 16, r = 1, s = 1;
  Conv2dDesc conv;  // stride, padding, dilation; groups must be 1
  bool bias = false;
  bool residual = false;  // y = act(... + bias + residual), residual [N, P, Q, K] in `out`'s type
  bool relu = false;
  DType out = DType::f16;  // f16 or bf16

  std::int64_t p() const;  // output height
  std::int64_t q() const;  // output width
  // "fp8 conv x e4m3[N 4, H 8, W 8, C 32] nhwc, w e4m3[K 64, R 3, S 3, C 32], stride 1x1, ..."
  std::string to_string() const;
};

// Why the fp8 convolution cannot take `shape` (alignment, groups, output type, empty output),
// empty where it may (cuDNN still decides); decided without any cuDNN or CUDA call. The alignment
// is nn::kFp8ConvChannelMultiple, the rule nn::fp8_conv_refusal states for tensors (and the
// reference enforces); this one takes a bare shape.
std::string fp8_conv_refusal(const Fp8ConvShape& shape);

// The cuDNN graph CONVOLUTION_FORWARD (f32 compute, the output a virtual f32 tensor) -> POINTWISE
// MUL by descale (f32 [1] by device pointer) -> optional POINTWISE ADD bias [1, K, 1, 1] ->
// optional POINTWISE ADD residual -> optional POINTWISE RELU_FWD -> y, with the fastest (timed at
// construction on scratch operands) of the execution plans that finalize among the engine
// configurations of cuDNN's heuristics mode A (FALLBACK's where A has none). Owns its cuDNN handle, bound to
// `stream` (a cudaStream_t) on the current device.
class Fp8ConvPlan {
 public:
  // Throws Unsupported before any cuDNN call where fp8_conv_refusal objects, and after the search
  // where no engine configuration finalizes (naming the shape and each refusal's cuDNN status);
  // Error naming the cuDNN call, descriptor and status for anything else.
  Fp8ConvPlan(const Fp8ConvShape& shape, void* stream);
  ~Fp8ConvPlan();
  Fp8ConvPlan(Fp8ConvPlan&&) noexcept;
  Fp8ConvPlan& operator=(Fp8ConvPlan&&) noexcept;
  Fp8ConvPlan(const Fp8ConvPlan&) = delete;
  Fp8ConvPlan& operator=(const Fp8ConvPlan&) = delete;

  const Fp8ConvShape& shape() const;
  std::int64_t workspace_bytes() const;
  // The chosen engine: "engine 12 (heuristics mode A, config 1 of 3), workspace 0 B; refused before
  // it: ...", for logs and the record.
  const std::string& engine() const;
  // cuDNN's JSON description of the execution plan (the engine's name and knobs); empty where
  // cuDNN did not give one.
  const std::string& plan_json() const;

  // Queues the convolution on the plan's stream. x, w: the e4m3 bytes; descale: f32 [1], the
  // product of x's and w's descales (fp8_multiply_scalars); bias: f32 [K] exactly when the shape
  // has one; y: f16/bf16; ws: at least workspace_bytes(); residual: y's type and shape exactly when
  // the shape has one. Every pointer 16-byte aligned (the descale 4-byte). Throws Error naming the
  // failed call and status.
  void execute(const void* x, const void* w, const float* descale, const float* bias, void* y, Workspace ws,
               const void* residual = nullptr) const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// ---- quantization kernels (fp8_quant.cu); every call enqueues on `stream` and returns: no
// allocation, no host sync, so a sequence can be captured into a CUDA graph. x: n elements of
// dtype t (f32, f16 or bf16; others throw Unsupported). A failed launch throws Error.

// amax[0] = max |x[i]| (0 for n = 0; NaN where any element is NaN). Exact: a max has no rounding,
// and the order of the reduction cannot change it.
void fp8_amax(void* stream, DType t, const void* x, std::int64_t n, float* amax);

// q[i] = e4m3(x[i] * scale), scale = 448 / amax[0] in f32 (1 where that is not a finite positive
// number: an all-zero or non-finite tensor), rounded to nearest even and saturated at +-448, bit
// for bit what the host's float_to_e4m3_bits gives for the f32 product; descale[0] = amax[0] / 448
// (1 with the fallback scale), times `times`[0] in f32 where `times` is given (a convolution's
// descale in one step: x's times w's). `amax` may be this tensor's (fp8_amax) or a calibrated one:
// values beyond it saturate. `descale` must not alias `amax` or `times`.
void fp8_quantize_e4m3(void* stream, DType t, const void* x, std::int64_t n, const float* amax, std::uint8_t* q,
                       float* descale, const float* times = nullptr);

// out[0] = a[0] * b[0] in f32: the convolution's descale from x's and w's.
void fp8_multiply_scalars(void* stream, const float* a, const float* b, float* out);

}  // namespace ab::nn::cuda
