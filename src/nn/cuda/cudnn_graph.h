// cuDNN's backend (graph) API from the raw descriptors of cudnn.h (no cudnn_frontend), shared by
// the families that build operation graphs (the fp8 convolution, cuDNN's fused attention). Every
// descriptor has one RAII owner; every call is checked where it is made, and a failure names the
// call, the descriptor and attribute it was for, the plan's label, cuDNN's status and its last
// message.
#pragma once

#include <cudnn.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace ab::nn::cuda::cudnn_graph {

// One backend descriptor, destroyed with its owner; `name` ("tensor x", "operation graph") and the
// plan's label go into every failure message. `label` must outlive the descriptor.
class Desc {
 public:
  Desc(cudnnBackendDescriptorType_t type, std::string name, const std::string& label);
  cudnnBackendDescriptor_t get() const { return d_.get(); }
  const std::string& name() const { return name_; }

  // `attr_name` is the attribute's enum name, for the message.
  void set(cudnnBackendAttributeName_t attr, const char* attr_name, cudnnBackendAttributeType_t type,
           std::int64_t count, const void* values);
  // Sets one descriptor-valued attribute.
  void set(cudnnBackendAttributeName_t attr, const char* attr_name, const Desc& value);
  cudnnStatus_t try_finalize() { return cudnnBackendFinalize(d_.get()); }
  void finalize();

 private:
  struct Deleter {
    void operator()(void* d) const noexcept { cudnnBackendDestroyDescriptor(d); }
  };
  std::unique_ptr<void, Deleter> d_;
  std::string name_;
  const std::string* label_;
};

#define AB_SET(desc, attr, type, count, values) (desc).set(attr, #attr, type, count, values)
#define AB_SET_DESC(desc, attr, value) (desc).set(attr, #attr, value)

std::string dims_text(const std::vector<std::int64_t>& v);  // "[1, 2, 3]"

struct TensorSpec {
  const char* name;
  std::int64_t id;
  cudnnDataType_t type;
  std::vector<std::int64_t> dims, strides;
  bool is_virtual = false;
  std::int64_t alignment = 16;
  bool by_value = false;  // a scalar passed in the variant pack by host pointer
};
Desc make_tensor(const TensorSpec& t, const std::string& label);

// An execution plan that finalized, with what identifies it.
struct Candidate {
  std::unique_ptr<Desc> plan;
  std::string name;  // "engine 12 (heuristics mode A config 1 of 3)"
  std::int64_t workspace_bytes = 0;
  std::string json;
};

// The plans of a finalized operation graph: every configuration heuristics `mode` ranks that
// finalizes into an execution plan, appended to `out`; each refusal goes to `refusals`. The engine
// configurations stay alive in `configs`, beside their plans.
void try_heuristics(cudnnHandle_t handle, const Desc& graph, cudnnBackendHeurMode_t mode, const std::string& label,
                    std::string& refusals, std::vector<Candidate>& out, std::vector<std::unique_ptr<Desc>>& configs);

// A finalized operation graph of `ops`; throws Unsupported where cuDNN refuses the graph.
std::unique_ptr<Desc> make_graph(cudnnHandle_t handle, const std::vector<cudnnBackendDescriptor_t>& ops,
                                 const std::string& label);

// Runs `plan` on the tensors `ids` at `ptrs` (device pointers; host pointers for by-value scalars).
cudnnStatus_t execute(cudnnHandle_t handle, const Desc& plan, const std::vector<std::int64_t>& ids,
                      const std::vector<void*>& ptrs, void* workspace, const std::string& label);

}  // namespace ab::nn::cuda::cudnn_graph
