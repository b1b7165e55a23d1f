// Data parallelism's gradient averaging on one rank's NCCL communicator (StreamAverager).
#include <algorithm>
#include <string>

#include "backend/cuda/check.h"
#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/nccl_common.h"
#include "backend/cuda/wire_cast.h"
#include "core/error.h"

namespace ab::backend::cuda {
namespace {

// Forks a side stream from the backend's stream at each average() and joins it back at join().
// With a 16-bit wire type the casts
// run on the side stream too, around the all-reduce of one staging buffer that every bucket reuses
// in turn (the side stream orders them), so they overlap backward like the all-reduce itself.
class NcclAverager final : public StreamAverager {
 public:
  NcclAverager(const Rank& rank, bool high_priority)
      : rank_(rank), side_("gradient averaging stream", high_priority) {
    AB_CUDA(cudaDeviceGetAttribute(&sm_count_, cudaDevAttrMultiProcessorCount, rank_.device), "gradient averaging device");
  }
  void set_wire_dtype(DType wire, std::int64_t max_count) override {
    if (wire != DType::f32 && wire != DType::bf16 && wire != DType::f16)
      throw Unsupported("gradients are communicated in f32, bf16 or f16, not " + std::string(to_string(wire)));
    if (max_count < 0) throw UsageError("a staging buffer needs max_count >= 0");
    wire_ = wire;
    staging_ = DeviceBuffer();
    staging_count_ = 0;
    if (wire == DType::f32) return;
    AB_CUDA(cudaSetDevice(rank_.device), "gradient averaging staging buffer");
    staging_ = DeviceBuffer(std::max<std::int64_t>(max_count, 1) * static_cast<std::int64_t>(size_bytes(wire)),
                            std::string("gradient averaging staging buffer (") + std::string(to_string(wire)) + ")");
    staging_count_ = max_count;
  }
  void average(void* data, std::int64_t count, DType dtype) override {
    side_.fork(rank_.stream);
    if (wire_ == DType::f32 || dtype == wire_) {
      AB_NCCL(ncclAllReduce(data, data, static_cast<std::size_t>(count), nccl_type(dtype), ncclAvg, rank_.comm,
                            side_.get()),
              "gradient all-reduce");  // no per-call message building: eager steps call this every bucket
    } else {
      if (dtype != DType::f32 || count > staging_count_)
        throw Error("gradient averaging in " + std::string(to_string(wire_)) + " takes f32 buffers of up to " +
                    std::to_string(staging_count_) + " elements, not " + std::to_string(count) + " of " +
                    std::string(to_string(dtype)));
      auto* grads = static_cast<float*>(data);
      cast_f32_to_wire(wire_, grads, staging_.get(), count, sm_count_, side_.get());
      AB_NCCL(ncclAllReduce(staging_.get(), staging_.get(), static_cast<std::size_t>(count), nccl_type(wire_), ncclAvg,
                            rank_.comm, side_.get()),
              "gradient all-reduce");
      cast_wire_to_f32(wire_, staging_.get(), grads, count, sm_count_, side_.get());
    }
  }
  void register_buffers(void*, std::int64_t) override {}
  void* leave_mean_to_caller() override {
    throw Unsupported("NCCL's all-reduce leaves the mean in place; the mean in the update needs comm_engine=copy");
  }
  void join() override { side_.join(rank_.stream); }

 private:
  Rank rank_;
  SideStream side_;
  int sm_count_ = 0;
  DType wire_ = DType::f32;  // f32: every buffer in its own dtype
  DeviceBuffer staging_;
  std::int64_t staging_count_ = 0;
};

}  // namespace

std::unique_ptr<StreamAverager> make_nccl_averager(const Rank& rank, bool high_priority) {
  return std::make_unique<NcclAverager>(rank, high_priority);
}

}  // namespace ab::backend::cuda
