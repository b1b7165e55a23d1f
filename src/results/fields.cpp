#include "results/fields.h"

#include <algorithm>
#include <cctype>
#include <charconv>
#include <cstddef>
#include <cstdio>

#include "core/error.h"
#include "results/output.h"

namespace ab::results {
using nlohmann::json;

namespace {

// A list index is all digits ("0", "12"); anything else names an object key.
bool list_index(std::string_view key, std::size_t& index) {
  if (key.empty() || !std::all_of(key.begin(), key.end(), [](unsigned char c) { return std::isdigit(c); }))
    return false;
  return std::from_chars(key.data(), key.data() + key.size(), index).ec == std::errc();
}

// CSV keeps every digit (shortest round trip); the text table, for reading, 6 significant ones.
// Text is made harmless where it lands: no formulas in a spreadsheet, no escapes on a terminal.
std::string cell_text(const json* value, bool csv) {
  if (value == nullptr || value->is_null()) return {};
  if (value->is_string()) return csv ? spreadsheet_safe(value->get<std::string>()) : terminal_safe(value->get<std::string>());
  if (value->is_number_float() && !csv) {
    char text[32];
    std::snprintf(text, sizeof text, "%.6g", value->get<double>());
    return text;
  }
  return value->dump(-1, ' ', false, json::error_handler_t::replace);
}

std::string csv_quoted(const std::string& cell) {
  if (cell.find_first_of(",\"\n\r") == std::string::npos) return cell;
  std::string q = "\"";
  for (char c : cell) q += c == '"' ? std::string("\"\"") : std::string(1, c);
  return q + "\"";
}

void write_row(std::ostream& out, const std::vector<std::string>& cells, const std::vector<std::size_t>& widths,
               bool csv) {
  for (std::size_t i = 0; i < cells.size(); ++i) {
    if (csv) {
      out << (i ? "," : "") << csv_quoted(cells[i]);
    } else if (i + 1 < cells.size()) {
      out << cells[i] << std::string(widths[i] - cells[i].size() + 2, ' ');
    } else {
      out << cells[i];  // no trailing blanks after the last column
    }
  }
  out << '\n';
}

}  // namespace

const json* find_field(const json& record, std::string_view dotted_path) {
  const json* value = &record;
  while (value != nullptr) {
    const auto dot = dotted_path.find('.');
    const std::string_view key = dotted_path.substr(0, dot);
    std::size_t index = 0;
    if (value->is_array() && list_index(key, index)) {
      value = index < value->size() ? &(*value)[index] : nullptr;
    } else if (value->is_object()) {
      const auto it = value->find(key);
      value = it == value->end() ? nullptr : &*it;
    } else {
      value = nullptr;
    }
    if (dot == std::string_view::npos) break;
    dotted_path.remove_prefix(dot + 1);
  }
  return value;
}

std::vector<std::string> split_field_list(std::string_view comma_separated) {
  std::vector<std::string> paths;
  while (true) {
    const auto comma = comma_separated.find(',');
    const std::string_view path = comma_separated.substr(0, comma);
    if (path.empty() || path.front() == '.' || path.back() == '.' || path.find("..") != std::string_view::npos)
      throw UsageError("--fields: '" + std::string(comma_separated) + "' has an empty path; give a.b,c.d");
    paths.emplace_back(path);
    if (comma == std::string_view::npos) return paths;
    comma_separated.remove_prefix(comma + 1);
  }
}

void write_fields(std::ostream& out, const std::vector<json>& records, const std::vector<std::string>& paths,
                  bool csv) {
  std::vector<std::vector<std::string>> rows;
  std::vector<bool> seen(paths.size(), false);
  for (const auto& record : records) {
    auto& row = rows.emplace_back();
    for (std::size_t i = 0; i < paths.size(); ++i) {
      const json* value = find_field(record, paths[i]);
      seen[i] = seen[i] || value != nullptr;
      row.push_back(cell_text(value, csv));
    }
  }
  std::string unknown;
  for (std::size_t i = 0; i < paths.size(); ++i)
    if (!records.empty() && !seen[i]) unknown += (unknown.empty() ? "" : ", ") + paths[i];
  if (!unknown.empty())
    throw UsageError("--fields: no record of the run has " + unknown + " (" + std::to_string(records.size()) +
                     " records)");
  std::vector<std::size_t> widths(paths.size());
  for (std::size_t i = 0; i < paths.size(); ++i) {
    widths[i] = paths[i].size();
    for (const auto& row : rows) widths[i] = std::max(widths[i], row[i].size());
  }
  write_row(out, paths, widths, csv);
  for (const auto& row : rows) write_row(out, row, widths, csv);
}

}  // namespace ab::results
