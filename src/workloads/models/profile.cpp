// The per-op table of a profiled step, for roofline placement: each op's time, FLOPs, bytes,
// achieved rates and arithmetic intensity, forward and backward apart.
#include <fstream>
#include <map>

#include "core/error.h"
#include "workloads/models/models.h"

namespace ab::workloads::zoo {
namespace {

nn::OpReport total_of(const std::vector<nn::OpReport>& ops) {
  nn::OpReport t;
  for (const auto& o : ops) {
    t.forward_flops += o.forward_flops;
    t.backward_flops += o.backward_flops;
    t.forward_bytes += o.forward_bytes;
    t.backward_bytes += o.backward_bytes;
    t.forward_s += o.forward_s;
    t.backward_s += o.backward_s;
  }
  return t;
}

// `measured`: the DRAM bytes a counter pass read for this pass of the op, or negative for none.
nlohmann::json pass_json(std::int64_t flops, std::int64_t bytes, double seconds, double measured = -1) {
  nlohmann::json j = {{"time_s", seconds}, {"flops", flops}, {"bytes", bytes}};
  if (measured >= 0) {
    j["measured_dram_bytes"] = measured;
    if (bytes > 0) j["measured_over_modelled"] = measured / static_cast<double>(bytes);
  }
  if (bytes > 0) j["flops_per_byte"] = static_cast<double>(flops) / static_cast<double>(bytes);
  if (seconds > 0) {
    j["tflops"] = static_cast<double>(flops) / seconds / 1e12;
    j["gbps"] = static_cast<double>(bytes) / seconds / 1e9;
  }
  return j;
}

}  // namespace

nlohmann::json write_op_profile(const std::vector<nn::OpReport>& ops, const std::filesystem::path& dir,
                                const OpCounterBytes* measured) {
  const auto measured_of = [measured](const std::string& op, bool backward) {
    if (measured == nullptr) return -1.0;
    const auto it = measured->find(op_range_name(op, backward));
    return it == measured->end() ? -1.0 : it->second;
  };
  const nn::OpReport total = total_of(ops);
  const double total_s = total.forward_s + total.backward_s;
  std::map<std::string, nn::OpReport> by_kind;
  nlohmann::json rows = nlohmann::json::array();
  for (const auto& o : ops) {
    nn::OpReport& k = by_kind[o.kind];
    k.forward_flops += o.forward_flops, k.backward_flops += o.backward_flops;
    k.forward_bytes += o.forward_bytes, k.backward_bytes += o.backward_bytes;
    k.forward_s += o.forward_s, k.backward_s += o.backward_s;
    rows.push_back(
        {{"name", o.name},
         {"kind", o.kind},
         {"out_shape", o.out_shape.to_string()},
         {"params", o.params},
         {"forward", pass_json(o.forward_flops, o.forward_bytes, o.forward_s, measured_of(o.name, false))},
         {"backward", pass_json(o.backward_flops, o.backward_bytes, o.backward_s, measured_of(o.name, true))}});
  }
  nlohmann::json kinds = nlohmann::json::object();
  for (const auto& [kind, k] : by_kind) {
    const double s = k.forward_s + k.backward_s;
    kinds[kind] = pass_json(k.forward_flops + k.backward_flops, k.forward_bytes + k.backward_bytes, s);
    if (total_s > 0) kinds[kind]["time_share"] = s / total_s;
  }
  nlohmann::json summary = {{"ops", ops.size()},
                            {"total", pass_json(total.forward_flops + total.backward_flops,
                                                total.forward_bytes + total.backward_bytes, total_s)},
                            {"by_kind", kinds}};
  if (dir.empty()) return summary;

  std::filesystem::create_directories(dir);
  {
    std::ofstream f(dir / "ops.json");
    f << nlohmann::json{{"total", summary["total"]}, {"by_kind", kinds}, {"ops", rows}}.dump(1) << '\n';
    if (!f) throw Error("cannot write " + (dir / "ops.json").string());
  }
  std::ofstream f(dir / "ops.csv");
  f << "name,kind,out_shape,params,pass,time_s,flops,bytes,flops_per_byte,tflops,gbps"
    << (measured != nullptr ? ",measured_dram_bytes,measured_over_modelled" : "") << '\n';
  for (const auto& r : rows)
    for (const char* pass : {"forward", "backward"}) {
      const auto& p = r[pass];
      if (p["flops"].get<std::int64_t>() == 0 && p["bytes"].get<std::int64_t>() == 0) continue;
      f << r["name"].get<std::string>() << ',' << r["kind"].get<std::string>() << ",\""
        << r["out_shape"].get<std::string>() << "\"," << r["params"] << ',' << pass << ',' << p["time_s"] << ','
        << p["flops"] << ',' << p["bytes"] << ',' << p.value("flops_per_byte", 0.0) << ',' << p.value("tflops", 0.0)
        << ',' << p.value("gbps", 0.0);
      // A pass the counter pass did not see (no kernel of its own) leaves the two cells empty.
      if (measured != nullptr && p.contains("measured_dram_bytes"))
        f << ',' << p["measured_dram_bytes"] << ',' << p.value("measured_over_modelled", 0.0);
      else if (measured != nullptr) f << ",,";
      f << '\n';
    }
  if (!f) throw Error("cannot write " + (dir / "ops.csv").string());
  summary["files"] = {"ops.json", "ops.csv"};
  return summary;
}

}  // namespace ab::workloads::zoo
