// Runs side by side: points matched by workload and axis values, a ratio and a verdict per point
// from the two sample distributions (docs/METHODOLOGY.md, "Comparing runs").
#include <algorithm>
#include <cmath>
#include <map>

#include "measure/stats.h"
#include "report/model.h"
#include "report/report.h"

namespace ab::report {
using nlohmann::json;
using namespace detail;

std::string_view to_string(Verdict v) {
  switch (v) {
    case Verdict::faster: return "faster";
    case Verdict::slower: return "slower";
    case Verdict::same: return "same";
    case Verdict::unsure: return "unsure";
  }
  return "unsure";
}

double mann_whitney_p(const std::vector<double>& a, const std::vector<double>& b) {
  const std::size_t n1 = a.size(), n2 = b.size(), n = n1 + n2;
  if (n1 == 0 || n2 == 0) return 1;
  std::vector<std::pair<double, int>> all;
  all.reserve(n);
  for (double x : a) all.emplace_back(x, 0);
  for (double x : b) all.emplace_back(x, 1);
  std::sort(all.begin(), all.end());
  double r1 = 0, ties = 0;
  for (std::size_t i = 0; i < n;) {
    std::size_t j = i;
    while (j < n && all[j].first == all[i].first) ++j;
    const double rank = (static_cast<double>(i + 1) + static_cast<double>(j)) / 2;  // mean of ranks i+1..j
    const double t = static_cast<double>(j - i);
    ties += t * t * t - t;
    for (std::size_t k = i; k < j; ++k)
      if (all[k].second == 0) r1 += rank;
    i = j;
  }
  const double dn1 = static_cast<double>(n1), dn2 = static_cast<double>(n2), dn = static_cast<double>(n);
  const double u1 = r1 - dn1 * (dn1 + 1) / 2;
  const double var = dn1 * dn2 / 12 * ((dn + 1) - ties / (dn * (dn - 1)));
  if (var <= 0) return 1;  // every value tied
  const double z = std::max(0.0, std::fabs(u1 - dn1 * dn2 / 2) - 0.5) / std::sqrt(var);
  return std::min(1.0, std::erfc(z / std::sqrt(2.0)));
}

namespace {

std::string pct(double fraction) { return fmt(fraction * 100, 3) + "%"; }

Verdict direction(double ratio) { return ratio > 1 ? Verdict::faster : Verdict::slower; }

}  // namespace

Comparison compare_times(const std::vector<double>& a_s, const std::vector<double>& b_s, const CompareRule& rule) {
  Comparison c;
  const auto sa = measure::summarize(a_s), sb = measure::summarize(b_s);
  if (sb.median > 0) c.ratio = sa.median / sb.median;
  if (a_s.size() < rule.min_samples || b_s.size() < rule.min_samples) {
    c.why = "too few samples (A " + std::to_string(a_s.size()) + ", B " + std::to_string(b_s.size()) + "; the rule needs " +
            std::to_string(rule.min_samples) + " each)";
    return c;
  }
  c.p_value = mann_whitney_p(a_s, b_s);
  c.spread = std::max(sa.rel_spread, sb.rel_spread);
  const double d = c.ratio - 1;
  const std::string p = "p = " + fmt(*c.p_value, 2);
  if (*c.p_value < rule.alpha && std::fabs(d) >= rule.threshold) {
    c.verdict = direction(c.ratio);
    c.why = "the rank test separates the samples (" + p + " < " + fmt(rule.alpha) + ") and the medians differ by " + pct(std::fabs(d));
  } else if (std::fabs(d) < rule.threshold && c.spread <= rule.threshold) {
    c.verdict = Verdict::same;
    c.why = "medians within ±" + pct(rule.threshold) + " and each known to ±" + pct(c.spread) +
            (*c.p_value < rule.alpha ? " (the rank test separates them, " + p + ", but by less than the threshold)" : " (" + p + ")");
  } else if (std::fabs(d) >= rule.threshold) {
    c.why = "a " + pct(std::fabs(d)) + " difference that the rank test cannot confirm (" + p + "): too noisy";
  } else {
    c.why = "medians within ±" + pct(rule.threshold) + " but one is only known to ±" + pct(c.spread) + ": too noisy to call them the same";
  }
  return c;
}

Comparison compare_rates(double a_rate, double a_spread, double b_rate, double b_spread, const CompareRule& rule) {
  Comparison c;
  if (!(a_rate > 0) || !(b_rate > 0)) {
    c.why = "a rate is missing or not positive";
    return c;
  }
  c.ratio = b_rate / a_rate;
  c.spread = std::max(a_spread, b_spread);
  const double d = c.ratio - 1;
  if (a_spread == 0 && b_spread == 0) {
    c.verdict = std::fabs(d) < rule.threshold ? Verdict::same : direction(c.ratio);
    c.why = "both are single figures with no spread known; decided by the ±" + pct(rule.threshold) + " threshold alone";
    return c;
  }
  const bool apart = a_rate * (1 + a_spread) < b_rate * (1 - b_spread) || b_rate * (1 + b_spread) < a_rate * (1 - a_spread);
  if (apart && std::fabs(d) >= rule.threshold) {
    c.verdict = direction(c.ratio);
    c.why = "the figures' 95% intervals do not overlap and differ by " + pct(std::fabs(d));
  } else if (std::fabs(d) < rule.threshold && c.spread <= rule.threshold) {
    c.verdict = Verdict::same;
    c.why = "within ±" + pct(rule.threshold) + ", the measured median known to ±" + pct(c.spread);
  } else {
    c.why = "the 95% interval (±" + pct(c.spread) + ") leaves the difference of " + pct(std::fabs(d)) + " undecided";
  }
  return c;
}

namespace {

struct Side {
  const json* rec = nullptr;
  const Point* point = nullptr;
};

std::vector<double> samples_of(const results::Record& rec) {
  std::vector<double> out;
  if (!rec.time || !rec.time->samples_s) return out;
  for (const double v : *rec.time->samples_s)
    if (std::isfinite(v)) out.push_back(v);
  return out;
}

// The figures a published point may be compared by, first match wins (time inverted).
struct Figure {
  const char* unit;  // "" for the median time
  std::optional<double> (*of)(const results::Record&);
};
constexpr Figure kFigures[] = {
    {"samples/s", [](const results::Record& r) { return r.rate_of(&results::Rates::samples_per_s); }},
    {"tokens/s", [](const results::Record& r) { return r.rate_of(&results::Rates::tokens_per_s); }},
    {"TFLOP/s", [](const results::Record& r) { return r.rate_of(&results::Rates::tflops); }},
    {"GB/s", [](const results::Record& r) { return r.rate_of(&results::Rates::gbps); }},
    {"samples/J", [](const results::Record& r) { return r.telemetry_number("samples_per_j"); }},
    {"", [](const results::Record& r) { return r.time_of(&results::TimeStats::median_s); }}};

struct Outcome {
  Comparison c;
  std::string a_text, b_text;
  bool decided = false;  // both points measured: counts towards the summary
};

Outcome compare_points(const Point& a, const Point& b, const CompareRule& rule) {
  Outcome o;
  if (!a.measured() || !b.measured()) {
    o.c.why = std::string(!a.measured() ? "A is " + a.status + (a.reason.empty() ? "" : " (" + a.reason + ")") : "") +
              (!a.measured() && !b.measured() ? "; " : "") +
              (!b.measured() ? "B is " + b.status + (b.reason.empty() ? "" : " (" + b.reason + ")") : "");
    o.a_text = a.measured() ? "" : a.status;
    o.b_text = b.measured() ? "" : b.status;
    return o;
  }
  const auto sa = samples_of(a.typed()), sb = samples_of(b.typed());
  if (!sa.empty() && !sb.empty()) {
    o.c = compare_times(sa, sb, rule);
    o.a_text = fmt_time(measure::summarize(sa).median);
    o.b_text = fmt_time(measure::summarize(sb).median);
    o.decided = true;
    return o;
  }
  // A published figure on either side: compare the first rate both have (time inverted).
  for (const auto& [unit, of] : kFigures) {
    const auto va = of(a.typed()), vb = of(b.typed());
    if (!va || !vb || *va <= 0 || *vb <= 0) continue;
    const bool time = *unit == '\0';
    auto spread = [](const Point& p) -> std::optional<double> {
      if (p.external) return 0.0;
      return p.typed().time_of(&results::TimeStats::rel_spread);
    };
    const auto spa = spread(a), spb = spread(b);
    o.a_text = time ? fmt_time(*va) : fmt(*va) + " " + unit;
    o.b_text = time ? fmt_time(*vb) : fmt(*vb) + " " + unit;
    o.decided = true;
    if (!spa || !spb) {
      o.c.ratio = time ? *va / *vb : *vb / *va;
      o.c.why = "no spread known for the measured figure";
      return o;
    }
    o.c = time ? compare_rates(1 / *va, *spa, 1 / *vb, *spb, rule) : compare_rates(*va, *spa, *vb, *spb, rule);
    return o;
  }
  o.c.why = "no time samples or rate that both points have";
  return o;
}

std::string label_of(const Point& p) {
  std::vector<std::string> keys;
  for (const auto& [k, v] : p.params().items()) keys.push_back(k);
  return params_label(p.params(), keys);
}

// Key -> the point to compare: the last ok one, else the last one.
std::map<std::string, const Point*> index_points(const std::vector<Point>& pts, std::vector<std::string>* order) {
  std::map<std::string, const Point*> idx;
  for (const auto& p : pts) {
    const std::string k = point_key(*p.rec);
    auto it = idx.find(k);
    if (it == idx.end()) {
      idx[k] = &p;
      if (order) order->push_back(k);
    } else if (p.measured() || !it->second->measured()) {
      it->second = &p;
    }
  }
  return idx;
}

// B/A per matched point as a bar from 1, coloured by verdict, log scale, the threshold band shaded.
json ratio_spec(const json& bars, const CompareRule& rule) {
  json spec = base_spec("B/A per matched point");
  spec["height"] = 18 * static_cast<int>(bars.size());  // not a step height: see per_point_chart
  const json y = {
      {"field", "point"}, {"type", "nominal"}, {"title", nullptr}, {"sort", nullptr}, {"axis", {{"labelLimit", 360}}}};
  const json x = {{"field", "ratio"},
                  {"type", "quantitative"},
                  {"title", "B/A (above 1: B is faster)"},
                  {"scale", {{"type", "log"}}}};
  const json color = {
      {"field", "verdict"},
      {"type", "nominal"},
      {"title", "verdict"},
      {"scale",
       {{"domain", {"faster", "slower", "same", "unsure"}}, {"range", {"#137333", "#c5221f", "#80868b", "#e0a800"}}}}};
  spec["layer"] =
      json::array({{{"data", {{"values", json::array({{{"lo", 1 - rule.threshold}, {"hi", 1 + rule.threshold}}})}}},
                    {"mark", {{"type", "rect"}, {"color", "#e8eaed"}, {"opacity", 0.7}}},
                    {"encoding",
                     {{"x", {{"field", "lo"}, {"type", "quantitative"}, {"title", x["title"]}, {"scale", x["scale"]}}},
                      {"x2", {{"field", "hi"}}}}}},
                   {{"data", {{"values", bars}}},
                    {"mark", {{"type", "bar"}, {"height", {{"band", 0.7}}}}},
                    {"encoding",
                     {{"y", y},
                      {"x", x},
                      {"x2", {{"datum", 1}}},
                      {"color", color},
                      {"tooltip", json::array({{{"field", "point"}},
                                               {{"field", "ratio"}, {"title", "B/A"}, {"format", ".4~g"}},
                                               {{"field", "verdict"}},
                                               {{"field", "why"}}})}}}},
                   {{"data", {{"values", json::array({json::object()})}}},
                    {"mark", {{"type", "rule"}, {"color", "#5f6368"}}},
                    {"encoding", {{"x", {{"datum", 1}, {"type", "quantitative"}}}}}}});
  return spec;
}

Section pair_section(const Run& ra, const std::vector<Point>& pa, const Run& rb, const std::vector<Point>& pb,
                     const CompareRule& rule, std::map<Verdict, std::size_t>* verdicts) {
  Section s{rb.label + " (B) vs " + ra.label + " (A)", 2, {}};
  std::vector<std::string> order_a, order_b;
  const auto ia = index_points(pa, &order_a);
  const auto ib = index_points(pb, &order_b);
  Table t;
  t.caption = "matched points: ratio = B's rate / A's rate (A's median time / B's); above 1, B is faster";
  t.columns = {"workload", "point", "A", "B", "B/A", "verdict", "p", "±95% CI", "why"};
  std::map<Verdict, int> counts;
  double log_sum = 0;
  int logs = 0;
  json bars = json::array();
  for (const auto& k : order_a) {
    const auto jt = ib.find(k);
    if (jt == ib.end()) continue;
    const Point& a = *ia.at(k);
    const Point& b = *jt->second;
    const Outcome o = compare_points(a, b, rule);
    if (o.decided) {
      ++counts[o.c.verdict];
      if (verdicts) ++(*verdicts)[o.c.verdict];
      if (o.c.ratio > 0) log_sum += std::log(o.c.ratio), ++logs;
    }
    if (o.c.ratio > 0 && std::isfinite(o.c.ratio))
      bars.push_back({{"point", a.workload() + " " + label_of(a)},
                      {"ratio", o.c.ratio},
                      {"verdict", std::string(to_string(o.c.verdict))},
                      {"why", o.c.why}});
    Cell ac = text_cell(o.a_text), bc = text_cell(o.b_text);
    ac.numeric = bc.numeric = true;
    if (a.flagged()) ac.badges = a.badges(), ac.title = a.explanation();
    if (b.flagged()) bc.badges = b.badges(), bc.title = b.explanation();
    Cell verdict{"", {std::string(to_string(o.c.verdict))}, o.c.why, false};
    t.rows.push_back({text_cell(a.workload()), text_cell(label_of(a)), ac, bc, num_cell(o.c.ratio > 0 ? std::optional<double>(o.c.ratio) : std::nullopt, 4),
                      verdict, num_cell(o.c.p_value, 2), num_cell(o.decided && o.c.spread > 0 ? std::optional<double>(o.c.spread * 100) : std::nullopt, 3),
                      text_cell(o.c.why)});
    t.rows.back()[7].text += t.rows.back()[7].text == "—" ? "" : "%";
  }
  std::string summary = std::to_string(t.rows.size()) + " matched point(s): " + std::to_string(counts[Verdict::faster]) +
                        " faster, " + std::to_string(counts[Verdict::slower]) + " slower, " + std::to_string(counts[Verdict::same]) +
                        " same, " + std::to_string(counts[Verdict::unsure]) + " unsure (B against A).";
  if (logs) summary += " Geometric mean of B/A over the measured pairs: " + fmt(std::exp(log_sum / logs), 4) + ".";
  s.blocks.push_back(Paragraph{summary, false});
  if (!bars.empty()) {
    Chart c;
    c.title = "B/A per matched point";
    c.note =
        "One bar per matched point from 1 to its ratio, on a log scale, coloured by its verdict; the grey band is the "
        "±" +
        fmt(rule.threshold * 100) + "% threshold within which a difference is too small to call.";
    c.spec = ratio_spec(bars, rule);
    c.table = std::move(t);
    s.blocks.push_back(std::move(c));
  } else if (!t.rows.empty()) {
    s.blocks.push_back(std::move(t));
  }

  Table only;
  only.caption = "points without a partner (not compared)";
  only.columns = {"only in", "workload", "point", "status"};
  for (const auto& k : order_a)
    if (!ib.count(k)) only.rows.push_back({text_cell("A"), text_cell(ia.at(k)->workload()), text_cell(label_of(*ia.at(k))), status_cell(*ia.at(k))});
  for (const auto& k : order_b)
    if (!ia.count(k)) only.rows.push_back({text_cell("B"), text_cell(ib.at(k)->workload()), text_cell(label_of(*ib.at(k))), status_cell(*ib.at(k))});
  if (!only.rows.empty()) s.blocks.push_back(std::move(only));
  return s;
}

}  // namespace

Document build_comparison(const std::vector<Run>& runs, const CompareRule& rule,
                          std::map<Verdict, std::size_t>* verdicts) {
  Document doc;
  doc.title = "accelbench compare";
  std::string names;
  for (std::size_t i = 0; i < runs.size(); ++i)
    names += (i ? ", " : "") + runs[i].label + (i == 0 ? " (A, baseline)" : "");
  doc.subtitle = names;
  Section how{"Rule", 2, {}};
  how.blocks.push_back(Paragraph{
      "Points are matched by workload and axis values. Verdict (docs/METHODOLOGY.md, Comparing runs): fewer than " +
          std::to_string(rule.min_samples) + " samples on a side is unsure; faster/slower when a two-sided Mann-Whitney U test "
          "separates the per-iteration times at p < " + fmt(rule.alpha) + " and the medians differ by at least " +
          fmt(rule.threshold * 100) + "%; same when they differ by less than " + fmt(rule.threshold * 100) +
          "% and both medians are known to that precision (95% interval); unsure otherwise. A published figure has no "
          "samples and is taken as exact.",
      false});
  doc.sections.push_back(std::move(how));
  std::vector<std::vector<Point>> pts;
  for (const auto& r : runs) pts.push_back(make_points(r));
  for (std::size_t i = 1; i < runs.size(); ++i)
    doc.sections.push_back(pair_section(runs[0], pts[0], runs[i], pts[i], rule, verdicts));
  return doc;
}

}  // namespace ab::report
