// Collective communication across the GPUs of one process (NCCL behind backend/cuda). A group
// holds one communicator per device; rank 0 is the backend's own device and stream, so the
// backend's event timer times a collective from its start on rank 0 to the moment every rank has
// finished (the other ranks' streams fork from and join back into rank 0's stream).
// docs/METHODOLOGY.md "Collectives" has the sizes, the check and the timing.
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
};

class CollectivePlan {
 public:
  virtual ~CollectivePlan() = default;
  // Enqueues the collective on every rank (one NCCL group call); rank 0's stream is the backend's.
  virtual void run() = 0;
  // Fills every rank's input with small integers that depend on rank and index (exact in every
  // dtype), runs once, and returns the number of output elements that differ from the result
  // computed on the host, over all ranks (for reduce: the root's output only).
  virtual std::int64_t check() = 0;
  // Each rank's own time per collective, from an event before to an event after `iterations`
  // back-to-back collectives on that rank's stream.
  virtual std::vector<double> per_rank_seconds(int iterations) = 0;
};

class CollectiveGroup {
 public:
  virtual ~CollectiveGroup() = default;
  virtual int size() const = 0;
  virtual std::vector<std::string> device_ids() const = 0;  // rank order: "cuda:0", ...
  // Environment settings the group forced before creating its communicators (NCCL_NVLS_ENABLE=0).
  virtual std::map<std::string, std::string> forced_settings() const = 0;
  // Allocates the buffers; throws OutOfMemory when a device is full, UsageError for a bad count.
  virtual std::unique_ptr<CollectivePlan> make_plan(const CollectiveDesc& desc) = 0;
};

// GPUs a collective group can span in this process (0 in the CPU build or without a GPU).
int collective_device_count();
// A group of `gpus` devices starting at the backend's device (cuda:i, cuda:i+1, ... modulo the
// visible count), with one communicator each (ncclCommInitAll). The backend must outlive it.
// Throws Unsupported in the CPU build or for a non-CUDA backend, Error when gpus > visible.
std::unique_ptr<CollectiveGroup> make_collective_group(Backend& backend, int gpus);

}  // namespace ab::backend
