// The subcommands that read results back: report, compare, import. Exit codes as in commands.h:
// 0 ok, 1 failure (a corrupt file, a missing charting library), 2 usage error (unknown run,
// malformed CSV, unwritable output); compare: 3 when a matched point got a verdict of --fail-on.
#pragma once

#include <string>
#include <vector>

namespace ab::cli {

struct ReportOptions {
  std::vector<std::string> runs;  // run ids, run folders, points.jsonl files or system names; empty = newest run
  std::string out_dir = ".";      // the folder given to `run --out`
  std::string output;             // file to write; "" = report.html for HTML, standard output for Markdown
  std::string format = "html";    // html | md
};
int report(const ReportOptions& options);

struct CompareOptions {
  std::vector<std::string> runs;  // two or more; the first is the baseline
  std::string out_dir = ".";
  std::string output;           // "" = standard output
  std::string format = "text";  // text | md | html
  std::vector<std::string> fail_on;  // verdicts (slower, unsure) that make compare exit 3: a regression gate for CI
};
int compare(const CompareOptions& options);

int import_results(const std::string& csv, const std::string& system, const std::string& out_dir,
                   const std::string& command_line);

}  // namespace ab::cli
