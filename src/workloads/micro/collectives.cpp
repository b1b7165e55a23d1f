// NCCL collectives: nccl-tests' sizes, algorithm and bus bandwidth (docs/METHODOLOGY.md
// "Collectives"). Two shapes: one process driving the visible GPUs, or one process per GPU under
// mpirun/srun, where every rank runs every point in lock step and rank 0 writes the record
// (docs/METHODOLOGY.md "Multi-process runs").
#include <algorithm>
#include <numeric>

#include "backend/collectives.h"
#include "core/checked.h"
#include "core/error.h"
#include "dist/collective_math.h"
#include "dist/comm.h"
#include "dist/world_group.h"
#include "workloads/micro/micro.h"

namespace ab::workloads::micro {
namespace {

struct Params {
  backend::CollectiveOp op;
  DType dtype;
  std::int64_t bytes, in_place, gpus;
  bool graph;
};

// Collectives captured into one CUDA graph: nccl-tests' default 20 per launch for small sizes,
// fewer as a collective grows (from 64 MiB on, one per graph: launch cost no longer matters).
int graph_collectives(std::int64_t bytes) {
  return static_cast<int>(std::clamp<std::int64_t>((std::int64_t{1} << 26) / std::max<std::int64_t>(bytes, 1), 1, 20));
}

void add_common_metrics(State& state, const Params& p, int n, std::int64_t count, int per_run,
                        const backend::CollectiveGroup& group) {
  state.add_metric("ranks", n);
  state.add_metric("nccl_count", count);
  state.add_metric("bus_factor", dist::bus_factor(p.op, n));
  if (p.graph) state.add_metric("graph_collectives", per_run);
  for (const auto& [k, v] : group.forced_settings()) state.add_metric("env_" + k, v);
}

nlohmann::json min_avg_max(const std::vector<double>& v) {
  const auto [lo, hi] = std::minmax_element(v.begin(), v.end());
  return {{"min", *lo}, {"avg", std::accumulate(v.begin(), v.end(), 0.0) / static_cast<double>(v.size())}, {"max", *hi}};
}

class Collectives final : public Workload {
 public:
  std::string name() const override { return "collectives"; }
  std::string description() const override {
    return "NCCL collectives (all_reduce, all_gather, reduce_scatter, broadcast, reduce, all_to_all, send_recv) "
           "across the GPUs of one process, or one process per GPU under mpirun/srun (rank 0 writes the records). "
           "GB/s: algorithm bandwidth, nccl-tests' size / time; metrics: bus bandwidth, per-rank times. The full "
           "sweep is --axis bytes=8:8589934592:pow2.";
  }
  std::vector<AxisSpec> axes(const std::string& device_kind) const override {
    const int visible = device_kind == "cuda" ? backend::collective_device_count() : 0;
    const int world = dist::world().size();
    const int gpus = world > 1 ? world : std::max(visible, 1);
    return {{"op", AxisKind::text, backend::collective_op_names(), backend::collective_op_names(), "the collective"},
            {"dtype", AxisKind::text, {"f32"}, backend::collective_dtype_names(), "element type"},
            {"bytes", AxisKind::integer, expand_values("1024:1073741824:x16", AxisKind::integer), {},
             "nccl-tests' size: per-rank buffer (all_gather: output, reduce_scatter: input)"},
            {"in_place", AxisKind::integer, {"0", "1"}, {}, "1: output overwrites the input"},
            {"gpus", AxisKind::integer, {std::to_string(gpus)}, {},
             "GPUs in the group (default: all visible; under mpirun/srun: the launch's processes)"},
            {"graph", AxisKind::text, {"off"}, {"off", "on"},
             "on: time replays of a CUDA graph of up to 20 captured collectives (nccl-tests' -G; one GPU per "
             "process: under mpirun/srun, or gpus=1)"}};
  }

  void run(State& state) override {
    Params p{backend::parse_collective_op(state.get_text("op")), parse_dtype(state.get_text("dtype")),
             state.get_int("bytes"), state.get_int("in_place"), state.get_int("gpus"), state.get_text("graph") == "on"};
    if (p.bytes < 1) throw UsageError("collectives needs bytes >= 1");
    if (p.in_place != 0 && p.in_place != 1) throw UsageError("collectives: in_place is 0 or 1");
    if (p.gpus < 1) throw UsageError("collectives needs gpus >= 1");
    // Each rank holds an input and an output buffer, neither larger than `bytes` (all_gather: its
    // output; reduce_scatter: its input): twice `bytes` bounds one device's share.
    const auto& device = state.backend().info();
    check_fits_memory(checked_mul(2, p.bytes, "collectives bytes of input and output"), device.memory_bytes,
                      "collectives buffers", device.id);
    dist::Comm& comm = dist::world();
    if (comm.size() > 1) run_ranks(state, p, comm);
    else run_local(state, p);
  }

 private:
  // Reasons to skip that do not depend on the process; empty when the point can run.
  static void skip_if_unrunnable(State& state, const Params& p, int n, std::int64_t count) {
    const auto& info = state.backend().info();
    if (info.kind != "cuda") state.skip("collectives run over NCCL on CUDA devices; " + info.id + " is not one");
    if (p.in_place == 1 && !backend::collective_has_in_place(p.op))
      state.skip(backend::collective_op_name(p.op) + " has no in-place form in NCCL; measured with in_place=0");
    if (count < 1)
      state.skip(std::to_string(p.bytes) + " bytes hold less than one " + std::string(to_string(p.dtype)) +
                 " element per rank for " + std::to_string(n) + " rank(s)");
  }

  // One process, `gpus` GPUs: the backend's event timer spans every rank (fork and join).
  static void run_local(State& state, const Params& p) {
    const int n = static_cast<int>(p.gpus);
    const std::int64_t count = dist::collective_count(p.op, p.bytes, static_cast<std::int64_t>(size_bytes(p.dtype)), n);
    if (state.backend().info().kind == "cuda") {
      const int visible = backend::collective_device_count();
      if (p.gpus > visible)
        state.skip("gpus=" + std::to_string(p.gpus) + " but " + std::to_string(visible) + " GPU(s) visible");
    }
    skip_if_unrunnable(state, p, n, count);
    if (p.graph && n > 1)
      state.skip("graph=on needs one GPU per process (NCCL: a graph launch over several GPUs from one thread can "
                 "deadlock); run under mpirun or srun, or with gpus=1");
    const int per_run = p.graph ? graph_collectives(p.bytes) : 0;
    auto group = backend::make_collective_group(state.backend(), n);
    auto plan = group->make_plan({p.op, p.dtype, count, p.in_place == 1, per_run});
    state.check(static_cast<double>(plan->check()), 0.0, "wrong elements after one collective, against the host");
    const double used_bytes = static_cast<double>(count) * static_cast<double>(size_bytes(p.dtype));
    const int k = plan->collectives_per_run();
    state.set_counts({static_cast<double>(k), 0.0, used_bytes * k, "FLOP"});
    state.exec([&plan] { plan->run(); });

    add_common_metrics(state, p, n, count, k, *group);
    state.add_metric("devices", group->device_ids());
    if (const auto& r = state.result(); r && r->summary.median > 0) {
      const double algbw = used_bytes * k / r->summary.median / 1e9;
      state.add_metric("algbw_gbps", algbw);
      state.add_metric("busbw_gbps", algbw * dist::bus_factor(p.op, n));
      // Each rank's own time, over about 20 ms of back-to-back iterations (at most 1000).
      const int iters = static_cast<int>(std::clamp(0.02 / r->summary.median, 1.0, 1000.0));
      const std::vector<double> per_rank = plan->per_rank_seconds(iters);
      nlohmann::json times = min_avg_max(per_rank);
      times["iterations"] = iters;
      state.add_metric("rank_time_s", times);
      std::vector<double> busbw;
      for (double t : per_rank) busbw.push_back(t > 0 ? used_bytes / t / 1e9 * dist::bus_factor(p.op, n) : 0.0);
      state.add_metric("rank_busbw_gbps", min_avg_max(busbw));
    }
  }

  // One rank of a multi-process launch on its own GPU. Every step that can fail on one rank alone
  // is agreed on before the next collective call; the measurement is rank 0's, followed by all.
  static void run_ranks(State& state, const Params& p, dist::Comm& comm) {
    const int n = comm.size();
    const std::int64_t count = dist::collective_count(p.op, p.bytes, static_cast<std::int64_t>(size_bytes(p.dtype)), n);
    on_all_ranks(comm, [&] {
      if (p.gpus != n)
        state.skip("a launch of " + std::to_string(n) + " processes runs its collectives over all of them; gpus=" +
                   std::to_string(p.gpus) + " needs -np " + std::to_string(p.gpus));
      skip_if_unrunnable(state, p, n, count);
    });
    const int per_run = p.graph ? graph_collectives(p.bytes) : 0;
    std::unique_ptr<backend::CollectiveGroup> group;
    std::unique_ptr<backend::CollectivePlan> plan;
    on_all_ranks(comm, [&] {
      group = dist::world_collective_group(state.backend(), comm);
      plan = group->make_plan({p.op, p.dtype, count, p.in_place == 1, per_run});
    });
    std::int64_t wrong = 0;
    on_all_ranks(comm, [&] { wrong = plan->check(); });
    state.check(static_cast<double>(dist::sum_over_ranks(comm, wrong)), 0.0,
                "wrong elements after one collective, against the host, over all ranks");
    const double used_bytes = static_cast<double>(count) * static_cast<double>(size_bytes(p.dtype));
    const int k = plan->collectives_per_run();
    state.set_counts({static_cast<double>(k), 0.0, used_bytes * k, "FLOP"});
    state.exec([&plan] { plan->run(); });  // in lock step over the launch's ranks

    add_common_metrics(state, p, n, count, k, *group);
    std::string mine = group->device_ids().front();
    std::vector<std::string> devices;
    for (const auto& b : comm.allgather(dist::Bytes(mine.begin(), mine.end()))) devices.emplace_back(b.begin(), b.end());
    state.add_metric("devices", devices);
    state.add_metric("processes", n);
    if (const double median = state.result()->summary.median; median > 0) {
      const double factor = dist::bus_factor(p.op, n);
      const double algbw = used_bytes * k / median / 1e9;
      state.add_metric("algbw_gbps", algbw);
      state.add_metric("busbw_gbps", algbw * factor);
      // Each rank's own median time per collective, and the bus bandwidth it gives.
      std::vector<double> times, busbw;
      for (const auto& t : state.rank_times()) {
        times.push_back(t.median_s / k);
        busbw.push_back(t.median_s > 0 ? used_bytes * k / t.median_s / 1e9 * factor : 0.0);
      }
      state.add_metric("rank_time_s", min_avg_max(times));
      state.add_metric("rank_busbw_gbps", min_avg_max(busbw));
    }
  }
};

}  // namespace

std::unique_ptr<Workload> make_collectives() { return std::make_unique<Collectives>(); }

}  // namespace ab::workloads::micro
