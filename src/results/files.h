// Durable file writes for the results store: an append-only JSON Lines file synced per line, and
// whole-file replacement that never leaves a half-written file. Internal to src/results.
#pragma once

#include <cstdint>
#include <filesystem>
#include <string>
#include <string_view>

namespace ab::results::detail {

// Writes all of `data` to `fd`, looping over short writes and EINTR; false with `err` set on failure.
bool write_all(int fd, std::string_view data, int& err);

// Throws ab::Error "<what> <path>: <strerror(errno)>".
[[noreturn]] void throw_errno(const std::string& what, const std::filesystem::path& path, int err);

class AppendOnlyFile {
 public:
  explicit AppendOnlyFile(const std::filesystem::path& path);  // creates it; it must not exist yet
  ~AppendOnlyFile();
  AppendOnlyFile(const AppendOnlyFile&) = delete;
  AppendOnlyFile& operator=(const AppendOnlyFile&) = delete;

  // Writes all of `data`, then fsync: on return it is on disk. On failure the file is cut back
  // to its previous length, so a later line never lands glued to a partial one.
  void append_durably(std::string_view data);

 private:
  std::filesystem::path path_;
  int fd_ = -1;
  std::int64_t size_bytes_ = 0;
};

// Replaces `path` with `contents` through a synced temporary and rename: readers see the old
// file or the new one, never a mix.
void replace_file_durably(const std::filesystem::path& path, std::string_view contents);

// Makes a directory's entries (files just created or renamed in it) durable.
void sync_dir(const std::filesystem::path& dir);

}  // namespace ab::results::detail
