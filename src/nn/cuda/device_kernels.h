// The engine's kernels for a micro-benchmark backend's device: the CUDA kernels (cuDNN, cuBLASLt
// and the project's own) on a `cuda:N` backend, on that backend's stream so its timer measures
// them; the reference kernels on `cpu`. Workloads that run models get their kernels here.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "nn/kernels.h"

namespace ab::nn {

// Throws Unsupported when the backend's device has no engine kernels in this build.
std::unique_ptr<Kernels> make_device_kernels(backend::Backend& backend);

// The convolution choices the CUDA kernels made so far (cuda_conv_choices, then cuda_fp8_notes),
// for a record; empty for the reference kernels, which choose nothing.
std::vector<std::string> device_conv_algorithm_notes(const Kernels& kernels);

}  // namespace ab::nn
