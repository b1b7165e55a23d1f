#include "cli/report_commands.h"

#include <filesystem>
#include <iostream>
#include <map>
#include <set>

#include "core/error.h"
#include "harness/workload.h"
#include "report/report.h"
#include "results/output.h"
#include "results/results.h"
#include "workloads/registry.h"

namespace ab::cli {
namespace fs = std::filesystem;

namespace {

std::vector<report::Run> load_runs(std::vector<std::string> names, const std::string& out_dir) {
  if (names.empty()) {
    const fs::path db = fs::path(out_dir) / "runs" / "accelbench.db";
    if (!fs::exists(db)) throw UsageError("no run given and no results store at " + db.string() + " (pass a run or --out)");
    const auto rows = results::list_runs(db);
    if (rows.empty()) throw UsageError(db.string() + " holds no runs");
    names.push_back(rows.front().run_id);
  }
  // A run id may be typed short (a unique prefix) or as `latest`; a folder or file of that name wins.
  const fs::path db = fs::path(out_dir) / "runs" / "accelbench.db";
  const auto rows = fs::exists(db) ? results::list_runs(db) : std::vector<results::RunRow>{};
  std::vector<report::Run> runs;
  for (auto n : names) {
    if (!fs::exists(n) || n == "latest") n = results::resolve_run_id(rows, n).value_or(n);
    runs.push_back(report::load_run(n, out_dir));
  }
  return runs;
}

// Standard output for "" or "-", else a file written whole or not at all, never one of the store's.
void write_result(const std::string& path, const std::string& out_dir, const std::string& text) {
  if (path.empty() || path == "-") results::write_stdout(text);
  else results::write_output_file(path, out_dir, text);
}

void check_output(const std::string& path, const std::string& out_dir) {
  if (!path.empty() && path != "-") results::check_output_path(path, out_dir);
}

template <class F>
int guarded(const char* name, F&& body) {
  try {
    return body();
  } catch (const UsageError& e) {
    std::cerr << "accelbench " << name << ": " << e.what() << '\n';
    return 2;
  } catch (const std::exception& e) {
    std::cerr << "accelbench " << name << ": " << e.what() << '\n';
    return 1;
  }
}

// The axes a workload sweeps one value of by default (on an accelerator), typed as the runner
// records them: what an imported figure that names only some axes is measured at.
nlohmann::json registry_defaults(const std::string& workload) {
  nlohmann::json d = nlohmann::json::object();
  for (const auto& w : workloads::registry().all()) {
    if (w->name() != workload) continue;
    std::set<std::string> zipped;  // their values come in rows of a table: no single default
    for (const auto& g : w->zip_groups()) zipped.insert(g.names.begin(), g.names.end());
    for (const auto& a : w->axes("cuda")) {
      if (zipped.count(a.name)) continue;
      // A default written as a range ("1:256:pow2") is a sweep, not one value.
      const auto values =
          a.defaults.size() == 1 ? harness::expand_values(a.defaults.front(), a.kind) : std::vector<std::string>{};
      if (values.size() != 1) continue;
      if (a.kind == harness::AxisKind::integer) d[a.name] = std::stoll(values.front());
      else if (a.kind == harness::AxisKind::real) d[a.name] = std::stod(values.front());
      else d[a.name] = values.front();
    }
  }
  return d;
}

}  // namespace

int report(const ReportOptions& o) {
  return guarded("report", [&] {
    if (o.format == "html") {
      std::string why;
      if (!report::html_available(&why)) throw Error("cannot write an HTML report: " + why + " (`--format md` needs no scripts)");
    }
    const std::string path = !o.output.empty() ? o.output : o.format == "html" ? "report.html" : "";
    check_output(path, o.out_dir);  // before the work, so a refused path costs nothing
    const auto runs = load_runs(o.runs, o.out_dir);
    const auto doc = report::build_report(runs);
    const std::string text = o.format == "html" ? report::render_html(doc) : report::render_markdown(doc);
    write_result(path, o.out_dir, text);
    if (path.empty() || path == "-") return 0;
    std::cerr << "accelbench report: " << runs.size() << (runs.size() == 1 ? " run, " : " runs, ") << doc.chart_count()
              << " charts -> " << path << '\n';
    return 0;
  });
}

int compare(const CompareOptions& o) {
  return guarded("compare", [&] {
    if (o.runs.size() < 2) throw UsageError("compare needs two or more runs (the first is the baseline)");
    if (o.format == "html") {
      std::string why;
      if (!report::html_available(&why)) throw Error("cannot write HTML: " + why);
    }
    check_output(o.output, o.out_dir);
    const auto runs = load_runs(o.runs, o.out_dir);
    std::map<report::Verdict, std::size_t> verdicts;
    const auto doc = report::build_comparison(runs, {}, &verdicts);
    const std::string text = o.format == "md"     ? report::render_markdown(doc)
                             : o.format == "html" ? report::render_html(doc)
                                                  : report::render_text(doc);
    write_result(o.output, o.out_dir, text);
    std::string failed;
    for (const auto& word : o.fail_on)
      for (const auto& [v, n] : verdicts)
        if (report::to_string(v) == word && n > 0)
          failed += (failed.empty() ? "" : ", ") + std::to_string(n) + " " + word;
    if (failed.empty()) return 0;
    std::cerr << "accelbench compare: " << failed << " matched point(s) against the baseline (--fail-on)\n";
    return 3;
  });
}

int import_results(const std::string& csv, const std::string& system, const std::string& out_dir,
                   const std::string& command_line) {
  return guarded("import", [&] {
    const auto r = results::import_csv(csv, system, out_dir, command_line, registry_defaults);
    std::cout << "imported " << r.rows << " row(s) of " << csv << " as " << r.points << " external point(s) of system "
              << system << ": run " << r.run_id << " in " << (fs::path(out_dir) / "runs" / r.run_id).string() << '\n';
    return 0;
  });
}

}  // namespace ab::cli
