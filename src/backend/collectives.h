// Collective communication over NCCL (behind backend/cuda), in two shapes. One process driving
// several GPUs: a group holds one communicator per device; rank 0 is the backend's own device and
// stream, so the backend's event timer times a collective from its start on rank 0 to the moment
// every rank has finished (the other ranks' streams fork from and join back into rank 0's
// stream). One process per GPU (dist/ bootstraps them): a group is this process's one rank of the
// launch's communicator, on the backend's device and stream. Communicators are created once per
// device set (or per launch and rank) and kept for the process's life: a sweep pays NCCL's set-up
// once, not per point. docs/METHODOLOGY.md "Collectives" has the sizes, the check and the timing.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "core/dtype.h"

namespace ab::backend {

enum class CollectiveOp { all_reduce, all_gather, reduce_scatter, broadcast, reduce, all_to_all, send_recv };
std::string collective_op_name(CollectiveOp op);
CollectiveOp parse_collective_op(const std::string& name);  // throws UsageError listing the valid names
const std::vector<std::string>& collective_op_names();
// all_to_all and send_recv have no in-place form in NCCL.
bool collective_has_in_place(CollectiveOp op);
// The element types collectives accept: f32, f16, bf16, i32.
const std::vector<std::string>& collective_dtype_names();

// `count` is nccl-tests' count: the elements of the larger per-rank buffer (the output of
// all_gather, the input of reduce_scatter, each buffer of the others). all_gather, reduce_scatter
// and all_to_all need it to be a multiple of the group size. Roots (broadcast, reduce) are rank 0;
// send_recv is a ring: rank r sends to r+1 and receives from r-1.
struct CollectiveDesc {
  CollectiveOp op = CollectiveOp::all_reduce;
  DType dtype = DType::f32;
  std::int64_t count = 0;
  bool in_place = false;
  // 0: run() launches one collective. k > 0: run() replays a CUDA graph that holds k collectives,
  // captured on the first run() (nccl-tests' -G). Groups of one local rank only: make_plan throws
  // Unsupported otherwise (NCCL: graphs of several GPUs launched from one thread can deadlock).
  int graph_collectives = 0;
};

class CollectivePlan {
 public:
  virtual ~CollectivePlan() = default;
  // Enqueues one iteration on every local rank: one collective (one NCCL group call), or one
  // replay of the captured graph. Rank 0's stream is the backend's.
  virtual void run() = 0;
  // Collectives one run() enqueues: 1, or graph_collectives.
  virtual int collectives_per_run() const = 0;
  // Fills every local rank's input with small integers that depend on rank and index (exact in
  // every dtype), runs one collective (never the graph), and returns the number of output elements
  // that differ from the result computed on the host, over the local ranks (for reduce: the
  // root's output only). In a multi-process group every rank must call it.
  virtual std::int64_t check() = 0;
  // Each local rank's own time per collective, from an event before to an event after
  // `iterations` back-to-back run()s on that rank's stream.
  virtual std::vector<double> per_rank_seconds(int iterations) = 0;
};

// In-place averages of device buffers over a group's ranks that overlap the backend's stream
// (data-parallel gradients): average() waits for the work enqueued on the backend's stream so
// far and reduces on a side stream (NCCL's ncclAvg); join() makes the backend's stream wait for
// every average() before it. Both only enqueue, so a CUDA-graph capture can hold them.
class StreamAverager {
 public:
  virtual ~StreamAverager() = default;
  virtual void average(void* data, std::int64_t count, DType dtype) = 0;
  virtual void join() = 0;
  // Communicate f32 buffers in `wire` (bf16 or f16: PyTorch DDP's compress hooks): average() then
  // casts the buffer into a staging buffer of `wire` (round to nearest even), averages that and
  // casts it back into the buffer, all on the side stream. The staging buffer, for buffers of up
  // to `max_count` elements, is allocated here: average() allocates nothing (it may run inside a
  // capture). A buffer whose dtype is `wire` is averaged as it is; one of another dtype than f32,
  // or longer than `max_count`, is an Error. Until it is called, every buffer travels in its own dtype.
  virtual void set_wire_dtype(DType wire, std::int64_t max_count) = 0;
  // Every buffer average() will be given lies in [data, data + bytes), laid out alike on every
  // rank. Every rank calls it once, before any average() and outside a capture (it may talk to
  // the other ranks); the copy-engine averager maps the peer's range here, NCCL's needs nothing.
  virtual void register_buffers(void* data, std::int64_t bytes) = 0;
  // Leaves the mean to the caller: from now on average() brings the peer's buffer into a mirror
  // of the registered range and changes nothing in place, and returns that mirror's start (the
  // peer's copy of data + k lies at mirror + k); the mean of the two is the caller's, e.g. the
  // optimizer's update reading both (it saves one pass over the gradients). The mirror is valid
  // after join() until the next step's first average(). After register_buffers; copy engines only
  // (2 ranks: the mean is of two buffers), others throw Unsupported.
  virtual void* leave_mean_to_caller() = 0;
};

// How a StreamAverager moves the gradients.
enum class AveragerEngine {
  nccl,          // ncclAllReduce (ncclAvg) on the side stream: any group, any wire dtype
  copy_engines,  // 2 ranks on one host: each copies the other's bucket with a copy engine and averages
                 // it in with one short kernel; the waits are stream memory operations, not kernels
};
// "nccl", "copy"; parse throws UsageError listing them.
const std::vector<std::string>& averager_engine_names();
AveragerEngine parse_averager_engine(const std::string& name);

class CollectiveGroup {
 public:
  virtual ~CollectiveGroup() = default;
  virtual int size() const = 0;         // ranks in the communicator, over all processes
  virtual int local_ranks() const = 0;  // ranks this process drives
  virtual int first_rank() const = 0;   // the rank of the first of them
  virtual std::vector<std::string> device_ids() const = 0;  // this process's, rank order: "cuda:0", ...
  // Environment settings forced before the communicators were created (NCCL_NVLS_ENABLE=0...).
  virtual std::map<std::string, std::string> forced_settings() const = 0;
  // Allocates the buffers; throws OutOfMemory when a device is full, UsageError for a bad count.
  virtual std::unique_ptr<CollectivePlan> make_plan(const CollectiveDesc& desc) = 0;
  // For a group of one local rank (one GPU per process); throws Unsupported otherwise, and for
  // copy_engines unless the group has 2 ranks. With high_priority the side stream has the device's
  // highest priority (kept in a captured graph), so the averaging's kernels take SMs ahead of the
  // queued compute they overlap instead of after it.
  virtual std::unique_ptr<StreamAverager> make_averager(bool high_priority, AveragerEngine engine) = 0;
};

// GPUs a collective group can span in this process (0 in the CPU build or without a GPU).
int collective_device_count();
// A group of `gpus` devices starting at the backend's device (cuda:i, cuda:i+1, ... modulo the
// visible count), with one communicator each (ncclCommInitAll, once per device set). The backend
// must outlive the group and its plans.
// Throws Unsupported in the CPU build or for a non-CUDA backend, Error when gpus > visible.
std::unique_ptr<CollectiveGroup> make_collective_group(Backend& backend, int gpus);

// The multi-process shape. One rank creates the id (ncclGetUniqueId), every rank receives it
// (dist/ broadcasts it over MPI) and calls make_collective_rank with its rank: NCCL's set-up then
// waits until all `ranks` processes have joined. The communicator is kept per (id, rank).
// Communicator settings a workload may choose (ncclConfig_t); 0 leaves a field to NCCL.
struct CommOptions {
  int max_ctas = 0;  // most thread blocks (SMs) a collective may occupy, e.g. to leave SMs to overlapped compute
};
std::vector<std::uint8_t> collective_unique_id();
std::unique_ptr<CollectiveGroup> make_collective_rank(Backend& backend, int rank, int ranks,
                                                      const std::vector<std::uint8_t>& unique_id,
                                                      const CommOptions& options = {});

// GPU-to-GPU and host-to-GPU copies (the p2p workload): cudaMemcpyPeerAsync with peer access
// enabled where the pair allows it. A side of -1 (kHostSide) is pinned host memory.
constexpr int kHostSide = -1;
struct PeerCopyDesc {
  int src = 0, dst = 0;
  std::int64_t bytes = 0;
  bool bidirectional = false;  // src -> dst and dst -> src at once, on two streams
};
class PeerCopyPlan {
 public:
  virtual ~PeerCopyPlan() = default;
  virtual void run() = 0;  // one copy (two when bidirectional), on the plan's own stream(s)
  // Fresh random bytes in the source(s), one run(), and the number of destination bytes that differ.
  virtual std::int64_t check() = 0;
  // Events on the plan's first stream (on src's device, or dst's when src is the host); a
  // bidirectional run joins its second stream back into the first.
  virtual std::unique_ptr<measure::IterationTimer> make_timer() = 0;
  // What the pair offers: "peer_access" (enabled for this copy), "p2p_performance_rank"...
  virtual std::map<std::string, std::string> link_facts() const = 0;
};
std::unique_ptr<PeerCopyPlan> make_peer_copy(const PeerCopyDesc& desc);

}  // namespace ab::backend
