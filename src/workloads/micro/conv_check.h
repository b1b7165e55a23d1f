// The conv workload's result check: entries of a pass's output recomputed in float64 from the
// definition on the host, from the same operands the device used. Independent of every backend's
// convolution code (the reference kernels included), so it checks the CPU run as well.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "workloads/micro/conv_shapes.h"

namespace ab::workloads::micro {

enum class ConvPassKind { forward, backward_data, backward_filter };

// Host values in logical order: x [N, C, H, W], w [K, C, R, S], y [N, K, P, Q], whatever layout the
// device stored them in. One of the three is the pass's output (y, x or w); the others its inputs.
struct ConvHostValues {
  std::vector<double> x, w, y;
  std::vector<double> bias;    // [K] added to the forward output; empty for none
  double forward_descale = 1;  // multiplies the forward sums (fp8: the operands' inverse scales)
};

struct ConvCheckSample {
  std::vector<double> got, want;
  bool whole = false;  // every output entry, or a spread of {first, middle, last} along each dim
};

// The entries compared: every one where the recomputation costs at most `whole_limit_macs`
// multiply-adds, else the spread. `got` is read from the output in `values`.
ConvCheckSample conv_check_sample(ConvPassKind pass, const ConvShape& s, const ConvHostValues& values,
                                  std::int64_t whole_limit_macs);

// The fp8 forward's operand rounding (nn/kernels.h, conv2d_fp8_forward): values scaled by 448 / max|v|
// in f32, rounded to e4m3, and the scale's inverse returned (1 where 448 / max|v| is not finite).
double quantize_e4m3_per_tensor(std::vector<double>& values);

// rel_error's tolerance for a conv output in `precision` ("fp32", "tf32", "fp16", "bf16", "fp8").
double conv_tolerance(const std::string& precision);

}  // namespace ab::workloads::micro
