// Data parallelism's gradient averaging between two ranks on one host with copy engines
// (AveragerEngine::copy_engines). NCCL's all-reduce kernels hold SMs from the moment they start
// until the slower rank arrives, and cuDNN's cooperative batch-norm kernels cannot start beside
// them (the 2-GPU kernel timeline in bench/HISTORY.md). Here nothing waits on an SM: each rank pulls the peer's
// bucket over the GPU link with a copy engine into a scratch buffer and one short kernel averages
// it in; the waits for the peer are stream memory operations (the GPU's front end polls a flag).
// Per bucket i, on rank r's side stream (peer p), once r's bucket is final:
//   write p.ready[i] = 1; wait r.ready[i] == 1; write r.ready[i] = 0   both buckets are final
//   copy p's bucket -> scratch
//   write p.read[i] = 1;  wait r.read[i] == 1;  write r.read[i] = 0    p has copied r's bucket
//   bucket = (bucket + scratch) / 2                                     the same bits on both ranks
// Each flag is reset by its owner right after its wait, and the peer sets it again only after
// waiting for a flag that the owner writes later (a write is fenced behind the stream's earlier
// writes), so a set never meets a stale reset. Every step writes the same values: a captured step
// replays the protocol unchanged.
#include <cuda.h>
#include <cudaTypedefs.h>
#include <unistd.h>

#include <array>
#include <cstdio>
#include <cstring>
#include <string>

#include "backend/cuda/check.h"
#include "backend/cuda/nccl_common.h"
#include "backend/cuda/wire_cast.h"
#include "core/error.h"

namespace ab::backend::cuda {
namespace {

// Buckets one step may average (flags are allocated once, before any capture).
constexpr int kMaxBuckets = 4096;

// The driver calls the runtime does not offer, looked up once through the runtime (no link to
// libcuda), in the signatures of CUDA 12.0's API (the PFN_*_v11070 / _v3020 types below).
constexpr unsigned kDriverApiVersion = 12000;
struct Driver {
  PFN_cuStreamWaitValue32_v11070 wait_value = nullptr;
  PFN_cuStreamWriteValue32_v11070 write_value = nullptr;
  PFN_cuMemGetAddressRange_v3020 address_range = nullptr;
};

template <typename Fn>
void entry_point(const char* symbol, Fn& fn) {
  void* p = nullptr;
  cudaDriverEntryPointQueryResult found{};
  AB_CUDA(cudaGetDriverEntryPointByVersion(symbol, &p, kDriverApiVersion, cudaEnableDefault, &found), symbol);
  if (found != cudaDriverEntryPointSuccess || p == nullptr)
    throw Unsupported(std::string("the copy-engine averager needs the driver's ") + symbol + ", which this driver lacks");
  fn = reinterpret_cast<Fn>(p);
}

const Driver& driver() {
  static const Driver d = [] {
    Driver r;
    entry_point("cuStreamWaitValue32", r.wait_value);
    entry_point("cuStreamWriteValue32", r.write_value);
    entry_point("cuMemGetAddressRange", r.address_range);
    return r;
  }();
  return d;
}

// Whether a rank mapped the peer's memory, and if not why.
struct Opened {
  int ok = 1;
  char why[200] = {};
};

// What each rank tells the other once, through the communicator.
struct Shared {
  cudaIpcMemHandle_t grads{}, flags{};
  std::int64_t grads_offset = 0;  // the registered buffers' start within their allocation
  std::int64_t bytes = 0;
  int device = 0;
  char host[64] = {};
};

class CopyEngineAverager final : public StreamAverager {
 public:
  CopyEngineAverager(const Rank& rank, bool high_priority)
      : rank_(rank), side_("copy-engine averaging stream", high_priority) {
    AB_CUDA(cudaDeviceGetAttribute(&sm_count_, cudaDevAttrMultiProcessorCount, rank_.device), "copy-engine averaging");
    int ranks = 0;
    AB_NCCL(ncclCommCount(rank_.comm, &ranks), "copy-engine averaging");
    AB_NCCL(ncclCommUserRank(rank_.comm, &me_), "copy-engine averaging");
    if (ranks != 2)
      throw Unsupported("the copy-engine averager joins exactly 2 ranks (one on each side of a GPU link), not " +
                        std::to_string(ranks) + ": use NCCL");
    (void)driver();
  }
  ~CopyEngineAverager() override { close_peer(); }

  void register_buffers(void* data, std::int64_t bytes) override {
    if (data == nullptr || bytes <= 0) throw UsageError("the copy-engine averager needs a non-empty buffer range");
    AB_CUDA(cudaSetDevice(rank_.device), "copy-engine averaging");
    CUdeviceptr alloc_base = 0;
    std::size_t alloc_bytes = 0;
    if (const CUresult r = driver().address_range(&alloc_base, &alloc_bytes, reinterpret_cast<CUdeviceptr>(data));
        r != CUDA_SUCCESS)
      throw Error("cuMemGetAddressRange: the copy-engine averager's gradients are not one device allocation (CUresult " +
                  std::to_string(static_cast<int>(r)) + ")");
    const auto offset = static_cast<std::int64_t>(reinterpret_cast<CUdeviceptr>(data) - alloc_base);
    if (offset + bytes > static_cast<std::int64_t>(alloc_bytes))
      throw Error("the copy-engine averager's buffers span more than one device allocation");
    flags_ = DeviceBuffer(2 * kMaxBuckets * static_cast<std::int64_t>(sizeof(std::uint32_t)), "copy-engine averaging flags");
    scratch_ = DeviceBuffer(bytes, "copy-engine averaging scratch");
    AB_CUDA(cudaMemsetAsync(flags_.get(), 0, static_cast<std::size_t>(flags_.bytes()), side_.get()), "flags");
    AB_CUDA(cudaStreamSynchronize(side_.get()), "copy-engine averaging flags");

    Shared mine;
    AB_CUDA(cudaIpcGetMemHandle(&mine.grads, reinterpret_cast<void*>(alloc_base)), "gradient store IPC handle");
    AB_CUDA(cudaIpcGetMemHandle(&mine.flags, flags_.get()), "flag IPC handle");
    mine.grads_offset = offset;
    mine.bytes = bytes;
    mine.device = rank_.device;
    gethostname(mine.host, sizeof mine.host - 1);
    // The exchange is also the barrier after which both ranks' flags are zero.
    const Shared peer = exchange(mine)[1 - me_];
    if (std::strncmp(peer.host, mine.host, sizeof mine.host) != 0)
      throw Unsupported("the copy-engine averager reaches a peer GPU on the same host; rank " + std::to_string(1 - me_) +
                        " runs on " + std::string(peer.host) + ", this one on " + mine.host + ": use NCCL");
    if (peer.bytes != bytes)
      throw Error("the two ranks registered gradient stores of different sizes: " + std::to_string(bytes) + " and " +
                  std::to_string(peer.bytes) + " bytes");
    close_peer();
    // Opening can fail on one rank only (a process that sees only its own GPU, no peer access):
    // both ranks learn whether both opened, and refuse together, so neither waits for the other.
    Opened opened;
    void *grads = nullptr, *flags = nullptr;
    cudaError_t err = cudaIpcOpenMemHandle(&grads, peer.grads, cudaIpcMemLazyEnablePeerAccess);
    if (err == cudaSuccess) {
      peer_grads_ = grads;
      err = cudaIpcOpenMemHandle(&flags, peer.flags, cudaIpcMemLazyEnablePeerAccess);
      if (err == cudaSuccess) peer_flags_ = flags;
    }
    if (err != cudaSuccess) {
      cudaGetLastError();
      opened.ok = 0;
      std::snprintf(opened.why, sizeof opened.why, "cudaIpcOpenMemHandle of cuda:%d's memory on cuda:%d: %s",
                    peer.device, rank_.device, cudaGetErrorString(err));
    }
    const auto both = exchange(opened);
    for (int r = 0; r < 2; ++r)
      if (both[r].ok == 0) {
        close_peer();
        throw Unsupported("the copy-engine averager cannot map the peer's memory on rank " + std::to_string(r) + " (" +
                          both[r].why + "): use NCCL");
      }
    base_ = static_cast<unsigned char*>(data);
    peer_base_ = static_cast<unsigned char*>(peer_grads_) + peer.grads_offset;
    bytes_ = bytes;
  }

  void average(void* data, std::int64_t count, DType dtype) override {
    const std::int64_t bytes = count * static_cast<std::int64_t>(size_bytes(dtype));
    const std::int64_t offset = static_cast<unsigned char*>(data) - base_;
    if (base_ == nullptr || offset < 0 || offset + bytes > bytes_)
      throw Error("the copy-engine averager averages inside the buffers registered before (register_buffers)");
    if (next_ >= kMaxBuckets)
      throw Error("the copy-engine averager takes at most " + std::to_string(kMaxBuckets) + " buckets per step");
    const int i = next_++;
    auto* my_flags = flags_.as<std::uint32_t>();
    auto* peer_flags = static_cast<std::uint32_t*>(peer_flags_);
    side_.fork(rank_.stream);
    handshake(peer_flags + i, my_flags + i);
    if (const cudaError_t err = cudaMemcpyAsync(scratch_.as<unsigned char>() + offset, peer_base_ + offset,
                                                static_cast<std::size_t>(bytes), cudaMemcpyDefault, side_.get());
        err != cudaSuccess)  // the message built only on failure: eager steps call this every bucket
      throw_cuda(err, "cudaMemcpyAsync", "copy of the peer's gradient bucket");
    // Also with the mean left to the caller: the peer must have copied this bucket before the
    // next step's backward overwrites it, and join() waits for this stream.
    handshake(peer_flags + kMaxBuckets + i, my_flags + kMaxBuckets + i);
    if (!mean_left_to_caller_)
      average_in_place(dtype, data, scratch_.as<unsigned char>() + offset, count, sm_count_, side_.get());
  }

  void* leave_mean_to_caller() override {
    if (base_ == nullptr) throw Error("the copy-engine averager leaves the mean to the caller after register_buffers");
    mean_left_to_caller_ = true;
    return scratch_.get();
  }

  void join() override {
    next_ = 0;
    side_.join(rank_.stream);
  }

  void set_wire_dtype(DType wire, std::int64_t) override {
    throw Unsupported("the copy-engine averager moves gradients in their own dtype, not " +
                      std::string(to_string(wire)) + ": use NCCL for a 16-bit wire");
  }

 private:
  void close_peer() {
    if (peer_grads_ != nullptr) cudaIpcCloseMemHandle(peer_grads_);
    if (peer_flags_ != nullptr) cudaIpcCloseMemHandle(peer_flags_);
    peer_grads_ = peer_flags_ = nullptr;
  }
  // Both ranks' `mine`, in rank order, through one NCCL all-gather (set-up only: it synchronizes).
  template <typename T>
  std::array<T, 2> exchange(const T& mine) {
    DeviceBuffer both(2 * static_cast<std::int64_t>(sizeof(T)), "copy-engine averaging exchange");
    auto* slot = static_cast<char*>(both.get()) + sizeof(T) * static_cast<std::size_t>(me_);
    AB_CUDA(cudaMemcpy(slot, &mine, sizeof mine, cudaMemcpyHostToDevice), "copy-engine averaging exchange");
    AB_NCCL(ncclAllGather(slot, both.get(), sizeof(T), ncclUint8, rank_.comm, side_.get()),
            "copy-engine averaging exchange");
    std::array<T, 2> all{};
    AB_CUDA(cudaMemcpyAsync(all.data(), both.get(), sizeof all, cudaMemcpyDeviceToHost, side_.get()), "exchange");
    AB_CUDA(cudaStreamSynchronize(side_.get()), "copy-engine averaging exchange");
    return all;
  }
  // Tells the peer (its flag) and waits until the peer has told this rank (own flag), then resets it.
  void handshake(std::uint32_t* peer_flag, std::uint32_t* own_flag) {
    const auto stream = reinterpret_cast<CUstream>(side_.get());
    const Driver& d = driver();
    cu(d.write_value(stream, reinterpret_cast<CUdeviceptr>(peer_flag), 1, CU_STREAM_WRITE_VALUE_DEFAULT),
       "cuStreamWriteValue32 (peer's flag)");
    cu(d.wait_value(stream, reinterpret_cast<CUdeviceptr>(own_flag), 1, CU_STREAM_WAIT_VALUE_EQ),
       "cuStreamWaitValue32 (own flag)");
    cu(d.write_value(stream, reinterpret_cast<CUdeviceptr>(own_flag), 0, CU_STREAM_WRITE_VALUE_DEFAULT),
       "cuStreamWriteValue32 (own flag reset)");
  }
  static void cu(CUresult r, const char* call) {
    if (r != CUDA_SUCCESS)
      throw Error(std::string(call) + " failed in the copy-engine averager: CUresult " + std::to_string(static_cast<int>(r)));
  }

  Rank rank_;
  SideStream side_;
  int sm_count_ = 0, me_ = 0;
  DeviceBuffer flags_, scratch_;
  void* peer_grads_ = nullptr;
  void* peer_flags_ = nullptr;
  unsigned char* base_ = nullptr;
  unsigned char* peer_base_ = nullptr;
  std::int64_t bytes_ = 0;
  int next_ = 0;  // the next bucket's flag index in this step
  bool mean_left_to_caller_ = false;
};

}  // namespace

std::unique_ptr<StreamAverager> make_copy_engine_averager(const Rank& rank, bool high_priority) {
  return std::make_unique<CopyEngineAverager>(rank, high_priority);
}

}  // namespace ab::backend::cuda
