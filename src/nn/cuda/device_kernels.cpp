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

std::vector<std::string> device_conv_algorithm_notes(const Kernels& kernels) {
#ifdef ACCELBENCH_WITH_CUDA
  if (kernels.name() == "cuda") {
    std::vector<std::string> lines = cuda_conv_choices(kernels);
    for (std::string& line : cuda_fp8_notes(kernels)) lines.push_back(std::move(line));
    return lines;
  }
#endif
  (void)kernels;
  return {};
}

}  // namespace ab::nn
