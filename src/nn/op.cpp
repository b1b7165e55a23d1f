#include "nn/op.h"

#include <utility>

namespace ab::nn {

std::vector<Tensor> Op::infer(const std::vector<Tensor>& inputs) {
  in_ = inputs;
  for (auto& t : in_) t.data = nullptr;  // descriptors only: an op never holds storage
  out_ = do_infer(in_);
  return out_;
}

void Op::set_placed_outputs(std::vector<Tensor> placed) {
  out_ = std::move(placed);
  for (auto& t : out_) t.data = nullptr;
}

void Op::require(bool ok, const std::string& reason) const {
  if (!ok) fail(reason);
}

void Op::fail(const std::string& reason) const {
  throw LayerError("layer '" + name_ + "' (" + std::string(kind()) + "): " + reason);
}

void Op::require_float(const Tensor& t) const {
  require(is_float(t.dtype), "input dtype " + std::string(to_string(t.dtype)) + " is not a floating type");
}

void Op::require_conv_geometry(const Tensor& x, std::int64_t out_channels, std::int64_t kernel_h,
                               std::int64_t kernel_w, const Conv2dDesc& c) const {
  require(x.shape.rank() == 4, "input must be [N, C, H, W], got " + x.shape.to_string());
  require_float(x);
  require(out_channels >= 1 && kernel_h >= 1 && kernel_w >= 1, "out_channels and kernel must be >= 1");
  require(c.stride_h >= 1 && c.stride_w >= 1, "stride must be >= 1");
  require(c.dilation_h >= 1 && c.dilation_w >= 1, "dilation must be >= 1");
  require(c.pad_h >= 0 && c.pad_w >= 0, "padding must be >= 0");
  require(c.groups >= 1, "groups must be >= 1");
  require(x.shape[1] % c.groups == 0, "input channels " + std::to_string(x.shape[1]) + " not divisible by groups " +
                                          std::to_string(c.groups));
  require(out_channels % c.groups == 0, "output channels " + std::to_string(out_channels) +
                                            " not divisible by groups " + std::to_string(c.groups));
}

void Op::require_optional_residual(const std::vector<Tensor>& in, const Shape& out_shape) const {
  require(in.size() == 1 || in.size() == 2, "takes x and an optional residual, got " + std::to_string(in.size()) +
                                                " inputs");
  if (in.size() < 2) return;
  require(in[1].shape == out_shape,
          "residual shape " + in[1].shape.to_string() + " differs from the output's " + out_shape.to_string());
  require(in[1].dtype == in[0].dtype, "residual dtype differs from the input's");
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
