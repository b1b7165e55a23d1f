// The NCCL primitives of one rank, as a collective's traits entry (backend/collective_traits.h)
// calls them: each one an ncclAllReduce, ncclSend... on the rank's communicator and stream,
// checked where it is made. Internal to the collectives (collectives.cpp).
#pragma once

#include <nccl.h>

#include <cstdint>
#include <string>
#include <utility>

#include "backend/collective_traits.h"
#include "backend/cuda/nccl_common.h"

namespace ab::backend::cuda {

class NcclCalls final : public CollectiveCalls {
 public:
  NcclCalls(const Rank& rank, ncclDataType_t type, std::string what)
      : comm_(rank.comm), stream_(rank.stream), type_(type), what_(std::move(what)) {}
  void all_reduce(const void* send, void* recv, std::int64_t count) override {
    AB_NCCL(ncclAllReduce(send, recv, n(count), type_, ncclSum, comm_, stream_), what_);
  }
  void all_gather(const void* send, void* recv, std::int64_t send_count) override {
    AB_NCCL(ncclAllGather(send, recv, n(send_count), type_, comm_, stream_), what_);
  }
  void reduce_scatter(const void* send, void* recv, std::int64_t recv_count) override {
    AB_NCCL(ncclReduceScatter(send, recv, n(recv_count), type_, ncclSum, comm_, stream_), what_);
  }
  void broadcast(const void* send, void* recv, std::int64_t count, int root) override {
    AB_NCCL(ncclBroadcast(send, recv, n(count), type_, root, comm_, stream_), what_);
  }
  void reduce(const void* send, void* recv, std::int64_t count, int root) override {
    AB_NCCL(ncclReduce(send, recv, n(count), type_, ncclSum, root, comm_, stream_), what_);
  }
  void send(const void* data, std::int64_t count, int peer) override {
    AB_NCCL(ncclSend(data, n(count), type_, peer, comm_, stream_), what_);
  }
  void recv(void* data, std::int64_t count, int peer) override {
    AB_NCCL(ncclRecv(data, n(count), type_, peer, comm_, stream_), what_);
  }

 private:
  static std::size_t n(std::int64_t count) { return static_cast<std::size_t>(count); }
  ncclComm_t comm_;
  cudaStream_t stream_;
  ncclDataType_t type_;
  std::string what_;
};

}  // namespace ab::backend::cuda
