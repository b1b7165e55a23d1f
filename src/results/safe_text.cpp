// Text rules for stored strings shown elsewhere: spreadsheets, terminals, shells.
#include <cmath>
#include <cstdio>
#include <cstdlib>

#include "results/output.h"

namespace ab::results {
namespace {

// "-1.5", "+3", "1e-3": a spreadsheet reads these as numbers, which is what they are.
bool is_plain_number(const std::string& s) {
  if (s.empty() || s.find_first_of(" \t\r\n") != std::string::npos) return false;
  char* end = nullptr;
  const double v = std::strtod(s.c_str(), &end);
  return end == s.c_str() + s.size() && std::isfinite(v);
}

std::string hex_escape(const char* format, unsigned value) {
  char buf[8];
  std::snprintf(buf, sizeof buf, format, value);
  return buf;
}

// Length of the valid UTF-8 sequence at s[i] (2..4), or 0 if it is not one.
std::size_t utf8_length(std::string_view s, std::size_t i) {
  const auto b = static_cast<unsigned char>(s[i]);
  const std::size_t n = b >= 0xF0 && b <= 0xF4 ? 4 : b >= 0xE0 ? 3 : b >= 0xC2 && b < 0xE0 ? 2 : 0;
  if (n == 0 || b >= 0xF5 || i + n > s.size()) return 0;
  for (std::size_t k = 1; k < n; ++k)
    if ((static_cast<unsigned char>(s[i + k]) & 0xC0) != 0x80) return 0;
  return n;
}

}  // namespace

std::string spreadsheet_safe(std::string cell) {
  if (cell.empty() || std::string_view("=+-@\t\r").find(cell.front()) == std::string_view::npos) return cell;
  if (is_plain_number(cell)) return cell;
  return "'" + cell;
}

std::string terminal_safe(std::string_view text) {
  std::string out;
  out.reserve(text.size());
  for (std::size_t i = 0; i < text.size();) {
    const auto b = static_cast<unsigned char>(text[i]);
    if (b < 0x80) {
      if (b == '\n') out += "\\n";
      else if (b == '\t') out += "\\t";
      else if (b < 0x20 || b == 0x7F) out += hex_escape("\\x%02x", b);
      else out += static_cast<char>(b);
      ++i;
      continue;
    }
    const std::size_t n = utf8_length(text, i);
    if (n == 0) {
      out += hex_escape("\\x%02x", b);
      ++i;
    } else if (n == 2 && b == 0xC2 && static_cast<unsigned char>(text[i + 1]) < 0xA0) {
      out += hex_escape("\\u%04x", static_cast<unsigned char>(text[i + 1]));  // C1 control, e.g. CSI
      i += 2;
    } else {
      out.append(text.substr(i, n));
      i += n;
    }
  }
  return out;
}

std::string shell_quoted_command(const std::vector<std::string>& args) {
  constexpr std::string_view kSafe =
      "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_@%+=:,./-";
  std::string out;
  for (const auto& a : args) {
    if (!out.empty()) out += ' ';
    if (!a.empty() && a.find_first_not_of(kSafe) == std::string::npos) {
      out += a;
      continue;
    }
    out += '\'';
    for (const char ch : a) out += ch == '\'' ? std::string("'\\''") : std::string(1, ch);
    out += '\'';
  }
  return out;
}

}  // namespace ab::results
