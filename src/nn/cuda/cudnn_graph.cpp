#include "nn/cuda/cudnn_graph.h"

#include <utility>

#include "core/error.h"
#include "nn/cuda/common.h"

namespace ab::nn::cuda::cudnn_graph {
namespace {

const char* heur_name(cudnnBackendHeurMode_t mode) {
  switch (mode) {
    case CUDNN_HEUR_MODE_A: return "A";
    case CUDNN_HEUR_MODE_FALLBACK: return "FALLBACK";
    case CUDNN_HEUR_MODE_B: return "B";
    case CUDNN_HEUR_MODE_INSTANT: return "INSTANT";
    default: return "?";
  }
}

// A config's engine ("engine 12"), or "engine ?" where cuDNN does not say.
std::string engine_of(const Desc& config, const std::string& label) {
  Desc engine_desc(CUDNN_BACKEND_ENGINE_DESCRIPTOR, "engine of " + config.name(), label);
  cudnnBackendDescriptor_t e = engine_desc.get();
  std::int64_t got = 0, index = -1;
  if (cudnnBackendGetAttribute(config.get(), CUDNN_ATTR_ENGINECFG_ENGINE, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &got, &e) !=
          CUDNN_STATUS_SUCCESS ||
      cudnnBackendGetAttribute(e, CUDNN_ATTR_ENGINE_GLOBAL_INDEX, CUDNN_TYPE_INT64, 1, &got, &index) !=
          CUDNN_STATUS_SUCCESS)
    return "engine ?";
  return "engine " + std::to_string(index);
}

std::string plan_json(const Desc& plan) {
  std::int64_t chars = 0;
  if (cudnnBackendGetAttribute(plan.get(), CUDNN_ATTR_EXECUTION_PLAN_JSON_REPRESENTATION, CUDNN_TYPE_CHAR, 0, &chars,
                               nullptr) != CUDNN_STATUS_SUCCESS ||
      chars <= 0)
    return {};
  std::string json(static_cast<std::size_t>(chars), '\0');
  if (cudnnBackendGetAttribute(plan.get(), CUDNN_ATTR_EXECUTION_PLAN_JSON_REPRESENTATION, CUDNN_TYPE_CHAR, chars,
                               &chars, json.data()) != CUDNN_STATUS_SUCCESS)
    return {};
  return json.c_str();  // drops the terminator
}

}  // namespace

Desc::Desc(cudnnBackendDescriptorType_t type, std::string name, const std::string& label)
    : name_(std::move(name)), label_(&label) {
  cudnnBackendDescriptor_t d = nullptr;
  if (const cudnnStatus_t st = cudnnBackendCreateDescriptor(type, &d); st != CUDNN_STATUS_SUCCESS)
    throw_cudnn(st, "cudnnBackendCreateDescriptor", name_ + " of " + label);
  d_.reset(d);
}

void Desc::set(cudnnBackendAttributeName_t attr, const char* attr_name, cudnnBackendAttributeType_t type,
               std::int64_t count, const void* values) {
  if (const cudnnStatus_t st = cudnnBackendSetAttribute(d_.get(), attr, type, count, values);
      st != CUDNN_STATUS_SUCCESS)
    throw_cudnn(st, "cudnnBackendSetAttribute", std::string(attr_name) + " on " + name_ + " of " + *label_);
}

void Desc::set(cudnnBackendAttributeName_t attr, const char* attr_name, const Desc& value) {
  cudnnBackendDescriptor_t v = value.get();
  set(attr, attr_name, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &v);
}

void Desc::finalize() {
  if (const cudnnStatus_t st = try_finalize(); st != CUDNN_STATUS_SUCCESS)
    throw_cudnn(st, "cudnnBackendFinalize", name_ + " of " + *label_);
}

std::string dims_text(const std::vector<std::int64_t>& v) {
  std::string s;
  for (std::size_t i = 0; i < v.size(); ++i) s += (i ? ", " : "") + std::to_string(v[i]);
  return "[" + s + "]";
}

Desc make_tensor(const TensorSpec& s, const std::string& label) {
  Desc t(CUDNN_BACKEND_TENSOR_DESCRIPTOR,
         std::string("tensor ") + s.name + " (id " + std::to_string(s.id) + ", dims " + dims_text(s.dims) +
             ", strides " + dims_text(s.strides) + ")",
         label);
  const auto rank = static_cast<std::int64_t>(s.dims.size());
  AB_SET(t, CUDNN_ATTR_TENSOR_DATA_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &s.type);
  AB_SET(t, CUDNN_ATTR_TENSOR_DIMENSIONS, CUDNN_TYPE_INT64, rank, s.dims.data());
  AB_SET(t, CUDNN_ATTR_TENSOR_STRIDES, CUDNN_TYPE_INT64, rank, s.strides.data());
  AB_SET(t, CUDNN_ATTR_TENSOR_UNIQUE_ID, CUDNN_TYPE_INT64, 1, &s.id);
  AB_SET(t, CUDNN_ATTR_TENSOR_BYTE_ALIGNMENT, CUDNN_TYPE_INT64, 1, &s.alignment);
  AB_SET(t, CUDNN_ATTR_TENSOR_IS_VIRTUAL, CUDNN_TYPE_BOOLEAN, 1, &s.is_virtual);
  if (s.by_value) AB_SET(t, CUDNN_ATTR_TENSOR_IS_BY_VALUE, CUDNN_TYPE_BOOLEAN, 1, &s.by_value);
  t.finalize();
  return t;
}

void try_heuristics(cudnnHandle_t handle, const Desc& graph, cudnnBackendHeurMode_t mode, const std::string& label,
                    std::string& refusals, std::vector<Candidate>& out, std::vector<std::unique_ptr<Desc>>& configs) {
  const std::string mode_name = std::string("heuristics mode ") + heur_name(mode);
  Desc heur(CUDNN_BACKEND_ENGINEHEUR_DESCRIPTOR, "engine heuristics (mode " + std::string(heur_name(mode)) + ")",
            label);
  AB_SET_DESC(heur, CUDNN_ATTR_ENGINEHEUR_OPERATION_GRAPH, graph);
  AB_SET(heur, CUDNN_ATTR_ENGINEHEUR_MODE, CUDNN_TYPE_HEUR_MODE, 1, &mode);
  if (const cudnnStatus_t st = heur.try_finalize(); st != CUDNN_STATUS_SUCCESS) {
    refusals += "; " + mode_name + ": cudnnBackendFinalize(engine heuristics) " + cudnn_status_text(st);
    return;
  }
  std::int64_t count = 0;
  if (const cudnnStatus_t st = cudnnBackendGetAttribute(heur.get(), CUDNN_ATTR_ENGINEHEUR_RESULTS,
                                                        CUDNN_TYPE_BACKEND_DESCRIPTOR, 0, &count, nullptr);
      st != CUDNN_STATUS_SUCCESS)
    throw_cudnn(st, "cudnnBackendGetAttribute", "CUDNN_ATTR_ENGINEHEUR_RESULTS count of " + mode_name + " of " + label);
  if (count <= 0) {
    refusals += "; " + mode_name + ": no engine configuration";
    return;
  }
  std::vector<std::unique_ptr<Desc>> cfgs;
  std::vector<cudnnBackendDescriptor_t> raw;
  for (std::int64_t i = 0; i < count; ++i) {
    cfgs.push_back(
        std::make_unique<Desc>(CUDNN_BACKEND_ENGINECFG_DESCRIPTOR,
                               mode_name + " config " + std::to_string(i + 1) + " of " + std::to_string(count), label));
    raw.push_back(cfgs.back()->get());
  }
  std::int64_t returned = 0;
  if (const cudnnStatus_t st = cudnnBackendGetAttribute(heur.get(), CUDNN_ATTR_ENGINEHEUR_RESULTS,
                                                        CUDNN_TYPE_BACKEND_DESCRIPTOR, count, &returned, raw.data());
      st != CUDNN_STATUS_SUCCESS)
    throw_cudnn(st, "cudnnBackendGetAttribute", "CUDNN_ATTR_ENGINEHEUR_RESULTS of " + mode_name + " of " + label);

  for (std::int64_t i = 0; i < returned; ++i) {
    const Desc& cfg = *cfgs[static_cast<std::size_t>(i)];
    const std::string engine_name = engine_of(cfg, label);
    auto candidate = std::make_unique<Desc>(CUDNN_BACKEND_EXECUTION_PLAN_DESCRIPTOR,
                                            "execution plan (" + cfg.name() + ", " + engine_name + ")", label);
    AB_SET(*candidate, CUDNN_ATTR_EXECUTION_PLAN_HANDLE, CUDNN_TYPE_HANDLE, 1, &handle);
    AB_SET_DESC(*candidate, CUDNN_ATTR_EXECUTION_PLAN_ENGINE_CONFIG, cfg);
    if (const cudnnStatus_t st = candidate->try_finalize(); st != CUDNN_STATUS_SUCCESS) {
      refusals +=
          "; " + cfg.name() + " " + engine_name + ": cudnnBackendFinalize(execution plan) " + cudnn_status_text(st);
      continue;
    }
    Candidate found;
    std::int64_t got = 0;
    if (const cudnnStatus_t st = cudnnBackendGetAttribute(candidate->get(), CUDNN_ATTR_EXECUTION_PLAN_WORKSPACE_SIZE,
                                                          CUDNN_TYPE_INT64, 1, &got, &found.workspace_bytes);
        st != CUDNN_STATUS_SUCCESS)
      throw_cudnn(st, "cudnnBackendGetAttribute",
                  "CUDNN_ATTR_EXECUTION_PLAN_WORKSPACE_SIZE of " + candidate->name() + " of " + label);
    found.json = plan_json(*candidate);
    found.name = engine_name + " (" + cfg.name() + ")";
    found.plan = std::move(candidate);
    out.push_back(std::move(found));
  }
  for (auto& cfg : cfgs) configs.push_back(std::move(cfg));
}

std::unique_ptr<Desc> make_graph(cudnnHandle_t handle, const std::vector<cudnnBackendDescriptor_t>& ops,
                                 const std::string& label) {
  auto graph = std::make_unique<Desc>(CUDNN_BACKEND_OPERATIONGRAPH_DESCRIPTOR, "operation graph", label);
  AB_SET(*graph, CUDNN_ATTR_OPERATIONGRAPH_HANDLE, CUDNN_TYPE_HANDLE, 1, &handle);
  AB_SET(*graph, CUDNN_ATTR_OPERATIONGRAPH_OPS, CUDNN_TYPE_BACKEND_DESCRIPTOR, static_cast<std::int64_t>(ops.size()),
         ops.data());
  if (const cudnnStatus_t st = graph->try_finalize(); st != CUDNN_STATUS_SUCCESS) {
    if (cudnn_not_supported(st))
      throw Unsupported(label + ": cuDNN refuses the graph: cudnnBackendFinalize(operation graph) " +
                        cudnn_status_text(st) + " (cuDNN " + std::to_string(cudnnGetVersion()) + ")");
    throw_cudnn(st, "cudnnBackendFinalize", "operation graph of " + label);
  }
  return graph;
}

cudnnStatus_t execute(cudnnHandle_t handle, const Desc& plan, const std::vector<std::int64_t>& ids,
                      const std::vector<void*>& ptrs, void* workspace, const std::string& label) {
  Desc p(CUDNN_BACKEND_VARIANT_PACK_DESCRIPTOR, "variant pack", label);
  AB_SET(p, CUDNN_ATTR_VARIANT_PACK_UNIQUE_IDS, CUDNN_TYPE_INT64, static_cast<std::int64_t>(ids.size()), ids.data());
  AB_SET(p, CUDNN_ATTR_VARIANT_PACK_DATA_POINTERS, CUDNN_TYPE_VOID_PTR, static_cast<std::int64_t>(ptrs.size()),
         ptrs.data());
  AB_SET(p, CUDNN_ATTR_VARIANT_PACK_WORKSPACE, CUDNN_TYPE_VOID_PTR, 1, &workspace);
  p.finalize();
  return cudnnBackendExecute(handle, plan.get(), p.get());
}

}  // namespace ab::nn::cuda::cudnn_graph
