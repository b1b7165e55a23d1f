// Micro-benchmarks (gemm, stream, copy) and the ceilings they measure. Each measured point is
// checked against the reference first; a wrong result fails the point.
#pragma once

#include <memory>

#include "workloads/workload.h"

namespace ab::workloads::micro {

std::unique_ptr<Workload> make_gemm();
std::unique_ptr<Workload> make_conv();  // convolution passes over shape tables (conv_shapes.h)
std::unique_ptr<Workload> make_stream();
std::unique_ptr<Workload> make_copy();
std::unique_ptr<Workload> make_ceilings();
std::unique_ptr<Workload> make_collectives();
std::unique_ptr<Workload> make_p2p();
std::unique_ptr<Workload> make_pipeline();  // the host input pipeline (src/data)

// Shared by gemm and ceilings: check op(A) op(B) at a small size against ref, then measure `desc`.
void run_gemm_point(State& state, const backend::GemmDesc& desc);
// Shared by stream and ceilings.
void run_stream_point(State& state, backend::StreamOp op, std::int64_t array_bytes);

}  // namespace ab::workloads::micro
