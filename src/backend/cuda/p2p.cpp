// Copies between two GPUs, or between pinned host memory and a GPU, for the p2p workload's
// bandwidth and latency matrices (the shape of CUDA's p2pBandwidthLatencyTest): copy-engine copies
// with cudaMemcpyPeerAsync, peer access enabled where the pair allows it (without it the driver
// stages the copy through host memory, and the record says so).
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstring>
#include <string>
#include <vector>

#include "backend/cuda/check.h"
#include "backend/cuda/collectives.h"
#include "backend/cuda/cuda_backend.h"
#include "core/error.h"
#include "core/rng.h"

namespace ab::backend::cuda {
namespace {

std::string side_name(int side) { return side == kHostSide ? "host" : "cuda:" + std::to_string(side); }

// Memory on one side: device memory on a GPU, page-locked memory on the host.
struct SideBuffer {
  int side = kHostSide;
  DeviceBuffer device;
  PinnedBuffer host;
  SideBuffer(int s, std::int64_t bytes, const std::string& what) : side(s) {
    if (side == kHostSide) {
      host = PinnedBuffer(bytes, what);
    } else {
      AB_CUDA(cudaSetDevice(side), what);
      device = DeviceBuffer(bytes, what);
    }
  }
  void* get() const { return side == kHostSide ? host.get() : device.get(); }
};

// Events on one stream; cold samples are plain ones (a copy of this size streams from memory).
class StreamTimer final : public measure::IterationTimer {
 public:
  StreamTimer(int device, cudaStream_t stream) : device_(device), stream_(stream) {
    AB_CUDA(cudaSetDevice(device_), "p2p timer");
    start_ = create_event("p2p timer");
    stop_ = create_event("p2p timer");
  }
  double time_batch(const std::function<void()>& iteration, std::int64_t count) override {
    AB_CUDA(cudaSetDevice(device_), "p2p timer");
    AB_CUDA(cudaEventRecord(start_.get(), stream_), "p2p timer start");
    for (std::int64_t i = 0; i < count; ++i) iteration();
    AB_CUDA(cudaSetDevice(device_), "p2p timer");
    AB_CUDA(cudaEventRecord(stop_.get(), stream_), "p2p timer stop");
    AB_CUDA(cudaEventSynchronize(stop_.get()), "p2p timer stop");
    float ms = 0;
    AB_CUDA(cudaEventElapsedTime(&ms, start_.get(), stop_.get()), "p2p timer elapsed");
    return static_cast<double>(ms) * 1e-3;
  }
  double time_cold(const std::function<void()>& iteration) override { return time_batch(iteration, 1); }

 private:
  int device_;
  cudaStream_t stream_;
  EventPtr start_, stop_;
};

class PeerCopy final : public PeerCopyPlan {
 public:
  explicit PeerCopy(const PeerCopyDesc& d) : d_(d) {
    const int visible = device_count();
    auto valid = [visible](int side) { return side == kHostSide || (side >= 0 && side < visible); };
    if (!valid(d.src) || !valid(d.dst))
      throw UsageError("p2p: " + side_name(d.src) + " -> " + side_name(d.dst) + " names a device that is not one of the " +
                       std::to_string(visible) + " visible GPUs");
    if (d.src == kHostSide && d.dst == kHostSide) throw UsageError("p2p: host to host is not a GPU copy");
    if (d.bytes < 1) throw UsageError("p2p needs bytes >= 1");
    // The stream of the forward copy lives on the source GPU (on the destination for host sources);
    // the reverse copy's on the other GPU.
    dev_a_ = d.src == kHostSide ? d.dst : d.src;
    dev_b_ = d.dst == kHostSide ? d.src : d.dst;
    const std::string what = "p2p " + side_name(d.src) + " -> " + side_name(d.dst);
    if (d.src == kHostSide || d.dst == kHostSide) facts_["host_memory"] = "pinned";
    if (d.src == d.dst) facts_["same_device"] = "1";
    if (d.src != kHostSide && d.dst != kHostSide && d.src != d.dst) {
      enable_peer(d.src, d.dst);
      if (d.bidirectional) enable_peer(d.dst, d.src);
      int rank = 0;
      if (cudaDeviceGetP2PAttribute(&rank, cudaDevP2PAttrPerformanceRank, d.src, d.dst) == cudaSuccess)
        facts_["p2p_performance_rank"] = std::to_string(rank);
      int atomics = 0;
      if (cudaDeviceGetP2PAttribute(&atomics, cudaDevP2PAttrNativeAtomicSupported, d.src, d.dst) == cudaSuccess)
        facts_["p2p_native_atomics"] = std::to_string(atomics);
    }
    AB_CUDA(cudaSetDevice(dev_a_), what);
    stream_a_ = create_stream(what + " stream");
    fork_ = create_event(what + " fork");
    a_src_.emplace_back(d.src, d.bytes, what + " source");
    a_dst_.emplace_back(d.dst, d.bytes, what + " destination");
    if (d.bidirectional) {
      AB_CUDA(cudaSetDevice(dev_b_), what);
      stream_b_ = create_stream(what + " reverse stream");
      join_ = create_event(what + " join");
      a_src_.emplace_back(d.dst, d.bytes, what + " reverse source");
      a_dst_.emplace_back(d.src, d.bytes, what + " reverse destination");
    }
  }

  ~PeerCopy() override {
    cudaSetDevice(dev_a_);
    cudaStreamSynchronize(stream_a_.get());
    if (stream_b_) {
      cudaSetDevice(dev_b_);
      cudaStreamSynchronize(stream_b_.get());
    }
  }
  PeerCopy(const PeerCopy&) = delete;
  PeerCopy& operator=(const PeerCopy&) = delete;

  void run() override {
    if (stream_b_) {
      AB_CUDA(cudaSetDevice(dev_a_), "p2p fork");
      AB_CUDA(cudaEventRecord(fork_.get(), stream_a_.get()), "p2p fork");
      AB_CUDA(cudaStreamWaitEvent(stream_b_.get(), fork_.get(), 0), "p2p fork");
    }
    copy(0, stream_a_.get());
    if (stream_b_) {
      copy(1, stream_b_.get());
      AB_CUDA(cudaSetDevice(dev_b_), "p2p join");
      AB_CUDA(cudaEventRecord(join_.get(), stream_b_.get()), "p2p join");
      AB_CUDA(cudaStreamWaitEvent(stream_a_.get(), join_.get(), 0), "p2p join");
    }
  }

  std::int64_t check() override {
    const std::uint64_t seed = fresh_seed();
    std::vector<std::vector<std::uint8_t>> expected(a_src_.size());
    for (std::size_t c = 0; c < a_src_.size(); ++c) {
      auto& bytes = expected[c];
      bytes.resize(static_cast<std::size_t>(d_.bytes));
      for (std::size_t i = 0; i < bytes.size(); i += 8) {
        const std::uint64_t v = mix64(seed + c, i / 8);
        std::memcpy(bytes.data() + i, &v, std::min<std::size_t>(8, bytes.size() - i));
      }
      write(a_src_[c], bytes.data());
      fill_zero(a_dst_[c]);
    }
    // cudaMemset and a pageable cudaMemcpy may still be in flight on the legacy stream, which our
    // non-blocking streams do not wait for.
    for (int side : {d_.src, d_.dst}) {
      if (side == kHostSide) continue;
      AB_CUDA(cudaSetDevice(side), "p2p check");
      AB_CUDA(cudaDeviceSynchronize(), "p2p check inputs");
    }
    run();
    sync();
    std::int64_t wrong = 0;
    std::vector<std::uint8_t> got(static_cast<std::size_t>(d_.bytes));
    for (std::size_t c = 0; c < a_dst_.size(); ++c) {
      read(a_dst_[c], got.data());
      for (std::size_t i = 0; i < got.size(); ++i) wrong += got[i] != expected[c][i];
    }
    return wrong;
  }

  std::unique_ptr<measure::IterationTimer> make_timer() override {
    return std::make_unique<StreamTimer>(dev_a_, stream_a_.get());
  }

  std::map<std::string, std::string> link_facts() const override { return facts_; }

 private:
  void enable_peer(int from, int to) {
    int can = 0;
    AB_CUDA(cudaDeviceCanAccessPeer(&can, from, to), "p2p peer access query");
    if (can == 0) {
      facts_["peer_access"] = "0";  // the driver stages these copies through host memory
      return;
    }
    facts_.emplace("peer_access", "1");
    AB_CUDA(cudaSetDevice(from), "p2p peer access");
    const cudaError_t err = cudaDeviceEnablePeerAccess(to, 0);
    if (err == cudaErrorPeerAccessAlreadyEnabled) cudaGetLastError();  // enabled by an earlier point
    else AB_CUDA(err, "p2p peer access " + side_name(from) + " -> " + side_name(to));
  }

  void copy(std::size_t c, cudaStream_t stream) {
    const int src = c == 0 ? d_.src : d_.dst, dst = c == 0 ? d_.dst : d_.src;
    const auto n = static_cast<std::size_t>(d_.bytes);
    if (src != kHostSide && dst != kHostSide)
      AB_CUDA(cudaMemcpyPeerAsync(a_dst_[c].get(), dst, a_src_[c].get(), src, n, stream), "p2p copy");
    else
      AB_CUDA(cudaMemcpyAsync(a_dst_[c].get(), a_src_[c].get(), n, cudaMemcpyDefault, stream), "p2p copy");
  }

  void sync() {
    AB_CUDA(cudaSetDevice(dev_a_), "p2p sync");
    AB_CUDA(cudaStreamSynchronize(stream_a_.get()), "p2p sync");
  }
  void write(SideBuffer& b, const std::uint8_t* from) {
    if (b.side == kHostSide) std::memcpy(b.get(), from, static_cast<std::size_t>(d_.bytes));
    else AB_CUDA(cudaMemcpy(b.get(), from, static_cast<std::size_t>(d_.bytes), cudaMemcpyHostToDevice), "p2p check input");
  }
  void fill_zero(SideBuffer& b) {
    if (b.side == kHostSide) std::memset(b.get(), 0, static_cast<std::size_t>(d_.bytes));
    else AB_CUDA(cudaMemset(b.get(), 0, static_cast<std::size_t>(d_.bytes)), "p2p check output");
  }
  void read(SideBuffer& b, std::uint8_t* to) {
    if (b.side == kHostSide) std::memcpy(to, b.get(), static_cast<std::size_t>(d_.bytes));
    else AB_CUDA(cudaMemcpy(to, b.get(), static_cast<std::size_t>(d_.bytes), cudaMemcpyDeviceToHost), "p2p check output");
  }

  PeerCopyDesc d_;
  int dev_a_ = 0, dev_b_ = 0;
  StreamPtr stream_a_, stream_b_;
  EventPtr fork_, join_;
  std::vector<SideBuffer> a_src_, a_dst_;  // [0]: src -> dst; [1]: dst -> src (bidirectional)
  std::map<std::string, std::string> facts_;
};

}  // namespace

std::unique_ptr<PeerCopyPlan> make_peer_copy(const PeerCopyDesc& desc) { return std::make_unique<PeerCopy>(desc); }

}  // namespace ab::backend::cuda
