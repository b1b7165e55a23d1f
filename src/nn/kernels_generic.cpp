// The defaults of the generic inference kernels (nn/kernels.h): a backend without them refuses,
// so a graph that needs one is refused at its first call with the reason.
#include "core/error.h"
#include "nn/kernels.h"

namespace ab::nn {
namespace {
[[noreturn]] void no_generic_kernel(std::string_view backend, const char* kernel) {
  throw Unsupported(std::string(backend) + " kernels have no " + kernel + " (generic inference ops)");
}
}  // namespace

void Kernels::unary_forward(const UnaryAttrs&, const Tensor&, const Tensor&) {
  no_generic_kernel(name(), "unary_forward");
}
void Kernels::binary_forward(BinaryKind, const Tensor&, const Tensor&, const Tensor&) {
  no_generic_kernel(name(), "binary_forward");
}
void Kernels::where_forward(const Tensor&, const Tensor&, const Tensor&, const Tensor&) {
  no_generic_kernel(name(), "where_forward");
}
void Kernels::copy_strided(const Tensor&, const Tensor&) { no_generic_kernel(name(), "copy_strided"); }
void Kernels::softmax_forward(int, const Tensor&, const Tensor&) { no_generic_kernel(name(), "softmax_forward"); }
void Kernels::reduce_mean_forward(const Tensor&, const Tensor&) { no_generic_kernel(name(), "reduce_mean_forward"); }
void Kernels::avgpool_forward(const Pool2dDesc&, bool, const Tensor&, const Tensor&) {
  no_generic_kernel(name(), "avgpool_forward");
}
void Kernels::resize_forward(bool, const Tensor&, const Tensor&) { no_generic_kernel(name(), "resize_forward"); }
void Kernels::matmul_forward(const Tensor&, const Tensor&, const Tensor&) {
  no_generic_kernel(name(), "matmul_forward");
}
void Kernels::gather_forward(int, const Tensor&, const Tensor&, const Tensor&) {
  no_generic_kernel(name(), "gather_forward");
}

}  // namespace ab::nn
