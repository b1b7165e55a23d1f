// Reports people act on: runs loaded from the store or run folders become a document (sections,
// tables, Vega-Lite charts) rendered as one offline HTML file or as Markdown; runs compared point
// by point with a verdict per point. Rules: docs/REPORTS.md and docs/METHODOLOGY.md.
#pragma once

#include <cstddef>
#include <filesystem>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include <iosfwd>

#include <nlohmann/json.hpp>

#include "results/record.h"

namespace ab::report {

// ---- Runs ----------------------------------------------------------------------------------

struct Run {
  std::string id;                      // run_id ("" for a folder without run.json)
  std::string label;                   // short name in charts and tables: the system of an import, else the id
  std::string origin;                  // where it came from: "store <db>" or the folder
  nlohmann::json info;                 // run.json (or the runs row): status, times, command line
  nlohmann::json context;              // the run's context block (host, devices, build, measurement)
  std::vector<nlohmann::json> points;  // records in seq order
  std::optional<nlohmann::json> telemetry_trace;  // telemetry.json, when the run folder has one
  std::vector<std::string> notes;      // things the reader should know (skipped lines, unreadable trace)
  // The runs a system name merged (newest first), each with its own command line and context, so
  // the report shows every run's settings where they differ, not only the newest run's.
  struct Part {
    std::string id, started_at, status, command_line;
    nlohmann::json context;
    std::size_t points_kept = 0;
  };
  std::vector<Part> merged;
  bool external = false;               // imported published figures (`accelbench import`)
  std::size_t unreadable_lines = 0;    // lines of points.jsonl that are no record (named in notes)
};

// `what` is a run id (looked up in <out_dir>/runs/accelbench.db), a run folder holding points.jsonl,
// or a points.jsonl file; a name that is neither but is the system of imported runs (or the host of
// measured ones) selects those runs, merged with the newest point per workload and axis values.
// Throws ab::UsageError for an unknown name (listing a few valid ids) and ab::Error naming the file
// and the reason for a corrupt or foreign file.
Run load_run(const std::string& what, const std::filesystem::path& out_dir);
// Validates parsed records by the record type's rules (results::from_json: an object with
// schema_version not newer than ours, workload, a valid status, fields of their types).
// Throws ab::Error "<where>: record N: <reason>".
void check_records(const std::vector<nlohmann::json>& records, const std::string& where);

// ---- The document ----------------------------------------------------------------------------

// One table cell. `badges` are status words (ok, skipped, oom, diverged, invalid, error,
// unconverged, noisy, external) that HTML draws as coloured labels and Markdown as text.
struct Cell {
  std::string text;
  std::vector<std::string> badges;
  std::string title;  // longer explanation (reason), a tooltip in HTML
  bool numeric = false;
};

struct Table {
  std::string caption;
  std::vector<std::string> columns;
  std::vector<std::vector<Cell>> rows;
};

// A Vega-Lite spec with the table of every number it draws.
struct Chart {
  std::string title;
  std::string note;  // what is plotted and how; flagged points and what is not drawn
  nlohmann::json spec;
  Table table;
};

struct Paragraph {
  std::string text;
  bool warning = false;
};

using Block = std::variant<Paragraph, Table, Chart>;

struct Section {
  std::string title;
  int level = 2;  // 2 = top-level section, 3 = sub-section
  std::vector<Block> blocks;
};

struct Document {
  std::string title;
  std::string subtitle;
  std::vector<Section> sections;
  std::size_t chart_count() const;
};

// The report of one or more runs: system context, measured ceilings, points needing attention,
// then per workload the charts that fit its axes, and the telemetry over time.
Document build_report(const std::vector<Run>& runs);

// One self-contained HTML file: CSS, data and the charting scripts inline; nothing is fetched.
// Throws ab::Error saying to run `npm ci` when the build found no charting scripts.
std::string render_html(const Document& doc);
std::string render_markdown(const Document& doc);
std::string render_text(const Document& doc);  // plain aligned tables for terminals
bool html_available(std::string* reason = nullptr);

// ---- The terminal summary --------------------------------------------------------------------

// The end-of-run tables (docs/REPORTS.md): one per workload (per scenario metric for loadgen),
// the axes constant over its points said once above it, the varying ones as columns in the
// workload's declaration order (`axis_order`: workload -> axis names; other axes follow by name),
// rows in numeric order, then the workload's own figures and each point's stop reason. A workload
// whose every point was skipped for one reason is one line.
using AxisOrder = std::map<std::string, std::vector<std::string>>;
void print_summary(std::ostream& out, const std::vector<results::Record>& records, const AxisOrder& axis_order = {});
// Stored records (from the database or points.jsonl); throws ab::Error for one that is not a record.
void print_summary(std::ostream& out, const std::vector<nlohmann::json>& records, const AxisOrder& axis_order = {});

// ---- Escaping (exposed for tests) -------------------------------------------------------------

std::string escape_html(std::string_view s);
// JSON safe inside <script>: '<', '>', '&', U+2028 and U+2029 become \u escapes.
std::string json_for_script(const nlohmann::json& j);

// ---- Comparing runs (docs/METHODOLOGY.md, "Comparing runs") -----------------------------------

enum class Verdict { faster, slower, same, unsure };
std::string_view to_string(Verdict v);

struct CompareRule {
  double alpha = 0.01;          // two-sided significance level of the rank test
  double threshold = 0.02;      // practical threshold on |ratio - 1|
  std::size_t min_samples = 5;  // fewer on either side: unsure
};

struct Comparison {
  Verdict verdict = Verdict::unsure;
  double ratio = 0;                    // B's rate / A's rate (= A's median time / B's); > 1: B is faster
  std::optional<double> p_value;       // Mann-Whitney U, two-sided; absent without two distributions
  double spread = 0;                   // largest relative half-width of the medians' 95% intervals
  std::string why;                     // the clause of the rule that decided
};

// Two-sided p-value of the Mann-Whitney U test, normal approximation with tie and continuity
// corrections. 1 when either side is empty.
double mann_whitney_p(const std::vector<double>& a, const std::vector<double>& b);
// Per-iteration times of A (baseline) and B.
Comparison compare_times(const std::vector<double>& a_s, const std::vector<double>& b_s, const CompareRule& rule = {});
// Rates where a side has no samples (a published figure): that side is exact; `b_spread`/`a_spread`
// are the relative half-widths of the measured side's median interval (0 for an exact figure).
Comparison compare_rates(double a_rate, double a_spread, double b_rate, double b_spread, const CompareRule& rule = {});

// The first run is the baseline; every other run is matched to it by workload and axis values.
// Each pair's section has a chart of B/A per matched point coloured by verdict. `verdicts`, where
// given, receives how many matched points of all pairs got each verdict (for `--fail-on`).
Document build_comparison(const std::vector<Run>& runs, const CompareRule& rule = {},
                          std::map<Verdict, std::size_t>* verdicts = nullptr);

}  // namespace ab::report
