// The CUDA backend: cuBLASLt GEMMs, the project's STREAM kernels, cudaMemcpy copies, CUDA-event
// timing. Built only with ACCELBENCH_CUDA; everything CUDA stays behind this header.
#pragma once

#include <memory>

#include "backend/backend.h"

namespace ab::backend::cuda {

// Number of CUDA devices; 0 where no driver or GPU answers (never throws).
int device_count();
DeviceInfo device_info(int index);
// Throws ab::Error naming the CUDA error when the device cannot be opened.
std::unique_ptr<Backend> make_backend(int index);
// The backend's cudaStream_t, as void* so callers need no CUDA headers (bench/ timing check).
void* native_stream(Backend& backend);

}  // namespace ab::backend::cuda
