// GPU-to-GPU and host-to-GPU copies from one process: the bandwidth and latency matrices of CUDA's
// p2pBandwidthLatencyTest (docs/METHODOLOGY.md "Peer copies"). Each point is one (src, dst) pair at
// one size; the diagonal is a copy within one GPU, for scale.
#include "backend/collectives.h"
#include "core/checked.h"
#include "core/error.h"
#include "dist/comm.h"
#include "workloads/micro/micro.h"

namespace ab::workloads::micro {
namespace {

int parse_side(const std::string& text) { return text == "host" ? backend::kHostSide : std::stoi(text); }

class P2p final : public Workload {
 public:
  std::string name() const override { return "p2p"; }
  std::string description() const override {
    return "Copies between every pair of visible GPUs (cudaMemcpyPeerAsync, peer access enabled where the pair "
           "allows) and between pinned host memory and each GPU: bandwidth at 256 MiB, latency at 8 B, one way or "
           "both ways at once; each copy's bytes are checked. GB/s counts the bytes copied (both directions when bi).";
  }
  std::vector<AxisSpec> axes(const std::string& device_kind) const override {
    const int visible = device_kind == "cuda" ? backend::collective_device_count() : 0;
    std::vector<std::string> sides{"host"};
    for (int i = 0; i < std::max(visible, 1); ++i) sides.push_back(std::to_string(i));
    const std::vector<std::string> defaults = visible > 0 ? sides : std::vector<std::string>{"0"};
    return {{"src", AxisKind::text, defaults, sides, "source: host (pinned memory) or a GPU index"},
            {"dst", AxisKind::text, defaults, sides, "destination: host (pinned memory) or a GPU index"},
            {"bytes", AxisKind::integer, {"8", "268435456"}, {}, "bytes per copy (8: latency, 256 MiB: bandwidth)"},
            {"direction", AxisKind::text, {"uni"}, {"uni", "bi"}, "uni: src -> dst; bi: both ways at once"}};
  }

  void run(State& state) override {
    const std::string src_text = state.get_text("src"), dst_text = state.get_text("dst");
    const std::int64_t bytes = state.get_int("bytes");
    const bool bi = state.get_text("direction") == "bi";
    if (bytes < 1) throw UsageError("p2p needs bytes >= 1");
    // Each side holds a source and a destination buffer when both directions run.
    const std::int64_t moved = checked_mul(bi ? 2 : 1, bytes, "p2p bytes moved");
    check_fits_memory(checked_mul(2, bytes, "p2p bytes of source and destination"), state.backend().info().memory_bytes,
                      "p2p buffers", state.backend().info().id);
    if (dist::world().size() > 1)
      state.skip("p2p measures the GPUs of one process; run it without mpirun or srun");
    const auto& info = state.backend().info();
    if (info.kind != "cuda") state.skip("p2p copies need CUDA GPUs; " + info.id + " is not one");
    if (src_text == "host" && dst_text == "host") state.skip("host to host is not a GPU copy");
    const backend::PeerCopyDesc desc{parse_side(src_text), parse_side(dst_text), bytes, bi};
    const int visible = backend::collective_device_count();
    for (int side : {desc.src, desc.dst})
      if (side >= visible)
        state.skip("cuda:" + std::to_string(side) + " is not visible (" + std::to_string(visible) + " GPU(s))");

    auto plan = backend::make_peer_copy(desc);
    state.check(static_cast<double>(plan->check()), 0.0, "bytes that differ from the source after one copy");
    state.set_counts({1.0, 0.0, static_cast<double>(moved), "FLOP"});
    auto timer = plan->make_timer();
    state.exec(*timer, [&plan] { plan->run(); });

    for (const auto& [k, v] : plan->link_facts()) state.add_metric(k, v);
    if (const auto& r = state.result(); r && r->summary.median > 0) state.add_metric("latency_us", r->summary.median * 1e6);
  }
};

}  // namespace

std::unique_ptr<Workload> make_p2p() { return std::make_unique<P2p>(); }

}  // namespace ab::workloads::micro
