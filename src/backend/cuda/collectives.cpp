// NCCL communicators, kept for the process's life: ncclCommInitAll for the GPUs of one process
// (one group call over all ranks per collective), ncclCommInitRank for one rank of a multi-process
// launch. Rank 0 runs on the backend's stream; in one process, ranks 1.. fork from it (an event
// rank 0 records before the group) and join back (rank 0 waits on an event each records after), so
// the backend's event timer covers the collective until the slowest rank has finished. Graph mode
// captures the rank's stream into a CUDA graph, for one GPU per process only.
#include "backend/cuda/collectives.h"

#include <cuda_runtime_api.h>
#include <nccl.h>

#include <algorithm>
#include <array>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <string>
#include <vector>

#include "backend/collective_traits.h"
#include "backend/cuda/check.h"
#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/nccl_calls.h"
#include "backend/cuda/nccl_common.h"
#include "core/error.h"

namespace ab::backend::cuda {

void check_nccl(ncclResult_t r, const char* call, const std::string& what) {
  if (r == ncclSuccess) return;
  std::string msg = std::string(call) + " failed (" + what + "): " + ncclGetErrorString(r);
  const char* last = ncclGetLastError(nullptr);
  if (last != nullptr && *last != '\0') msg += ": " + std::string(last);
  throw Error(msg);
}

ncclDataType_t nccl_type(DType t) {
  switch (t) {
    case DType::f32: return ncclFloat32;
    case DType::f16: return ncclFloat16;
    case DType::bf16: return ncclBfloat16;
    case DType::i32: return ncclInt32;
    default: break;
  }
  throw Unsupported("collectives take f32, f16, bf16 or i32, not " + std::string(to_string(t)));
}

namespace {

void encode(DType t, const std::vector<double>& v, std::vector<unsigned char>& out) {
  const std::size_t es = size_bytes(t);
  out.resize(v.size() * es);
  for (std::size_t i = 0; i < v.size(); ++i) {
    unsigned char* p = out.data() + i * es;
    if (t == DType::f32) {
      const auto x = static_cast<float>(v[i]);
      std::memcpy(p, &x, es);
    } else if (t == DType::i32) {
      const auto x = static_cast<std::int32_t>(v[i]);
      std::memcpy(p, &x, es);
    } else {
      const std::uint16_t x =
          t == DType::f16 ? float_to_half_bits(static_cast<float>(v[i])) : float_to_bf16_bits(static_cast<float>(v[i]));
      std::memcpy(p, &x, es);
    }
  }
}

// Set before NCCL reads its environment (its first call in the process) and on every group:
// NVLink SHARP (multicast) stays off in every run, as the lent machines require, and a number that
// depends on it would not compare with one that does not.
std::map<std::string, std::string> force_settings() {
  static const std::map<std::string, std::string> forced{{"NCCL_NVLS_ENABLE", "0"}, {"NVSHMEM_DISABLE_NVLS", "1"}};
  for (const auto& [k, v] : forced) setenv(k.c_str(), v.c_str(), 1);
  return forced;
}

// NCCL's documented limitation: graphs of several communicators launched from one thread can
// deadlock inside cudaGraphLaunch.
constexpr const char* kGraphOneGpu =
    "CUDA graph mode needs one GPU per process (NCCL: with several GPUs in one process a graph launch can "
    "deadlock); run under mpirun or srun, or with gpus=1";

// One process's share of a communicator. Never destroyed: tearing NCCL down at exit races the CUDA
// runtime's own teardown, and the process's end reclaims it.
struct Comms {
  int world = 1, first_rank = 0;
  std::vector<int> devices;        // local ranks' devices
  std::vector<ncclComm_t> comms;
  std::vector<StreamPtr> streams;  // local ranks 1..: their own streams (entry 0 unused)
  std::vector<EventPtr> joins;     // local ranks 1..: recorded after each collective
  EventPtr fork;
};

std::mutex g_cache_mutex;
std::map<std::string, Comms*>& comm_cache() {
  static auto* cache = new std::map<std::string, Comms*>();
  return *cache;
}

int backend_device(Backend& backend) {
  const std::string& id = backend.info().id;
  if (backend.info().kind != "cuda") throw Unsupported("collectives run on CUDA devices, not " + id);
  return std::stoi(id.substr(id.find(':') + 1));
}

class NcclGroup final : public CollectiveGroup {
 public:
  NcclGroup(const Comms& c, Backend& backend, std::map<std::string, std::string> forced)
      : world_(c.world), first_rank_(c.first_rank), fork_(c.fork.get()), forced_(std::move(forced)) {
    for (std::size_t r = 0; r < c.devices.size(); ++r) {
      Rank rank;
      rank.device = c.devices[r];
      rank.comm = c.comms[r];
      rank.stream = r == 0 ? static_cast<cudaStream_t>(native_stream(backend)) : c.streams[r].get();
      rank.join = r == 0 ? nullptr : c.joins[r].get();
      ranks_.push_back(rank);
      ids_.push_back("cuda:" + std::to_string(rank.device));
    }
  }

  int size() const override { return world_; }
  int local_ranks() const override { return static_cast<int>(ranks_.size()); }
  int first_rank() const override { return first_rank_; }
  std::vector<std::string> device_ids() const override { return ids_; }
  std::map<std::string, std::string> forced_settings() const override { return forced_; }
  std::unique_ptr<CollectivePlan> make_plan(const CollectiveDesc& desc) override;
  std::unique_ptr<StreamAverager> make_averager(bool high_priority, AveragerEngine engine) override;

  std::vector<Rank> ranks_;
  int world_, first_rank_;
  cudaEvent_t fork_;

 private:
  std::vector<std::string> ids_;
  std::map<std::string, std::string> forced_;
};

class NcclPlan final : public CollectivePlan {
 public:
  NcclPlan(NcclGroup& group, const CollectiveDesc& desc);
  ~NcclPlan() override;
  NcclPlan(const NcclPlan&) = delete;
  NcclPlan& operator=(const NcclPlan&) = delete;
  void run() override;
  int collectives_per_run() const override { return std::max(d_.graph_collectives, 1); }
  std::int64_t check() override;
  std::vector<double> per_rank_seconds(int iterations) override;

 private:
  void enqueue(std::size_t local);
  void enqueue_group();
  void capture();
  void launch_local(std::size_t local);      // one iteration on one local rank, without fork or join
  std::int64_t send_offset(int rank) const;  // elements into `buf` where the input starts (in place)
  std::int64_t recv_offset(int rank) const;
  int global(std::size_t local) const { return g_.first_rank_ + static_cast<int>(local); }

  NcclGroup& g_;
  CollectiveDesc d_;
  const CollectiveTraits& traits_;
  ncclDataType_t type_;
  std::int64_t es_;
  CollectiveBuffers len_;                  // per-rank send and recv lengths
  std::vector<DeviceBuffer> send_, recv_;  // per local rank; in place: recv_ only
  CheckInputs check_in_;                   // what expected() needs: the lengths and the sums over ranks
  std::vector<cudaGraphExec_t> graphs_;  // per local rank, once captured
};

std::unique_ptr<CollectivePlan> NcclGroup::make_plan(const CollectiveDesc& desc) {
  return std::make_unique<NcclPlan>(*this, desc);
}

NcclPlan::NcclPlan(NcclGroup& group, const CollectiveDesc& desc)
    : g_(group),
      d_(desc),
      traits_(collective_traits(desc.op)),
      type_(nccl_type(desc.dtype)),
      es_(static_cast<std::int64_t>(size_bytes(desc.dtype))) {
  const int n = g_.size();
  const std::string name = traits_.name;
  if (d_.count < 1) throw UsageError(name + " needs a count >= 1");
  if (d_.graph_collectives < 0) throw UsageError(name + ": graph_collectives must not be negative");
  if (traits_.splits_per_rank && d_.count % n != 0)
    throw UsageError(name + " needs a count that is a multiple of the " + std::to_string(n) + " ranks");
  if (d_.in_place && !traits_.in_place) throw Unsupported(name + " has no in-place form in NCCL");
  if (d_.graph_collectives > 0 && g_.ranks_.size() > 1)
    throw Unsupported(kGraphOneGpu);
  len_ = traits_.buffers(d_.count, n);
  check_in_.count = d_.count;
  check_in_.lengths = len_;
  check_in_.ranks = n;
  for (std::int64_t j = 0; j < 4; ++j)
    for (int q = 0; q < n; ++q) check_in_.rank_sums[static_cast<std::size_t>(j)] += collective_input_value(q, j);
  for (const Rank& rank : g_.ranks_) {
    const std::string what = name + " buffer on cuda:" + std::to_string(rank.device);
    AB_CUDA(cudaSetDevice(rank.device), what);
    if (d_.in_place) {
      recv_.emplace_back(d_.count * es_, what);  // the larger of the two is `count` for every op
    } else {
      send_.emplace_back(len_.send * es_, what + " (input)");
      recv_.emplace_back(len_.recv * es_, what + " (output)");
    }
  }
  AB_CUDA(cudaSetDevice(g_.ranks_[0].device), "collective rank 0");
}

NcclPlan::~NcclPlan() {
  // Work still queued must finish before the buffers go; errors cannot be reported from here.
  for (const Rank& r : g_.ranks_) {
    cudaSetDevice(r.device);
    cudaStreamSynchronize(r.stream);
  }
  for (cudaGraphExec_t g : graphs_) cudaGraphExecDestroy(g);
  cudaSetDevice(g_.ranks_[0].device);
}

std::int64_t NcclPlan::send_offset(int rank) const {
  return d_.in_place ? traits_.in_place_send_offset(rank, len_) : 0;
}
std::int64_t NcclPlan::recv_offset(int rank) const {
  return d_.in_place ? traits_.in_place_recv_offset(rank, len_) : 0;
}

void NcclPlan::enqueue(std::size_t ri) {
  const Rank& rank = g_.ranks_[ri];
  const int r = global(ri);
  auto* base_recv = static_cast<char*>(recv_[ri].get());
  RankCall call;
  call.send = d_.in_place ? base_recv + send_offset(r) * es_ : static_cast<const char*>(send_[ri].get());
  call.recv = base_recv + recv_offset(r) * es_;
  call.element_bytes = es_;
  call.count = d_.count;
  call.lengths = len_;
  call.rank = r;
  call.ranks = g_.size();
  NcclCalls calls(rank, type_, std::string(traits_.name) + " on rank " + std::to_string(r));
  traits_.run(calls, call);
}

void NcclPlan::enqueue_group() {
  AB_NCCL(ncclGroupStart(), "collective group");
  for (std::size_t r = 0; r < g_.ranks_.size(); ++r) enqueue(r);
  AB_NCCL(ncclGroupEnd(), "collective group");
}

// One graph per local rank (thread-local capture mode: NCCL may allocate while connecting). A
// collective runs eagerly first, so connections exist before capture.
void NcclPlan::capture() {
  auto& ranks = g_.ranks_;
  enqueue_group();
  for (const Rank& r : ranks) {
    AB_CUDA(cudaSetDevice(r.device), "graph capture");
    AB_CUDA(cudaStreamSynchronize(r.stream), "graph capture warm-up");
  }
  std::size_t begun = 0;
  try {
    for (; begun < ranks.size(); ++begun) {
      AB_CUDA(cudaSetDevice(ranks[begun].device), "graph capture");
      AB_CUDA(cudaStreamBeginCapture(ranks[begun].stream, cudaStreamCaptureModeThreadLocal), "graph capture begin");
    }
    for (int k = 0; k < d_.graph_collectives; ++k) enqueue_group();
  } catch (...) {
    for (std::size_t r = 0; r < begun; ++r) {  // leave no stream capturing
      cudaGraph_t discard = nullptr;
      cudaSetDevice(ranks[r].device);
      if (cudaStreamEndCapture(ranks[r].stream, &discard) == cudaSuccess && discard != nullptr) cudaGraphDestroy(discard);
    }
    cudaSetDevice(ranks[0].device);
    throw;
  }
  for (const Rank& r : ranks) {
    cudaGraph_t graph = nullptr;
    AB_CUDA(cudaSetDevice(r.device), "graph capture");
    AB_CUDA(cudaStreamEndCapture(r.stream, &graph), "graph capture end");
    cudaGraphExec_t exec = nullptr;
    const cudaError_t err = cudaGraphInstantiate(&exec, graph, 0);
    cudaGraphDestroy(graph);
    AB_CUDA(err, "graph instantiate (" + std::to_string(d_.graph_collectives) + " collectives)");
    graphs_.push_back(exec);
  }
  AB_CUDA(cudaSetDevice(ranks[0].device), "collective rank 0");
}

void NcclPlan::launch_local(std::size_t r) {
  AB_CUDA(cudaGraphLaunch(graphs_[r], g_.ranks_[r].stream), "graph launch");
}

void NcclPlan::run() {
  if (d_.graph_collectives > 0 && graphs_.empty()) capture();
  auto& ranks = g_.ranks_;
  const std::size_t n = ranks.size();
  if (n > 1) {
    AB_CUDA(cudaEventRecord(g_.fork_, ranks[0].stream), "collective fork");
    for (std::size_t r = 1; r < n; ++r) AB_CUDA(cudaStreamWaitEvent(ranks[r].stream, g_.fork_, 0), "collective fork");
  }
  if (d_.graph_collectives > 0) {
    for (std::size_t r = 0; r < n; ++r) {
      if (n > 1) AB_CUDA(cudaSetDevice(ranks[r].device), "graph launch");
      launch_local(r);
    }
  } else {
    enqueue_group();
  }
  for (std::size_t r = 1; r < n; ++r) {
    AB_CUDA(cudaSetDevice(ranks[r].device), "collective join");
    AB_CUDA(cudaEventRecord(ranks[r].join, ranks[r].stream), "collective join");
    AB_CUDA(cudaStreamWaitEvent(ranks[0].stream, ranks[r].join, 0), "collective join");
  }
  if (n > 1) AB_CUDA(cudaSetDevice(ranks[0].device), "collective rank 0");
}

std::int64_t NcclPlan::check() {
  constexpr std::int64_t kChunk = std::int64_t{1} << 22;  // elements moved to and from the host at a time
  auto& ranks = g_.ranks_;
  std::vector<double> values;
  std::vector<unsigned char> bytes;
  for (std::size_t ri = 0; ri < ranks.size(); ++ri) {
    const int r = global(ri);
    const Rank& rank = ranks[ri];
    AB_CUDA(cudaSetDevice(rank.device), "collective check");
    // Outputs start at 0, a value no correct result has; inputs are written over them in place.
    AB_CUDA(cudaMemsetAsync(recv_[ri].get(), 0, static_cast<std::size_t>(recv_[ri].bytes()), rank.stream),
            "collective check");
    char* sendp = d_.in_place ? static_cast<char*>(recv_[ri].get()) + send_offset(r) * es_
                              : static_cast<char*>(send_[ri].get());
    for (std::int64_t c = 0; c < len_.send; c += kChunk) {
      const std::int64_t len = std::min(kChunk, len_.send - c);
      values.resize(static_cast<std::size_t>(len));
      for (std::int64_t j = 0; j < len; ++j) values[static_cast<std::size_t>(j)] = collective_input_value(r, c + j);
      encode(d_.dtype, values, bytes);
      AB_CUDA(cudaMemcpyAsync(sendp + c * es_, bytes.data(), bytes.size(), cudaMemcpyHostToDevice, rank.stream),
              "collective check input");
      AB_CUDA(cudaStreamSynchronize(rank.stream), "collective check input");
    }
  }
  AB_CUDA(cudaSetDevice(ranks[0].device), "collective check");
  enqueue_group();  // one collective, never the graph: in place, a replay of k would compound
  for (auto& rank : ranks) {
    AB_CUDA(cudaSetDevice(rank.device), "collective check");
    AB_CUDA(cudaStreamSynchronize(rank.stream), "collective check run");
  }
  std::int64_t wrong = 0;
  for (std::size_t ri = 0; ri < ranks.size(); ++ri) {
    const int r = global(ri);
    if (traits_.root_output_only && r != 0) continue;  // only the root's output is defined
    AB_CUDA(cudaSetDevice(ranks[ri].device), "collective check");
    const char* recvp = static_cast<const char*>(recv_[ri].get()) + recv_offset(r) * es_;
    for (std::int64_t c = 0; c < len_.recv; c += kChunk) {
      const std::int64_t len = std::min(kChunk, len_.recv - c);
      bytes.resize(static_cast<std::size_t>(len * es_));
      AB_CUDA(cudaMemcpy(bytes.data(), recvp + c * es_, bytes.size(), cudaMemcpyDeviceToHost), "collective check output");
      const std::vector<double> got = to_doubles(d_.dtype, bytes.data(), static_cast<std::size_t>(len));
      for (std::int64_t j = 0; j < len; ++j)
        if (got[static_cast<std::size_t>(j)] != traits_.expected(check_in_, r, c + j)) ++wrong;
    }
  }
  AB_CUDA(cudaSetDevice(ranks[0].device), "collective rank 0");
  return wrong;
}

std::vector<double> NcclPlan::per_rank_seconds(int iterations) {
  if (d_.graph_collectives > 0 && graphs_.empty()) capture();
  auto& ranks = g_.ranks_;
  iterations = std::max(iterations, 1);
  std::vector<EventPtr> start, stop;
  for (auto& rank : ranks) {
    AB_CUDA(cudaSetDevice(rank.device), "per-rank timing");
    AB_CUDA(cudaStreamSynchronize(rank.stream), "per-rank timing");
    start.push_back(create_event("per-rank timing"));
    stop.push_back(create_event("per-rank timing"));
    AB_CUDA(cudaEventRecord(start.back().get(), rank.stream), "per-rank timing start");
  }
  for (int it = 0; it < iterations; ++it) {
    if (d_.graph_collectives == 0) {
      enqueue_group();
      continue;
    }
    for (std::size_t r = 0; r < ranks.size(); ++r) {
      AB_CUDA(cudaSetDevice(ranks[r].device), "graph launch");
      launch_local(r);
    }
  }
  std::vector<double> out;
  for (std::size_t r = 0; r < ranks.size(); ++r) {
    AB_CUDA(cudaSetDevice(ranks[r].device), "per-rank timing");
    AB_CUDA(cudaEventRecord(stop[r].get(), ranks[r].stream), "per-rank timing stop");
  }
  for (std::size_t r = 0; r < ranks.size(); ++r) {
    AB_CUDA(cudaSetDevice(ranks[r].device), "per-rank timing");
    AB_CUDA(cudaEventSynchronize(stop[r].get()), "per-rank timing stop");
    float ms = 0;
    AB_CUDA(cudaEventElapsedTime(&ms, start[r].get(), stop[r].get()), "per-rank timing elapsed");
    out.push_back(static_cast<double>(ms) * 1e-3 / iterations / collectives_per_run());
  }
  AB_CUDA(cudaSetDevice(ranks[0].device), "collective rank 0");
  return out;
}

std::string hex(const std::vector<std::uint8_t>& bytes) {
  static const char* digits = "0123456789abcdef";
  std::string out;
  for (const std::uint8_t b : bytes) {
    out += digits[b >> 4];
    out += digits[b & 15];
  }
  return out;
}

}  // namespace

std::unique_ptr<CollectiveGroup> make_collective_group(Backend& backend, int gpus) {
  const int first = backend_device(backend);
  const int visible = device_count();
  if (gpus < 1) throw UsageError("a collective group needs gpus >= 1, not " + std::to_string(gpus));
  if (gpus > visible)
    throw Error("a group of " + std::to_string(gpus) + " GPUs needs that many; " + std::to_string(visible) + " visible");
  const auto forced = force_settings();
  std::vector<int> devices;
  std::string key = "local";
  for (int r = 0; r < gpus; ++r) {
    devices.push_back((first + r) % visible);
    key += ":" + std::to_string(devices.back());
  }
  const std::lock_guard<std::mutex> lock(g_cache_mutex);
  Comms*& slot = comm_cache()[key];
  if (slot == nullptr) {
    auto c = std::make_unique<Comms>();
    c->world = gpus;
    c->devices = devices;
    c->streams.resize(devices.size());
    c->joins.resize(devices.size());
    for (std::size_t r = 1; r < devices.size(); ++r) {
      AB_CUDA(cudaSetDevice(devices[r]), "collective rank " + std::to_string(r));
      c->streams[r] = create_stream("collective rank " + std::to_string(r) + " stream");
      c->joins[r] = create_event("collective rank " + std::to_string(r) + " join");
    }
    AB_CUDA(cudaSetDevice(first), "collective rank 0");
    c->fork = create_event("collective fork");
    c->comms.resize(devices.size());
    AB_NCCL(ncclCommInitAll(c->comms.data(), gpus, devices.data()), std::to_string(gpus) + " communicators");
    AB_CUDA(cudaSetDevice(first), "collective rank 0");
    slot = c.release();
  }
  return std::make_unique<NcclGroup>(*slot, backend, forced);
}

std::unique_ptr<StreamAverager> NcclGroup::make_averager(bool high_priority, AveragerEngine engine) {
  if (ranks_.size() != 1) throw Unsupported("gradient averaging needs one GPU per process (run under mpirun or srun)");
  AB_CUDA(cudaSetDevice(ranks_[0].device), "gradient averaging device");
  return engine == AveragerEngine::copy_engines ? make_copy_engine_averager(ranks_[0], high_priority)
                                                : make_nccl_averager(ranks_[0], high_priority);
}

std::vector<std::uint8_t> collective_unique_id() {
  force_settings();
  ncclUniqueId id{};
  AB_NCCL(ncclGetUniqueId(&id), "the launch's unique id");
  const auto* p = reinterpret_cast<const std::uint8_t*>(id.internal);
  return {p, p + sizeof id.internal};
}

std::unique_ptr<CollectiveGroup> make_collective_rank(Backend& backend, int rank, int ranks,
                                                      const std::vector<std::uint8_t>& unique_id,
                                                      const CommOptions& options) {
  const int device = backend_device(backend);
  if (ranks < 1 || rank < 0 || rank >= ranks)
    throw UsageError("rank " + std::to_string(rank) + " is outside a communicator of " + std::to_string(ranks));
  if (options.max_ctas < 0) throw UsageError("a communicator's max_ctas must not be negative");
  ncclUniqueId id{};
  if (unique_id.size() != sizeof id.internal)
    throw Error("an NCCL unique id has " + std::to_string(sizeof id.internal) + " bytes, not " +
                std::to_string(unique_id.size()));
  std::memcpy(id.internal, unique_id.data(), unique_id.size());
  const auto forced = force_settings();
  const std::string key = "rank:" + hex(unique_id) + ":" + std::to_string(rank) + "/" + std::to_string(ranks) +
                          ":cuda" + std::to_string(device) + ":ctas" + std::to_string(options.max_ctas);
  const std::lock_guard<std::mutex> lock(g_cache_mutex);
  Comms*& slot = comm_cache()[key];
  if (slot == nullptr) {
    auto c = std::make_unique<Comms>();
    c->world = ranks;
    c->first_rank = rank;
    c->devices = {device};
    c->streams.resize(1);
    c->joins.resize(1);
    c->comms.resize(1);
    AB_CUDA(cudaSetDevice(device), "collective rank " + std::to_string(rank));
    ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
    if (options.max_ctas > 0) config.maxCTAs = options.max_ctas;
    AB_NCCL(ncclCommInitRankConfig(&c->comms[0], ranks, id, rank, &config),
            "rank " + std::to_string(rank) + " of " + std::to_string(ranks) + " on cuda:" + std::to_string(device));
    slot = c.release();
  }
  return std::make_unique<NcclGroup>(*slot, backend, forced);
}

}  // namespace ab::backend::cuda
