// One self-contained HTML page: styles, data, the charting scripts and the code that draws the
// charts are all inline, and a Content-Security-Policy forbids every fetch. Every string that came
// from a record is escaped here and nowhere else is HTML written.
#include <algorithm>
#include <cctype>
#include <set>
#include <sstream>

#include "core/error.h"
#include "report/assets.h"
#include "report/report.h"

namespace ab::report {
using nlohmann::json;

namespace {

constexpr std::size_t kOpenRows = 30;  // longer tables start folded

const char* kCss = R"css(
:root{--ink:#202124;--muted:#5f6368;--line:#dadce0;--bg:#f6f7f9;--card:#fff;--accent:#1a56db}
*{box-sizing:border-box}
body{margin:0;background:var(--bg);color:var(--ink);font:14px/1.5 system-ui,-apple-system,"Segoe UI",Roboto,Helvetica,Arial,sans-serif}
header.top{background:#111827;color:#fff;padding:22px 32px}
header.top h1{margin:0;font-size:22px;font-weight:600;letter-spacing:.2px}
header.top p{margin:4px 0 0;color:#cbd5e1;font-size:13px}
nav.toc{background:#fff;border-bottom:1px solid var(--line);padding:10px 32px;font-size:13px;position:sticky;top:0;z-index:5}
nav.toc a{color:var(--accent);text-decoration:none;margin-right:18px;white-space:nowrap}
nav.toc a:hover{text-decoration:underline}
main{max-width:1280px;margin:0 auto;padding:20px 32px 40px}
section.card{background:var(--card);border:1px solid var(--line);border-radius:10px;padding:18px 22px;margin:18px 0;box-shadow:0 1px 2px rgba(0,0,0,.04)}
section.card h2{margin:0 0 10px;font-size:18px;font-weight:600;border-bottom:2px solid #e8eaed;padding-bottom:8px}
figure.chart{margin:22px 0 8px;padding:0}
figure.chart h3{margin:0 0 6px;font-size:15px;font-weight:600}
.vis{width:100%;min-height:120px}
.vis.failed{color:#b91c1c;font-weight:600;padding:12px;border:1px dashed #b91c1c;border-radius:6px}
figcaption,.note{color:var(--muted);font-size:12.5px;margin:6px 0 10px}
p.warning{background:#fff7e6;border-left:4px solid #f59e0b;padding:8px 12px;border-radius:4px}
.table-wrap{overflow-x:auto;margin:8px 0 4px}
table{border-collapse:collapse;width:100%;font-size:12.5px;font-variant-numeric:tabular-nums}
caption{caption-side:top;text-align:left;color:var(--muted);font-size:12px;padding:2px 0 6px;font-style:italic}
th{background:#f1f3f4;text-align:left;font-weight:600;padding:6px 8px;border-bottom:1px solid var(--line);white-space:nowrap;position:sticky;top:0}
td{padding:5px 8px;border-bottom:1px solid #eef0f2;vertical-align:top}
tbody tr:nth-child(even){background:#fafbfc}
tbody tr:hover{background:#eef4ff}
td.num{text-align:right;white-space:nowrap}
td.pre{white-space:pre-line}
details>summary{cursor:pointer;color:var(--accent);font-size:12.5px;margin:6px 0}
.badge{display:inline-block;padding:0 7px;margin:0 4px 1px 0;border-radius:9px;font-size:11px;font-weight:600;line-height:18px;white-space:nowrap;border:1px solid transparent}
.b-ok{background:#e6f4ea;color:#137333}.b-skipped{background:#f1f3f4;color:#5f6368;border-color:#dadce0}
.b-oom{background:#fde7d9;color:#b3470c}.b-diverged{background:#f3e8fd;color:#7627bb}
.b-invalid,.b-error{background:#fce8e6;color:#c5221f}.b-unconverged{background:#fef3c7;color:#92400e}
.b-noisy{background:#fff8c5;color:#7a5d00}.b-external{background:#e8f0fe;color:#1a56db}
.b-faster{background:#e6f4ea;color:#137333}.b-slower{background:#fce8e6;color:#c5221f}
.b-same{background:#f1f3f4;color:#3c4043}.b-unsure{background:#fef3c7;color:#92400e}
.b-other{background:#f1f3f4;color:#3c4043}
.cell-note{color:var(--muted);font-size:12px}
footer{max-width:1280px;margin:0 auto;padding:0 32px 40px;color:var(--muted);font-size:12px}
#ab-status{margin-top:6px}
@media print{nav.toc{display:none}section.card{break-inside:avoid-page;box-shadow:none}details{display:block}}
)css";

// Runs before the charting scripts: every error, failed load, warning and alert is counted, so the
// page itself can say whether it drew cleanly (the end-to-end test reads #ab-status).
const char* kCaptureJs = R"js((function(){
var s=window.__ab={errors:[],warnings:[]};
window.addEventListener('error',function(e){s.errors.push(e&&e.message?String(e.message):'failed to load '+((e&&e.target&&(e.target.src||e.target.href))||'a resource'));},true);
window.addEventListener('unhandledrejection',function(e){s.errors.push('unhandled rejection: '+String(e.reason));});
var ce=console.error,cw=console.warn;
console.error=function(){s.errors.push(Array.prototype.join.call(arguments,' '));return ce.apply(console,arguments);};
console.warn=function(){s.warnings.push(Array.prototype.join.call(arguments,' '));return cw.apply(console,arguments);};
window.alert=function(m){s.errors.push('alert() called: '+String(m));};
})();)js";

const char* kDrawJs = R"js((function(){
var s=window.__ab,st=document.getElementById('ab-status');
var els=document.querySelectorAll('.vis[data-spec]'),drawn=0;
function finish(){
  st.setAttribute('data-rendered',String(drawn));st.setAttribute('data-errors',String(s.errors.length));
  st.setAttribute('data-warnings',String(s.warnings.length));st.setAttribute('data-warning-text',s.warnings.join(' | '));
  st.setAttribute('data-done','1');
  st.textContent=drawn+' of '+els.length+' charts drawn'+(s.errors.length?'; errors: '+s.errors.join(' | '):'');
}
if(typeof vegaEmbed!=='function'){s.errors.push('the charting scripts did not load');finish();return;}
// The charting library's own warnings are for whoever writes the specs (the tests fail on any),
// not for the reader: they are counted in data-warnings, never printed on the page or the console.
function quietLogger(){
  var lg=vega.logger(vega.Warn);
  lg.warn=function(){s.warnings.push(Array.prototype.join.call(arguments,' '));return lg;};
  return lg;
}
var jobs=Array.prototype.map.call(els,function(el){
  var spec;
  try{spec=JSON.parse(document.getElementById(el.getAttribute('data-spec')).textContent);}
  catch(e){s.errors.push(el.id+': bad spec: '+e);return Promise.resolve();}
  return vegaEmbed(el,spec,{mode:'vega-lite',renderer:'svg',logger:quietLogger(),actions:{export:true,source:false,compiled:false,editor:false}})
    .then(function(){if(el.querySelector('svg'))drawn++;else s.errors.push(el.id+': nothing drawn');})
    .catch(function(e){s.errors.push(el.id+': '+(e&&e.message?e.message:e));el.classList.add('failed');
      el.textContent='This chart could not be drawn: '+(e&&e.message?e.message:e)+'. Its numbers are in the table below.';});
});
Promise.all(jobs).then(finish,finish);
})();)js";

std::string badge_class(const std::string& b) {
  if (b == "VALID") return "b-ok";  // LoadGen's verdicts, written as LoadGen writes them
  if (b == "INVALID") return "b-invalid";
  static const std::set<std::string> known = {"ok",       "skipped",     "oom",     "diverged",    "invalid",
                                              "error",    "interrupted", "timeout", "unconverged", "noisy",
                                              "external", "faster",      "slower",  "same",        "unsure"};
  return known.count(b) ? "b-" + b : "b-other";
}

std::string lower(std::string s) {
  std::transform(s.begin(), s.end(), s.begin(), [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  return s;
}

// A script goes inside <script>...</script>: it must not be able to close the element early.
std::string checked_script(const detail::ScriptAsset& a) {
  std::string text(a.text);
  const std::string l = lower(text);
  if (l.find("</script") != std::string::npos || l.find("<!--") != std::string::npos)
    throw Error(std::string("the embedded ") + a.name + " " + a.version + " contains '</script' or '<!--' and cannot be inlined safely");
  // A source-map comment would make developer tools try to fetch the map; nothing else reads it.
  for (std::size_t at; (at = text.find("//# sourceMappingURL=")) != std::string::npos;) {
    const std::size_t end = text.find('\n', at);
    text.erase(at, end == std::string::npos ? std::string::npos : end - at);
  }
  return text;
}

void render_cell_content(std::ostream& o, const Cell& c) {
  for (const auto& b : c.badges) o << "<span class=\"badge " << badge_class(b) << "\">" << escape_html(b) << "</span>";
  if (!c.text.empty()) {
    if (c.badges.empty()) o << escape_html(c.text);
    else o << "<span class=\"cell-note\">" << escape_html(c.text) << "</span>";
  }
}

void render_table(std::ostream& o, const Table& t) {
  const bool fold = t.rows.size() > kOpenRows;
  if (fold) o << "<details><summary>Show the table (" << t.rows.size() << " rows)</summary>\n";
  o << "<div class=\"table-wrap\"><table>";
  if (!t.caption.empty()) o << "<caption>" << escape_html(t.caption) << "</caption>";
  o << "<thead><tr>";
  for (const auto& c : t.columns) o << "<th>" << escape_html(c) << "</th>";
  o << "</tr></thead><tbody>\n";
  for (const auto& row : t.rows) {
    o << "<tr>";
    for (const auto& c : row) {
      std::string cls = c.numeric ? "num" : (c.text.find('\n') != std::string::npos ? "pre" : "");
      o << "<td" << (cls.empty() ? "" : " class=\"" + cls + "\"");
      if (!c.title.empty()) o << " title=\"" << escape_html(c.title) << "\"";
      o << ">";
      render_cell_content(o, c);
      o << "</td>";
    }
    o << "</tr>\n";
  }
  o << "</tbody></table></div>\n";
  if (fold) o << "</details>\n";
}

}  // namespace

std::string escape_html(std::string_view s) {
  std::string out;
  out.reserve(s.size() + s.size() / 8);
  for (char c : s) {
    switch (c) {
      case '&': out += "&amp;"; break;
      case '<': out += "&lt;"; break;
      case '>': out += "&gt;"; break;
      case '"': out += "&quot;"; break;
      case '\'': out += "&#39;"; break;
      default: out += c;
    }
  }
  return out;
}

std::string json_for_script(const json& j) {
  const std::string d = j.dump(-1, ' ', false, json::error_handler_t::replace);
  std::string out;
  out.reserve(d.size() + 64);
  for (std::size_t i = 0; i < d.size(); ++i) {
    const char c = d[i];
    if (c == '<') out += "\\u003c";
    else if (c == '>') out += "\\u003e";
    else if (c == '&') out += "\\u0026";
    else if (c == '\xE2' && i + 2 < d.size() && d[i + 1] == '\x80' && (d[i + 2] == '\xA8' || d[i + 2] == '\xA9')) {
      out += d[i + 2] == '\xA8' ? "\\u2028" : "\\u2029";
      i += 2;
    } else {
      out += c;
    }
  }
  return out;
}

bool html_available(std::string* reason) {
  if (!detail::vega_scripts().empty()) return true;
  if (reason) *reason = detail::vega_missing_reason();
  return false;
}

std::string render_html(const Document& doc) {
  std::string why;
  if (!html_available(&why)) throw Error("cannot write an HTML report: " + why + " (`--format md` needs no scripts)");
  std::ostringstream o;
  o << "<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n"
    << "<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">\n"
    // Offline by construction: no fetch of any kind is allowed; Vega compiles expressions with
    // Function(), hence 'unsafe-eval'.
    << "<meta http-equiv=\"Content-Security-Policy\" content=\"default-src 'none'; script-src 'unsafe-inline' "
       "'unsafe-eval'; style-src 'unsafe-inline'; img-src data: blob:; font-src data:; connect-src 'none'; "
       "form-action 'none'; base-uri 'none'\">\n"
    << "<meta name=\"generator\" content=\"accelbench\">\n"
    << "<title>" << escape_html(doc.title + " — " + doc.subtitle) << "</title>\n"
    << "<style>" << kCss << "</style>\n<script>" << kCaptureJs << "</script>\n</head>\n<body>\n"
    << "<header class=\"top\"><h1>" << escape_html(doc.title) << "</h1><p>" << escape_html(doc.subtitle) << "</p></header>\n";
  o << "<nav class=\"toc\">";
  for (std::size_t i = 0; i < doc.sections.size(); ++i)
    if (doc.sections[i].level <= 2) o << "<a href=\"#s" << i << "\">" << escape_html(doc.sections[i].title) << "</a>";
  o << "</nav>\n<main>\n";
  std::size_t chart_no = 0;
  for (std::size_t i = 0; i < doc.sections.size(); ++i) {
    const Section& s = doc.sections[i];
    o << "<section class=\"card\" id=\"s" << i << "\">\n<h2>" << escape_html(s.title) << "</h2>\n";
    for (const auto& b : s.blocks) {
      if (const auto* p = std::get_if<Paragraph>(&b)) {
        o << "<p" << (p->warning ? " class=\"warning\"" : "") << ">" << escape_html(p->text) << "</p>\n";
      } else if (const auto* t = std::get_if<Table>(&b)) {
        render_table(o, *t);
      } else if (const auto* c = std::get_if<Chart>(&b)) {
        const std::size_t n = chart_no++;
        o << "<figure class=\"chart\">\n<h3>" << escape_html(c->title) << "</h3>\n"
          << "<div class=\"vis\" id=\"chart-" << n << "\" data-spec=\"spec-" << n << "\" role=\"img\" aria-label=\""
          << escape_html(c->title) << "\"></div>\n"
          << "<script type=\"application/json\" id=\"spec-" << n << "\">" << json_for_script(c->spec) << "</script>\n";
        if (!c->note.empty()) o << "<figcaption>" << escape_html(c->note) << "</figcaption>\n";
        render_table(o, c->table);
        o << "</figure>\n";
      }
    }
    o << "</section>\n";
  }
  o << "</main>\n<footer>Generated by accelbench. Statuses, flags and formulas: docs/REPORTS.md and docs/METHODOLOGY.md. "
       "Charts drawn offline with";
  for (const auto& a : detail::vega_scripts()) o << " " << escape_html(a.name) << " " << escape_html(a.version);
  o << " (BSD-3-Clause, inlined).\n<div id=\"ab-status\" data-charts=\"" << chart_no
    << "\" data-rendered=\"0\" data-errors=\"0\" data-warnings=\"0\" data-done=\"0\">Drawing " << chart_no
    << " charts… (this needs JavaScript)</div></footer>\n";
  for (const auto& a : detail::vega_scripts()) o << "<script>" << checked_script(a) << "\n</script>\n";
  o << "<script>" << kDrawJs << "</script>\n</body>\n</html>\n";
  return o.str();
}

}  // namespace ab::report
