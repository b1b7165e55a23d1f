// What the NCCL sources of the CUDA backend share (collectives.cpp: communicators, groups and
// plans; nccl_averager.cpp: data parallelism's gradient averaging). Internal to backend/cuda.
#pragma once

#include <cuda_runtime_api.h>
#include <nccl.h>

#include <memory>
#include <string>

#include "backend/collectives.h"
#include "backend/cuda/check.h"
#include "core/dtype.h"

namespace ab::backend::cuda {

// Throws Error naming the call, `what` and NCCL's message (its last error too) unless r is success.
void check_nccl(ncclResult_t r, const char* call, const std::string& what);
#define AB_NCCL(call, what) ::ab::backend::cuda::check_nccl((call), #call, (what))

// NCCL's type for f32, f16, bf16 or i32; Unsupported for the rest.
ncclDataType_t nccl_type(DType t);

// One local rank of a group: its device, stream (local rank 0: the backend's), communicator and
// the event it records after each collective (ranks 1.. of a one-process group).
struct Rank {
  int device = 0;
  cudaStream_t stream = nullptr;
  ncclComm_t comm = nullptr;
  cudaEvent_t join = nullptr;
};

// An averager's side stream, forked from a rank's stream at each bucket and joined back at the end.
// One fork and one join event suffice: a wait takes the event's latest record at the time it is
// enqueued (and, in a capture, becomes that edge of the graph).
class SideStream {
 public:
  SideStream(const std::string& what, bool high_priority)
      : what_(what), side_(create_stream(what, high_priority)), fork_(create_event(what)), join_(create_event(what)) {}
  cudaStream_t get() const { return side_.get(); }
  // The side stream waits for the work enqueued on `from` so far.
  void fork(cudaStream_t from) {
    AB_CUDA(cudaEventRecord(fork_.get(), from), what_);
    AB_CUDA(cudaStreamWaitEvent(side_.get(), fork_.get(), 0), what_);
    pending_ = true;
  }
  // `into` waits for everything the side stream took since the first fork (nothing if none).
  void join(cudaStream_t into) {
    if (!pending_) return;
    AB_CUDA(cudaEventRecord(join_.get(), side_.get()), what_);
    AB_CUDA(cudaStreamWaitEvent(into, join_.get(), 0), what_);
    pending_ = false;
  }

 private:
  std::string what_;
  StreamPtr side_;
  EventPtr fork_, join_;
  bool pending_ = false;
};

// The StreamAverager of a rank that is its process's only one (CollectiveGroup::make_averager).
std::unique_ptr<StreamAverager> make_nccl_averager(const Rank& rank, bool high_priority);
// The copy-engine one (copy_averager.cpp); throws Unsupported unless the communicator has 2 ranks.
std::unique_ptr<StreamAverager> make_copy_engine_averager(const Rank& rank, bool high_priority);

}  // namespace ab::backend::cuda
