#include "results/files.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <fstream>
#include <system_error>

#include "core/error.h"
#include "results/results.h"

namespace ab::results::detail {
namespace {

// write(2) may write less than asked or be interrupted; loop until all is written.
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

}  // namespace

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
  std::filesystem::path tmp = path;
  tmp += ".tmp";
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) throw_errno("cannot create", tmp, errno);
  int err = 0;
  bool ok = write_all(fd, contents, err);
  if (ok && ::fsync(fd) != 0) {
    ok = false;
    err = errno;
  }
  ::close(fd);
  if (!ok) {
    ::unlink(tmp.c_str());
    throw_errno("cannot write", tmp, err);
  }
  if (::rename(tmp.c_str(), path.c_str()) != 0) {
    err = errno;
    ::unlink(tmp.c_str());
    throw_errno("cannot rename " + tmp.string() + " to", path, err);
  }
  sync_dir(path.parent_path());
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
  while (std::getline(in, line)) {
    if (!line.empty() && line.back() == '\r') line.pop_back();
    if (line.find_first_not_of(" \t") == std::string::npos) continue;
    // No exceptions: a truncated line (the run was killed mid-write) is counted, not fatal.
    nlohmann::json j = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
    if (j.is_discarded() || !j.is_object()) {
      ++out.bad_lines;
      continue;
    }
    out.records.push_back(std::move(j));
  }
  if (in.bad()) detail::throw_errno("error reading", file, EIO);
  return out;
}

}  // namespace ab::results
