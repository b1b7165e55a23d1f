// NCCL collectives across the GPUs of this process: nccl-tests' sizes, algorithm and bus
// bandwidth (docs/METHODOLOGY.md "Collectives"). Multi-process launches come later (src/dist).
#include <algorithm>
#include <numeric>

#include "backend/collectives.h"
#include "core/error.h"
#include "dist/collective_math.h"
#include "workloads/micro/micro.h"

namespace ab::workloads::micro {
namespace {

class Collectives final : public Workload {
 public:
  std::string name() const override { return "collectives"; }
  std::string description() const override {
    return "NCCL collectives across the GPUs of one process (all_reduce, all_gather, reduce_scatter, broadcast, "
           "reduce, all_to_all, send_recv). GB/s: algorithm bandwidth, nccl-tests' size / time; metrics: bus "
           "bandwidth, per-GPU times. The full sweep is --axis bytes=8:8589934592:pow2.";
  }
  std::vector<AxisSpec> axes(const std::string& device_kind) const override {
    const int visible = device_kind == "cuda" ? backend::collective_device_count() : 0;
    return {{"op", AxisKind::text, backend::collective_op_names(), backend::collective_op_names(), "the collective"},
            {"dtype", AxisKind::text, {"f32"}, backend::collective_dtype_names(), "element type"},
            {"bytes", AxisKind::integer, expand_values("1024:1073741824:x16", AxisKind::integer), {},
             "nccl-tests' size: per-rank buffer (all_gather: output, reduce_scatter: input)"},
            {"in_place", AxisKind::integer, {"0", "1"}, {}, "1: output overwrites the input"},
            {"gpus", AxisKind::integer, {std::to_string(std::max(visible, 1))}, {},
             "GPUs in the group (default: all visible)"}};
  }

  void run(State& state) override {
    const auto op = backend::parse_collective_op(state.get_text("op"));
    const DType dtype = parse_dtype(state.get_text("dtype"));
    const std::int64_t bytes = state.get_int("bytes");
    const std::int64_t in_place = state.get_int("in_place");
    const std::int64_t gpus = state.get_int("gpus");
    if (bytes < 1) throw UsageError("collectives needs bytes >= 1");
    if (in_place != 0 && in_place != 1) throw UsageError("collectives: in_place is 0 or 1");
    if (gpus < 1) throw UsageError("collectives needs gpus >= 1");
    const auto& info = state.backend().info();
    if (info.kind != "cuda") state.skip("collectives run over NCCL on CUDA devices; " + info.id + " is not one");
    const int visible = backend::collective_device_count();
    if (gpus > visible)
      state.skip("gpus=" + std::to_string(gpus) + " but " + std::to_string(visible) + " GPU(s) visible");
    const int n = static_cast<int>(gpus);
    if (in_place == 1 && !backend::collective_has_in_place(op))
      state.skip(backend::collective_op_name(op) + " has no in-place form in NCCL; measured with in_place=0");
    const auto elem = static_cast<std::int64_t>(size_bytes(dtype));
    const std::int64_t count = dist::collective_count(op, bytes, elem, n);
    if (count < 1)
      state.skip(std::to_string(bytes) + " bytes hold less than one " + std::string(to_string(dtype)) +
                 " element per rank for " + std::to_string(n) + " rank(s)");

    auto group = backend::make_collective_group(state.backend(), n);
    auto plan = group->make_plan({op, dtype, count, in_place == 1});
    state.check(static_cast<double>(plan->check()), 0.0, "wrong elements after one collective, against the host");
    const double used_bytes = static_cast<double>(count * elem);
    state.set_counts({1.0, 0.0, used_bytes, "FLOP"});
    state.exec([&plan] { plan->run(); });

    const double factor = dist::bus_factor(op, n);
    state.add_metric("ranks", n);
    state.add_metric("devices", group->device_ids());
    state.add_metric("nccl_count", count);
    state.add_metric("bus_factor", factor);
    for (const auto& [k, v] : group->forced_settings()) state.add_metric("env_" + k, v);
    if (const auto& r = state.result(); r && r->summary.median > 0) {
      const double algbw = used_bytes / r->summary.median / 1e9;
      state.add_metric("algbw_gbps", algbw);
      state.add_metric("busbw_gbps", algbw * factor);
      // Each rank's own time, over about 20 ms of back-to-back collectives (at most 1000).
      const int iters = static_cast<int>(std::clamp(0.02 / r->summary.median, 1.0, 1000.0));
      const std::vector<double> t = plan->per_rank_seconds(iters);
      const auto [lo, hi] = std::minmax_element(t.begin(), t.end());
      state.add_metric("rank_time_s", {{"min", *lo},
                                       {"avg", std::accumulate(t.begin(), t.end(), 0.0) / static_cast<double>(t.size())},
                                       {"max", *hi},
                                       {"iterations", iters}});
    }
  }
};

}  // namespace

std::unique_ptr<Workload> make_collectives() { return std::make_unique<Collectives>(); }

}  // namespace ab::workloads::micro
