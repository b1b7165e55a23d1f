// accelbench: benchmarks for AI/ML accelerators. Parses the command line and dispatches.
#include <CLI/CLI.hpp>

#include <algorithm>
#include <cstdlib>
#include <iostream>
#include <string>
#include <vector>

#include "cli/commands.h"
#include "cli/data_commands.h"
#include "cli/report_commands.h"
#include "harness/suggest.h"
#include "results/output.h"

namespace {

// An option given as "" would silently mean its default (the best device, the current folder, the
// default timeout): refused instead, so what was typed is what runs.
const CLI::Validator kNotEmpty(
    [](const std::string& value) { return value.empty() ? std::string("must not be empty") : std::string(); }, "", "");

// The output folder when --out is not given: $ACCELBENCH_OUT, else the current folder.
std::string default_out_dir() {
  const char* env = std::getenv("ACCELBENCH_OUT");
  return env != nullptr && *env != '\0' ? env : ".";
}

// CLI11 answers a mistyped subcommand with "A subcommand is required": the word typed and the
// nearest subcommand are more use. Returns true (message printed) when argv[1] is such a word.
bool refuse_unknown_subcommand(const CLI::App& app, int argc, char** argv) {
  if (argc < 2 || argv[1][0] == '-') return false;
  const std::string typed = argv[1];
  std::vector<std::string> names;
  for (const CLI::App* sub : app.get_subcommands([](const CLI::App*) { return true; })) {
    if (sub->get_name() == typed) return false;
    names.push_back(sub->get_name());
  }
  std::string valid;
  for (const auto& n : names) valid += (valid.empty() ? "" : ", ") + n;
  std::cerr << "accelbench: unknown command '" << typed << "'; commands: " << valid << " (accelbench --help)"
            << ab::harness::did_you_mean(typed, names) << '\n';
  return true;
}

// After CLI11's "The following arguments were not expected: --max-nosie": the option of the
// subcommand given that each unknown --name most likely meant.
void suggest_options(const CLI::App& app, int argc, char** argv) {
  const auto given = app.get_subcommands();
  if (given.empty()) return;
  std::vector<std::string> names;
  for (const CLI::Option* o : given.front()->get_options())
    for (const auto& l : o->get_lnames()) names.push_back("--" + l);
  for (int i = 2; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg.rfind("--", 0) != 0 || arg.size() == 2) continue;
    const std::string name = arg.substr(0, arg.find('='));
    if (std::find(names.begin(), names.end(), name) != names.end()) continue;
    if (const auto meant = ab::harness::closest_name(name, names))
      std::cerr << "accelbench " << given.front()->get_name() << ": unknown option '" << name << "'; did you mean '"
                << *meant << "'?\n";
  }
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"accelbench: measures what an accelerator really does on training, inference and kernels"};
  app.require_subcommand(1);
  app.set_version_flag("--version", "accelbench 0.1.0");

  bool sysinfo_json = false;
  auto* sysinfo = app.add_subcommand("sysinfo", "Host, CPU, memory, GPUs with driver/CUDA/cuBLAS/cuDNN/NCCL versions");
  sysinfo->add_flag("--json", sysinfo_json, "print JSON");

  bool list_json = false;
  std::string list_what;
  auto* list = app.add_subcommand("list", "Workloads, their axes, options and defaults; the bundled suites");
  list->add_option("what", list_what, "`suites` (the bundled suites), or one workload's name (its axes and options)");
  list->add_flag("--json", list_json, "print JSON");

  const std::string out_default = default_out_dir();
  const std::string out_help = " (default: $ACCELBENCH_OUT, else the current folder)";
  ab::cli::RunOptions run_opts;
  run_opts.out_dir = out_default;
  auto* run = app.add_subcommand("run", "Run a workload or a suite file, writing records to OUT/runs/<run_id>/");
  run->add_option("target", run_opts.target,
                  "workload name (`accelbench list`), bundled suite name (`accelbench list suites`) or SUITE.yaml")
      ->required();
  run->add_option("--device", run_opts.device, "cpu or cuda:N (default: the best device present)")->check(kNotEmpty);
  run->add_option("--axis", run_opts.axes,
                  "override an axis: name=values, e.g. batch=1:256:pow2, m,n,k=4096, "
                  "m,n,k=@deepbench-train")
      ->allow_extra_args(false);
  run->add_option("--option", run_opts.options,
                  "set a workload's tuning option: name=value, one value (see `accelbench list`), e.g. "
                  "trajectory_steps=5; repeatable")
      ->allow_extra_args(false);
  run->add_option("--min-time", run_opts.min_time_s, "seconds measured per point before it may stop (default 0.5)")
      ->check(kNotEmpty);
  run->add_option("--max-noise", run_opts.max_noise_pct, "target relative spread of the median, percent (default 1)")
      ->check(kNotEmpty);
  run->add_option("--timeout", run_opts.timeout_s, "hard limit per point, seconds, warm-up included (default 60)")
      ->check(kNotEmpty);
  run->add_option("--warmup", run_opts.warmup_s,
                  "seconds of untimed iterations before each point's samples, under half of --timeout (default 0.1; "
                  "tens of seconds bring a GPU to the clocks and temperature of sustained load)")
      ->check(kNotEmpty);
  run->add_option("--mode", run_opts.mode, "GPU timing: batch (back-to-back) or cold (L2 flushed per sample)")
      ->check(CLI::IsMember({"batch", "cold"}));
  run->add_option("--out", run_opts.out_dir,
                  "output folder: records go to OUT/runs/<run_id>/, the store to OUT/runs/accelbench.db" + out_help)
      ->check(kNotEmpty);
  run->add_flag("--telemetry-trace", run_opts.telemetry_trace, "also write the raw telemetry time series");
  run->add_option("--telemetry-period", run_opts.telemetry_period_ms, "telemetry sampling period, ms (default 20)")
      ->check(kNotEmpty);
  run->add_flag("--no-gpu-telemetry", run_opts.no_gpu_telemetry,
                "read no GPU counters through NVML (no power, energy or clocks in the records; host telemetry stays)");
  run->add_option("--counters", run_opts.counters,
                  "hardware counters (CUPTI) in a pass of their own after each point's timed samples: memory "
                  "(DRAM and L2 bytes, duration), compute (SM and tensor-pipe throughput, occupancy, instructions) "
                  "or all; off by default")
      ->check(CLI::IsMember({"off", "memory", "compute", "all"}));
  run->add_flag("--quiet,-q", run_opts.quiet, "no progress lines");

  std::string results_out = out_default, results_run, results_file, results_fields;
  bool results_csv = false, results_json = false;
  auto* results = app.add_subcommand("results", "Runs in the store; a run's points; CSV export; chosen record fields");
  results->add_option("run_id", results_run,
                      "a run to show: its id, a unique prefix of it, or `latest` (default: list the runs)");
  results->add_option("--out", results_out, "the folder given to `run --out`" + out_help)->check(kNotEmpty);
  results->add_flag("--csv", results_csv, "export the points as CSV (the newest run unless run_id is given)");
  results->add_option("-o,--output", results_file, "write to this file instead of standard output");
  results
      ->add_option("--fields", results_fields,
                   "a table of these record fields, one row per point (the newest run unless run_id is given): "
                   "dotted paths, comma-separated, e.g. params.batch,telemetry.gpus.0.mean_sm_clock_mhz")
      ->check(kNotEmpty);
  results->add_flag("--json", results_json, "the run list, or a run and its records, as one JSON document")
      ->excludes("--csv")
      ->excludes("--fields");

  double monitor_interval_ms = 1000, monitor_duration_s = 0;
  auto* monitor =
      app.add_subcommand("monitor", "Print live power, clocks, utilisation and host CPU, like nvidia-smi dmon");
  monitor->add_option("--interval", monitor_interval_ms, "milliseconds between lines (default 1000)")->check(kNotEmpty);
  monitor->add_option("--duration", monitor_duration_s, "seconds to run (default: until Ctrl-C)")->check(kNotEmpty);

  ab::cli::ReportOptions report_opts;
  report_opts.out_dir = out_default;
  auto* report = app.add_subcommand("report", "One offline HTML file (or Markdown) with charts and tables of runs");
  report->add_option("runs", report_opts.runs,
                     "run ids (or a unique prefix, or `latest`), run folders, points.jsonl files or system names "
                     "(default: the newest run)");
  report->add_option("-o,--output", report_opts.output,
                     "file to write (default: report.html; Markdown goes to standard output)");
  report->add_option("--format", report_opts.format, "html (default) or md")->check(CLI::IsMember({"html", "md"}));
  report
      ->add_option("--out", report_opts.out_dir,
                   "the folder given to `run --out`, where run ids are looked up" + out_help)
      ->check(kNotEmpty);

  ab::cli::CompareOptions compare_opts;
  compare_opts.out_dir = out_default;
  auto* compare = app.add_subcommand("compare", "Runs or systems side by side: ratio and verdict per matched point");
  compare
      ->add_option("runs", compare_opts.runs,
                   "two or more runs (ids or unique prefixes, `latest`, folders or system names); the first is the "
                   "baseline")
      ->required()
      ->expected(2, -1);
  compare->add_option("--format", compare_opts.format, "text (default), md or html")
      ->check(CLI::IsMember({"text", "md", "html"}));
  compare->add_option("-o,--output", compare_opts.output, "write to this file instead of standard output");
  compare
      ->add_option(
          "--fail-on", compare_opts.fail_on,
          "exit 3 when any matched point gets one of these verdicts (slower, unsure; comma-separated): a CI gate")
      ->delimiter(',')
      ->check(CLI::IsMember({"slower", "unsure", "faster", "same"}));
  compare
      ->add_option("--out", compare_opts.out_dir,
                   "the folder given to `run --out`, where run ids are looked up" + out_help)
      ->check(kNotEmpty);

  std::string import_file, import_system, import_out = out_default;
  auto* import =
      app.add_subcommand("import", "Bring published figures (CSV) into the store, marked external with their source");
  import->add_option("file", import_file, "CSV with header workload,params,metric,value,unit,source (docs/RESULTS.md)")
      ->required();
  import->add_option("--system", import_system, "name of the system the figures are for, e.g. IPU-M2000")
      ->required()
      ->check(kNotEmpty);
  import->add_option("--out", import_out, "the store's folder, as given to `run --out`" + out_help)->check(kNotEmpty);

  std::string inspect_file;
  auto* inspect = app.add_subcommand(
      "inspect",
      "What an ONNX model holds and how it maps onto the engine: op histogram, parameters, FLOPs per "
      "sample, fused chains, every unsupported op");
  inspect->add_option("file", inspect_file, "MODEL.onnx")->required()->check(kNotEmpty);

  ab::cli::MakeImageFolderOptions data_opts;
  auto* data = ab::cli::add_data_command(app, data_opts);

  if (refuse_unknown_subcommand(app, argc, argv)) return 2;
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    const int rc = app.exit(e);
    if (dynamic_cast<const CLI::ExtrasError*>(&e) != nullptr) suggest_options(app, argc, argv);
    return rc == 0 ? 0 : 2;
  }
  run_opts.command_line = ab::results::shell_quoted_command(std::vector<std::string>(argv, argv + argc));

  const int rc = [&] {
    if (*sysinfo) return ab::cli::sysinfo(sysinfo_json);
    if (*list) return ab::cli::list(list_json, list_what);
    if (*run) return ab::cli::run(run_opts);
    if (*results)
      return ab::cli::results(results_out, results_run, results_csv, results_file, results_fields, results_json);
    if (*monitor) return ab::cli::monitor(monitor_interval_ms, monitor_duration_s);
    if (*report) return ab::cli::report(report_opts);
    if (*compare) return ab::cli::compare(compare_opts);
    if (*import) return ab::cli::import_results(import_file, import_system, import_out, run_opts.command_line);
    if (*data) return ab::cli::make_imagefolder(data_opts);
    if (*inspect) return ab::cli::inspect(inspect_file);
    return 2;
  }();
  // Output that never arrived (a full device, a closed pipe) is a failure, whatever the command did.
  std::cout.flush();
  if (!std::cout) {
    std::cerr << "accelbench: cannot write to standard output\n";
    return rc != 0 ? rc : 1;
  }
  return rc;
}
