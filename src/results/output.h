// Where accelbench's readable output goes (CSV, reports, comparisons, listings): a file that is
// written whole or not at all and is never one of the store's own files, or standard output with
// its write errors reported. Also the text rules that keep stored strings harmless where they
// are shown: spreadsheets, terminals and shells.
#pragma once

#include <filesystem>
#include <string>
#include <string_view>
#include <vector>

namespace ab::results {

// Throws ab::UsageError when `output` is, or resolves to (relative parts, symlinks, hard links),
// a file the results store keeps: accelbench.db and its journals, a run's points.jsonl or
// run.json (by name anywhere, and by identity under <out_dir>/runs), or any SQLite database.
void check_output_path(const std::filesystem::path& output, const std::filesystem::path& out_dir);

// Checks the path, writes `contents` to a fresh temporary beside it and renames it over the
// target only when every write, the sync and the close succeeded: a failed command leaves an
// existing file as it was. Throws ab::Error naming the file and the reason.
void write_output_file(const std::filesystem::path& output, const std::filesystem::path& out_dir,
                       std::string_view contents);

// Writes all of `contents` to standard output (after what std::cout holds); throws ab::Error
// "cannot write to standard output: <reason>" on a short or failed write (a full device, a closed pipe).
void write_stdout(std::string_view contents);

// A CSV cell that a spreadsheet would run as a formula (text starting with '=', '+', '-', '@',
// tab or carriage return) gets a leading single quote; text that is a plain number is kept.
std::string spreadsheet_safe(std::string cell);

// Stored text made safe to print on a terminal: control characters (C0, DEL, C1) and invalid
// UTF-8 bytes become visible escapes (\n, \t, \x1b, \u009b), everything else is kept.
std::string terminal_safe(std::string_view text);

// A command line that a POSIX shell reads back as exactly `args`: each argument that holds more
// than [A-Za-z0-9_@%+=:,./-] is single-quoted.
std::string shell_quoted_command(const std::vector<std::string>& args);

}  // namespace ab::results
