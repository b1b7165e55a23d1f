#include "results/files.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <fstream>
#include <iostream>
#include <system_error>

#include "core/error.h"
#include "results/output.h"
#include "results/results.h"

namespace ab::results::detail {

bool write_all(int fd, std::string_view data, int& err) {
  while (!data.empty()) {
    const ssize_t n = ::write(fd, data.data(), data.size());
    if (n < 0) {
      if (errno == EINTR) continue;
      err = errno;
      return false;
    }
    data.remove_prefix(static_cast<std::size_t>(n));
  }
  return true;
}

void throw_errno(const std::string& what, const std::filesystem::path& path, int err) {
  throw Error(what + " " + path.string() + ": " + std::error_code(err, std::generic_category()).message());
}

AppendOnlyFile::AppendOnlyFile(const std::filesystem::path& path) : path_(path) {
  fd_ = ::open(path_.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_APPEND | O_CLOEXEC, 0644);
  if (fd_ < 0) throw_errno("cannot create", path_, errno);
}

AppendOnlyFile::~AppendOnlyFile() {
  if (fd_ >= 0) ::close(fd_);
}

void AppendOnlyFile::append_durably(std::string_view data) {
  int err = 0;
  if (!write_all(fd_, data, err)) {
    if (::ftruncate(fd_, static_cast<off_t>(size_bytes_)) != 0) {
      // Nothing more to do: the partial line stays and readers count it as one bad line.
    }
    throw_errno("cannot append to", path_, err);
  }
  size_bytes_ += static_cast<std::int64_t>(data.size());  // written, whether or not the sync works
  if (::fsync(fd_) != 0) throw_errno("cannot fsync", path_, errno);
}

void replace_file_durably(const std::filesystem::path& path, std::string_view contents) {
  // A fresh name per write: two writers, or a stale temporary, never share one.
  std::string tmp_name = path.string() + ".tmp.XXXXXX";
  const int fd = ::mkstemp(tmp_name.data());
  const std::filesystem::path tmp(tmp_name);
  if (fd < 0) throw_errno("cannot create a temporary beside", path, errno);
  int err = 0;
  bool ok = write_all(fd, contents, err);
  if (ok && ::fchmod(fd, 0644) != 0) {  // mkstemp makes it 0600; output is for sharing
    ok = false;
    err = errno;
  }
  if (ok && ::fsync(fd) != 0) {
    ok = false;
    err = errno;
  }
  if (::close(fd) != 0 && ok) {  // NFS and full disks may report the failed write only here
    ok = false;
    err = errno;
  }
  if (!ok) {
    ::unlink(tmp.c_str());
    throw_errno("cannot write", path, err);
  }
  if (::rename(tmp.c_str(), path.c_str()) != 0) {
    err = errno;
    ::unlink(tmp.c_str());
    throw_errno("cannot rename " + tmp.string() + " to", path, err);
  }
  sync_dir(path.has_parent_path() ? path.parent_path() : std::filesystem::path("."));
}

void sync_dir(const std::filesystem::path& dir) {
  const int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) throw_errno("cannot open directory", dir, errno);
  const int rc = ::fsync(fd);
  const int err = errno;
  ::close(fd);
  if (rc != 0) throw_errno("cannot fsync directory", dir, err);
}

}  // namespace ab::results::detail

namespace ab::results {

JsonlRead read_jsonl(const std::filesystem::path& file) {
  errno = 0;
  std::ifstream in(file, std::ios::binary);
  if (!in) detail::throw_errno("cannot read", file, errno != 0 ? errno : EIO);
  JsonlRead out;
  std::string line;
  for (std::size_t line_number = 1; std::getline(in, line); ++line_number) {
    if (!line.empty() && line.back() == '\r') line.pop_back();
    if (line.find_first_not_of(" \t") == std::string::npos) continue;
    // No exceptions: a truncated line (the run was killed mid-write) is counted, not fatal.
    nlohmann::json j = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
    if (j.is_discarded() || !j.is_object()) {
      ++out.bad_lines;
      out.bad_line_numbers.push_back(line_number);
      continue;
    }
    out.records.push_back(std::move(j));
  }
  if (in.bad()) detail::throw_errno("error reading", file, EIO);
  return out;
}

}  // namespace ab::results

namespace ab::results {
namespace {
namespace fs = std::filesystem;

bool is_store_file_name(const fs::path& p) {
  const std::string name = p.filename().string();
  return name == "points.jsonl" || name == "run.json" || name.starts_with("accelbench.db");  // and -wal, -shm, -journal
}

bool same_file(const fs::path& a, const fs::path& b) {
  std::error_code ec;
  return fs::equivalent(a, b, ec) && !ec;
}

// What an existing file holds, judged from its head: an SQLite database, an accelbench record
// (points.jsonl or run.json, under whatever name a hard link gives it), or neither ("").
std::string store_content(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  std::string head(16, '\0');
  in.read(head.data(), static_cast<std::streamsize>(head.size()));
  if (in.gcount() == 16 && std::memcmp(head.data(), "SQLite format 3", 16) == 0) return "an SQLite database";
  in.clear();
  in.seekg(0);
  std::string first_line;
  if (!std::getline(in, first_line)) return {};
  const auto j = nlohmann::json::parse(first_line, nullptr, /*allow_exceptions=*/false);
  if (j.is_object() && j.contains("run_id") && (j.contains("schema_version") || j.contains("workload")))
    return "an accelbench record file";
  return {};
}

}  // namespace

void check_output_path(const fs::path& output, const fs::path& out_dir) {
  const auto refuse = [&](const std::string& what) {
    throw UsageError("refusing to write " + output.string() + ": it is " + what +
                     "; the store's files are never output (choose another file)");
  };
  std::error_code ec;
  const fs::path resolved = fs::weakly_canonical(fs::absolute(output), ec);
  if (is_store_file_name(output) || (!ec && is_store_file_name(resolved))) refuse("named as a file of the results store");
  // A folder that is not there fails before any work, as a usage error, not after it at the rename.
  if (const fs::path folder = fs::absolute(output, ec).parent_path(); !ec && !fs::is_directory(folder, ec))
    throw UsageError("cannot write " + output.string() + ": " + folder.string() + " is not an existing folder");
  if (!fs::exists(output, ec)) return;
  if (fs::is_directory(output, ec)) refuse("a directory");
  const fs::path runs = out_dir / "runs";
  for (const char* name : {"accelbench.db", "accelbench.db-wal", "accelbench.db-shm", "accelbench.db-journal"})
    if (same_file(output, runs / name)) refuse("the results store " + (runs / name).string());
  if (fs::is_directory(runs, ec)) {
    for (const auto& entry : fs::directory_iterator(runs, ec)) {
      if (!entry.is_directory(ec)) continue;
      for (const char* name : {"points.jsonl", "run.json"})
        if (same_file(output, entry.path() / name)) refuse("the run file " + (entry.path() / name).string());
    }
  }
  if (!fs::is_regular_file(output, ec)) return;  // a device or a pipe: reading its head could block
  if (const std::string what = store_content(output); !what.empty()) refuse(what);
}

// Writes `contents` into an existing file that is not a regular one (a terminal, a pipe, /dev/null,
// /dev/full): renaming a temporary over it would replace the device itself.
void write_in_place(const fs::path& output, std::string_view contents) {
  const int fd = ::open(output.c_str(), O_WRONLY | O_CLOEXEC);
  if (fd < 0) detail::throw_errno("cannot open", output, errno);
  int err = 0;
  bool ok = detail::write_all(fd, contents, err);
  if (::close(fd) != 0 && ok) {
    ok = false;
    err = errno;
  }
  if (!ok) detail::throw_errno("cannot write", output, err);
}

void write_output_file(const fs::path& output, const fs::path& out_dir, std::string_view contents) {
  check_output_path(output, out_dir);
  std::error_code ec;
  if (const auto type = fs::status(output, ec).type();
      !ec && type != fs::file_type::regular && type != fs::file_type::not_found)
    return write_in_place(output, contents);
  // Through a symlink the file it names is replaced, and the link kept.
  const fs::path target = fs::is_symlink(output, ec) ? fs::weakly_canonical(output, ec) : output;
  detail::replace_file_durably(ec ? output : target, contents);
}

void write_stdout(std::string_view contents) {
  errno = 0;
  std::cout.write(contents.data(), static_cast<std::streamsize>(contents.size()));
  std::cout.flush();
  if (!std::cout) {
    const int err = errno != 0 ? errno : EIO;
    std::cout.clear();  // so later output (none is expected) does not hide this error
    throw Error("cannot write to standard output: " + std::error_code(err, std::generic_category()).message());
  }
}

}  // namespace ab::results
