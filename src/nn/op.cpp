#include "nn/op.h"

namespace ab::nn {

std::vector<Tensor> Op::infer(const std::vector<Tensor>& inputs) {
  in_ = inputs;
  for (auto& t : in_) t.data = nullptr;  // descriptors only: an op never holds storage
  out_ = do_infer(in_);
  return out_;
}

void Op::require(bool ok, const std::string& reason) const {
  if (!ok) fail(reason);
}

void Op::fail(const std::string& reason) const {
  throw LayerError("layer '" + name_ + "' (" + std::string(kind()) + "): " + reason);
}

std::int64_t Op::element_bytes() const {
  return in_.empty() ? 0 : static_cast<std::int64_t>(size_bytes(in_[0].dtype));
}

std::int64_t Op::prepare(Kernels& k, const OpTensors& descs) {
  for (const auto* group : {&descs.in, &descs.out, &descs.params, &descs.saved})
    for (const auto& t : *group) k.check_tensor(t);
  return 0;
}

}  // namespace ab::nn
