// One entry per collective: its pieces first, grouped by collective, then the table.
#include "backend/collective_traits.h"

#include <string>

#include "core/error.h"

namespace ab::backend {
namespace {

using Op = CollectiveOp;

// ---- shared by several entries
std::int64_t at_start(int, const CollectiveBuffers&) { return 0; }
CollectiveBuffers same_lengths(std::int64_t count, int) { return {count, count}; }
double bus_one(int) { return 1.0; }
double bus_per_chunk(int n) { return (n - 1.0) / n; }
double summed(const CheckInputs& in, int, std::int64_t i) { return in.rank_sums[static_cast<std::size_t>(i % 4)]; }

// ---- all_reduce: every rank ends with the sum of all inputs
double bus_all_reduce(int n) { return 2.0 * (n - 1.0) / n; }
void run_all_reduce(CollectiveCalls& c, const RankCall& r) { c.all_reduce(r.send, r.recv, r.count); }

// ---- all_gather: rank q's input lands in chunk q of every output
std::int64_t all_gather_send_offset(int rank, const CollectiveBuffers& l) { return rank * l.send; }
CollectiveBuffers all_gather_lengths(std::int64_t count, int n) { return {count / n, count}; }
void run_all_gather(CollectiveCalls& c, const RankCall& r) { c.all_gather(r.send, r.recv, r.lengths.send); }
double all_gather_expected(const CheckInputs& in, int, std::int64_t i) {
  return collective_input_value(static_cast<int>(i / in.lengths.send), i % in.lengths.send);
}

// ---- reduce_scatter: rank q ends with chunk q of the sum
std::int64_t reduce_scatter_recv_offset(int rank, const CollectiveBuffers& l) { return rank * l.recv; }
CollectiveBuffers reduce_scatter_lengths(std::int64_t count, int n) { return {count, count / n}; }
void run_reduce_scatter(CollectiveCalls& c, const RankCall& r) { c.reduce_scatter(r.send, r.recv, r.lengths.recv); }
double reduce_scatter_expected(const CheckInputs& in, int rank, std::int64_t i) {
  return summed(in, rank, rank * in.lengths.recv + i);
}

// ---- broadcast and reduce: root 0
void run_broadcast(CollectiveCalls& c, const RankCall& r) { c.broadcast(r.send, r.recv, r.count, 0); }
double broadcast_expected(const CheckInputs&, int, std::int64_t i) { return collective_input_value(0, i); }
void run_reduce(CollectiveCalls& c, const RankCall& r) { c.reduce(r.send, r.recv, r.count, 0); }

// ---- all_to_all: chunk p of rank q's input lands in chunk q of rank p's output
void run_all_to_all(CollectiveCalls& c, const RankCall& r) {
  const std::int64_t chunk = r.count / r.ranks;
  for (int p = 0; p < r.ranks; ++p) {
    c.send(r.send + p * chunk * r.element_bytes, chunk, p);
    c.recv(r.recv + p * chunk * r.element_bytes, chunk, p);
  }
}
double all_to_all_expected(const CheckInputs& in, int rank, std::int64_t i) {
  const std::int64_t chunk = in.count / in.ranks;
  return collective_input_value(static_cast<int>(i / chunk), rank * chunk + i % chunk);
}

// ---- send_recv: a ring, each rank sends to the next and receives from the previous
void run_send_recv(CollectiveCalls& c, const RankCall& r) {
  c.send(r.send, r.count, (r.rank + 1) % r.ranks);
  c.recv(r.recv, r.count, (r.rank + r.ranks - 1) % r.ranks);
}
double send_recv_expected(const CheckInputs& in, int rank, std::int64_t i) {
  return collective_input_value((rank + in.ranks - 1) % in.ranks, i);
}

constexpr std::array<CollectiveTraits, 7> kTraits{{
    {.op = Op::all_reduce,
     .name = "all_reduce",
     .splits_per_rank = false,
     .in_place = true,
     .in_place_send_offset = at_start,
     .in_place_recv_offset = at_start,
     .buffers = same_lengths,
     .bus_factor = bus_all_reduce,
     .run = run_all_reduce,
     .root_output_only = false,
     .expected = summed},
    {.op = Op::all_gather,
     .name = "all_gather",
     .splits_per_rank = true,
     .in_place = true,
     .in_place_send_offset = all_gather_send_offset,
     .in_place_recv_offset = at_start,
     .buffers = all_gather_lengths,
     .bus_factor = bus_per_chunk,
     .run = run_all_gather,
     .root_output_only = false,
     .expected = all_gather_expected},
    {.op = Op::reduce_scatter,
     .name = "reduce_scatter",
     .splits_per_rank = true,
     .in_place = true,
     .in_place_send_offset = at_start,
     .in_place_recv_offset = reduce_scatter_recv_offset,
     .buffers = reduce_scatter_lengths,
     .bus_factor = bus_per_chunk,
     .run = run_reduce_scatter,
     .root_output_only = false,
     .expected = reduce_scatter_expected},
    {.op = Op::broadcast,
     .name = "broadcast",
     .splits_per_rank = false,
     .in_place = true,
     .in_place_send_offset = at_start,
     .in_place_recv_offset = at_start,
     .buffers = same_lengths,
     .bus_factor = bus_one,
     .run = run_broadcast,
     .root_output_only = false,
     .expected = broadcast_expected},
    {.op = Op::reduce,
     .name = "reduce",
     .splits_per_rank = false,
     .in_place = true,
     .in_place_send_offset = at_start,
     .in_place_recv_offset = at_start,
     .buffers = same_lengths,
     .bus_factor = bus_one,
     .run = run_reduce,
     .root_output_only = true,
     .expected = summed},
    {.op = Op::all_to_all,
     .name = "all_to_all",
     .splits_per_rank = true,
     .in_place = false,
     .in_place_send_offset = at_start,
     .in_place_recv_offset = at_start,
     .buffers = same_lengths,
     .bus_factor = bus_per_chunk,
     .run = run_all_to_all,
     .root_output_only = false,
     .expected = all_to_all_expected},
    {.op = Op::send_recv,
     .name = "send_recv",
     .splits_per_rank = false,
     .in_place = false,
     .in_place_send_offset = at_start,
     .in_place_recv_offset = at_start,
     .buffers = same_lengths,
     .bus_factor = bus_one,
     .run = run_send_recv,
     .root_output_only = false,
     .expected = send_recv_expected},
}};

constexpr bool in_enum_order() {
  for (std::size_t i = 0; i < kTraits.size(); ++i)
    if (static_cast<std::size_t>(kTraits[i].op) != i) return false;
  return true;
}
static_assert(in_enum_order(), "one entry per CollectiveOp, in the enum's order");

}  // namespace

double collective_input_value(int rank, std::int64_t i) { return 1.0 + static_cast<double>((rank + i) % 4); }

const std::array<CollectiveTraits, 7>& all_collective_traits() { return kTraits; }

const CollectiveTraits& collective_traits(CollectiveOp op) {
  const auto i = static_cast<std::size_t>(op);
  if (i >= kTraits.size()) throw Error("internal: no traits for collective " + std::to_string(i));
  return kTraits[i];
}

}  // namespace ab::backend
