// What each collective is, as one table entry (nccl-tests' shape): its name, how its per-rank
// buffers follow from nccl-tests' count, the factor from algorithm to bus bandwidth, the NCCL
// calls one rank makes, and the value the check expects in each output element. Adding a
// collective is adding an entry (collective_traits.cpp); nothing else switches on the op.
// docs/METHODOLOGY.md "Collectives" has the formulas. Portable: the CUDA build's NCCL plan
// (backend/cuda/collectives.cpp) implements CollectiveCalls, the CPU build uses the sizes alone.
#pragma once

#include <array>
#include <cstdint>

#include "backend/collectives.h"

namespace ab::backend {

// Per-rank buffer lengths in elements.
struct CollectiveBuffers {
  std::int64_t send = 0, recv = 0;
};

// The NCCL primitives a collective is made of, on one rank's communicator and stream. Counts are
// elements; roots and peers are global ranks.
class CollectiveCalls {
 public:
  virtual ~CollectiveCalls() = default;
  virtual void all_reduce(const void* send, void* recv, std::int64_t count) = 0;  // sum
  virtual void all_gather(const void* send, void* recv, std::int64_t send_count) = 0;
  virtual void reduce_scatter(const void* send, void* recv, std::int64_t recv_count) = 0;  // sum
  virtual void broadcast(const void* send, void* recv, std::int64_t count, int root) = 0;
  virtual void reduce(const void* send, void* recv, std::int64_t count, int root) = 0;  // sum
  virtual void send(const void* data, std::int64_t count, int peer) = 0;
  virtual void recv(void* data, std::int64_t count, int peer) = 0;
};

// One rank's view of one collective: its buffers (in place: both inside one), nccl-tests' count,
// the per-rank lengths and the group's size.
struct RankCall {
  const char* send = nullptr;
  char* recv = nullptr;
  std::int64_t element_bytes = 0;
  std::int64_t count = 0;
  CollectiveBuffers lengths;
  int rank = 0, ranks = 1;
};

// The check's inputs: element i of rank r holds collective_input_value(r, i), small integers exact
// in every dtype, and so is any sum of up to 64 of them (at most 4 x 64 = 256, bf16's last exact
// integer). `rank_sums[j]`: the sum over all ranks of the value at index j (it depends on j % 4).
double collective_input_value(int rank, std::int64_t i);
struct CheckInputs {
  std::int64_t count = 0;
  CollectiveBuffers lengths;
  int ranks = 1;
  std::array<double, 4> rank_sums{};
};

struct CollectiveTraits {
  CollectiveOp op;
  const char* name;
  bool splits_per_rank;  // the larger buffer holds one chunk per rank: count % ranks == 0
  bool in_place;         // NCCL has an in-place form
  // In place, where the rank's input or output lies inside the one buffer (element offsets).
  std::int64_t (*in_place_send_offset)(int rank, const CollectiveBuffers& lengths);
  std::int64_t (*in_place_recv_offset)(int rank, const CollectiveBuffers& lengths);
  CollectiveBuffers (*buffers)(std::int64_t count, int ranks);
  double (*bus_factor)(int ranks);  // busbw = algbw x bus_factor
  void (*run)(CollectiveCalls& calls, const RankCall& call);
  bool root_output_only;  // only rank 0's output is defined (reduce)
  double (*expected)(const CheckInputs& in, int rank, std::int64_t i);
};

// The entry of `op` (every CollectiveOp has one), and the whole table in collective_op_names' order.
const CollectiveTraits& collective_traits(CollectiveOp op);
const std::array<CollectiveTraits, 7>& all_collective_traits();

}  // namespace ab::backend
