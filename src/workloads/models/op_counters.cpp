// A model's counter pass: one eager step (or forward) with each op's forward and backward a range
// of its own, so that the per-op table carries the DRAM bytes the hardware moved beside the bytes
// the op's model counts. docs/METHODOLOGY.md, "Hardware counters".
#include <memory>

#include "workloads/models/models.h"

namespace ab::workloads::zoo {
namespace {

// Marks every op's forward and backward as a range "<op>:forward" / "<op>:backward".
class OpRanges final : public nn::OpObserver {
 public:
  OpRanges(const nn::Graph& graph, counters::RangeMarks& marks) : graph_(graph), marks_(marks) {}
  void begin(std::size_t op, bool backward) override { marks_.begin(op_range_name(graph_.op(op).name(), backward)); }
  void end(std::size_t, bool) override { marks_.end(); }

 private:
  const nn::Graph& graph_;
  counters::RangeMarks& marks_;
};

// The observer is the graph's only while the pass runs, also when the pass throws.
struct Observing {
  nn::Graph& graph;
  Observing(nn::Graph& g, nn::OpObserver& o) : graph(g) { graph.set_op_observer(&o); }
  ~Observing() { graph.set_op_observer(nullptr); }
  Observing(const Observing&) = delete;
  Observing& operator=(const Observing&) = delete;
};

// Each range's measured DRAM bytes and duration beside its op's modelled FLOPs and bytes: what the
// report's measured roofline places op by op.
nlohmann::json ops_json(const nn::Graph& graph, const counters::Measurement& m) {
  std::map<std::string, std::pair<double, double>> modelled;  // range name -> FLOPs, bytes
  for (const nn::OpReport& o : graph.report()) {
    modelled[op_range_name(o.name, false)] = {static_cast<double>(o.forward_flops),
                                              static_cast<double>(o.forward_bytes)};
    modelled[op_range_name(o.name, true)] = {static_cast<double>(o.backward_flops),
                                             static_cast<double>(o.backward_bytes)};
  }
  nlohmann::json ops = nlohmann::json::array();
  for (const counters::RangeValues& r : m.ranges) {
    nlohmann::json op = {{"name", r.name}};
    if (const auto it = modelled.find(r.name); it != modelled.end())
      op["flops"] = it->second.first, op["modelled_bytes"] = it->second.second;
    if (r.values.count("dram__bytes_read.sum") > 0) op["dram_bytes"] = counters::dram_bytes(r.values);
    if (const auto d = r.values.find("gpu__time_duration.sum"); d != r.values.end())
      op["duration_s"] = d->second * 1e-9;
    ops.push_back(std::move(op));
  }
  return ops;
}

}  // namespace

std::string op_range_name(const std::string& op, bool backward) { return op + (backward ? ":backward" : ":forward"); }

OpCounterBytes measure_op_counters(State& state, nn::Graph& graph, const std::function<void()>& ops,
                                   const std::function<void()>& update) {
  if (!state.counters_requested()) return {};
  const auto pass = [&](counters::RangeMarks& marks) {
    {
      OpRanges ranges(graph, marks);
      const Observing observing(graph, ranges);
      ops();
    }
    if (update) {
      marks.begin("update");
      update();
      marks.end();
    }
  };
  const std::optional<counters::Measurement> m = state.measure_counters(pass, 2 * graph.op_count() + 1);
  OpCounterBytes measured;
  if (!m || !m->available) return measured;
  for (const counters::RangeValues& r : m->ranges)
    if (r.values.count("dram__bytes_read.sum") > 0) measured[r.name] += counters::dram_bytes(r.values);
  nlohmann::json block = state.metrics().at("counters");
  block["ops"] = ops_json(graph, *m);
  // The per-op table with the measured bytes (times 0 unless profile=on rewrites it with them).
  if (!measured.empty() && !state.artifact_dir().empty())
    block["files"] = write_op_profile(graph.report(), state.artifact_dir(), &measured)["files"];
  state.add_metric("counters", block);
  return measured;
}

}  // namespace ab::workloads::zoo
