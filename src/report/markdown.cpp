// The same document as Markdown (pull requests) or as plain aligned text (terminals).
#include <algorithm>
#include <sstream>

#include "report/report.h"

namespace ab::report {
namespace {

// Characters that Markdown (CommonMark / GitHub) would read as syntax or as inline HTML.
std::string escape_md(const std::string& s) {
  std::string out;
  for (char c : s) {
    if (c == '\n') {
      out += "<br>";
      continue;
    }
    if (c == '\\' || c == '|' || c == '<' || c == '>' || c == '*' || c == '`' || c == '[' || c == ']') out += '\\';
    out += c;
  }
  return out;
}

std::string cell_text(const Cell& c, const std::string& newline) {
  std::string s;
  for (const auto& b : c.badges) s += (s.empty() ? "" : " · ") + b;
  if (!c.text.empty()) s += (s.empty() ? "" : ": ") + c.text;
  std::string out;
  for (char ch : s) out += ch == '\n' ? newline : std::string(1, ch);
  return out;
}

// Display width of UTF-8 text: code points, not bytes (µ, ±, ×, → are one column each).
std::size_t width(const std::string& s) {
  return static_cast<std::size_t>(std::count_if(s.begin(), s.end(), [](char c) { return (static_cast<unsigned char>(c) & 0xC0) != 0x80; }));
}

void md_table(std::ostream& o, const Table& t) {
  if (!t.caption.empty()) o << "*" << escape_md(t.caption) << "*\n\n";
  o << "|";
  for (const auto& c : t.columns) o << " " << (c.empty() ? " " : escape_md(c)) << " |";
  o << "\n|";
  for (std::size_t i = 0; i < t.columns.size(); ++i) {
    const bool numeric = !t.rows.empty() && i < t.rows.front().size() && t.rows.front()[i].numeric;
    o << (numeric ? "---:|" : "---|");
  }
  o << "\n";
  for (const auto& row : t.rows) {
    o << "|";
    for (const auto& c : row) o << " " << escape_md(cell_text(c, "; ")) << " |";
    o << "\n";
  }
  o << "\n";
}

void text_table(std::ostream& o, const Table& t) {
  if (!t.caption.empty()) o << t.caption << ":\n";
  std::vector<std::vector<std::string>> cells;
  cells.push_back(t.columns);
  for (const auto& row : t.rows) {
    std::vector<std::string> r;
    for (const auto& c : row) r.push_back(cell_text(c, "; "));
    cells.push_back(std::move(r));
  }
  std::vector<std::size_t> w(t.columns.size(), 0);
  for (const auto& r : cells)
    for (std::size_t i = 0; i < r.size() && i < w.size(); ++i) w[i] = std::max(w[i], std::min<std::size_t>(width(r[i]), 60));
  for (std::size_t ri = 0; ri < cells.size(); ++ri) {
    const auto& r = cells[ri];
    std::string line;
    for (std::size_t i = 0; i < r.size() && i < w.size(); ++i) {
      const bool right = ri > 0 && t.rows[ri - 1][i].numeric;
      const std::string pad(w[i] > width(r[i]) ? w[i] - width(r[i]) : 0, ' ');
      line += (i ? "  " : "") + (right ? pad + r[i] : r[i] + (i + 1 < r.size() ? pad : ""));
    }
    o << line << "\n";
    if (ri == 0) {
      std::size_t total = 0;
      for (auto x : w) total += x + 2;
      o << std::string(total > 2 ? total - 2 : 0, '-') << "\n";
    }
  }
  o << "\n";
}

}  // namespace

std::string render_markdown(const Document& doc) {
  std::ostringstream o;
  o << "# " << escape_md(doc.title) << "\n\n" << escape_md(doc.subtitle) << "\n\n";
  for (const auto& s : doc.sections) {
    o << std::string(static_cast<std::size_t>(std::clamp(s.level, 1, 6)), '#') << " " << escape_md(s.title) << "\n\n";
    for (const auto& b : s.blocks) {
      if (const auto* p = std::get_if<Paragraph>(&b)) {
        o << (p->warning ? "> **Note:** " : "") << escape_md(p->text) << "\n\n";
      } else if (const auto* t = std::get_if<Table>(&b)) {
        md_table(o, *t);
      } else if (const auto* c = std::get_if<Chart>(&b)) {
        o << "#### " << escape_md(c->title) << "\n\n";
        if (!c->note.empty()) o << escape_md(c->note) << " (The chart is in the HTML report.)\n\n";
        md_table(o, c->table);
      }
    }
  }
  return o.str();
}

std::string render_text(const Document& doc) {
  std::ostringstream o;
  o << doc.title << "\n" << doc.subtitle << "\n\n";
  for (const auto& s : doc.sections) {
    o << s.title << "\n" << std::string(width(s.title), s.level <= 2 ? '=' : '-') << "\n";
    for (const auto& b : s.blocks) {
      if (const auto* p = std::get_if<Paragraph>(&b)) o << (p->warning ? "NOTE: " : "") << p->text << "\n\n";
      else if (const auto* t = std::get_if<Table>(&b)) text_table(o, *t);
      else if (const auto* c = std::get_if<Chart>(&b)) {
        o << c->title << "\n";
        if (!c->note.empty()) o << c->note << "\n";
        text_table(o, c->table);
      }
    }
  }
  return o.str();
}

}  // namespace ab::report
