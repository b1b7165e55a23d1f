#include "nn/cuda/device_kernels.h"

#include "core/error.h"

#ifdef ACCELBENCH_WITH_CUDA
#include "nn/cuda/kernels.h"
#endif

namespace ab::nn {

std::unique_ptr<Kernels> make_device_kernels(backend::Backend& backend) {
  const auto& kind = backend.info().kind;
  if (kind == "cpu") return make_ref_kernels();
#ifdef ACCELBENCH_WITH_CUDA
  if (kind == "cuda") return make_cuda_kernels(backend);
#endif
  throw Unsupported("no engine kernels for device '" + backend.info().id + "' in this build");
}

}  // namespace ab::nn
