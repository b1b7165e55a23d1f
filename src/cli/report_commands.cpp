#include "cli/report_commands.h"

#include <filesystem>
#include <iostream>

#include "core/error.h"
#include "report/report.h"
#include "results/output.h"
#include "results/results.h"

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
    const auto doc = report::build_comparison(runs);
    const std::string text = o.format == "md"     ? report::render_markdown(doc)
                             : o.format == "html" ? report::render_html(doc)
                                                  : report::render_text(doc);
    write_result(o.output, o.out_dir, text);
    return 0;
  });
}

int import_results(const std::string& csv, const std::string& system, const std::string& out_dir,
                   const std::string& command_line) {
  return guarded("import", [&] {
    const auto r = results::import_csv(csv, system, out_dir, command_line);
    std::cout << "imported " << r.rows << " row(s) of " << csv << " as " << r.points << " external point(s) of system "
              << system << ": run " << r.run_id << " in " << (fs::path(out_dir) / "runs" / r.run_id).string() << '\n';
    return 0;
  });
}

}  // namespace ab::cli
