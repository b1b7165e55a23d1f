#include "system/paths.h"

#include <algorithm>
#include <system_error>

#ifndef AB_INSTALL_SUITES_DIR
#define AB_INSTALL_SUITES_DIR ""
#endif
#ifndef AB_SOURCE_SUITES_DIR
#define AB_SOURCE_SUITES_DIR ""
#endif

namespace ab::system {
namespace fs = std::filesystem;

namespace {

// The install's suites relative to the executable: bin/ and libexec/accelbench/ (the real binary
// behind the CUDA build's launcher script).
std::vector<fs::path> beside(const fs::path& executable) {
  if (executable.empty()) return {};
  const fs::path dir = executable.parent_path();
  return {dir / ".." / "share" / "accelbench" / "suites", dir / ".." / ".." / "share" / "accelbench" / "suites"};
}

bool is_dir(const fs::path& p) {
  std::error_code ec;
  return !p.empty() && fs::is_directory(p, ec);
}

}  // namespace

std::vector<fs::path> suite_search_dirs(const fs::path& executable) {
  std::vector<fs::path> candidates;
  for (const fs::path& p : beside(executable))
    if (is_dir(p)) candidates.push_back(p);
  const bool installed = !candidates.empty();
  if (!installed) candidates.emplace_back(AB_SOURCE_SUITES_DIR);
  candidates.emplace_back(AB_INSTALL_SUITES_DIR);
  std::vector<fs::path> dirs;
  for (const fs::path& p : candidates) {
    if (!is_dir(p)) continue;
    std::error_code ec;
    const fs::path canonical = fs::weakly_canonical(p, ec);
    const fs::path shown = ec ? p.lexically_normal() : canonical;
    if (std::find(dirs.begin(), dirs.end(), shown) == dirs.end()) dirs.push_back(shown);
  }
  return dirs;
}

std::vector<fs::path> suite_search_dirs() {
  std::error_code ec;
  const fs::path self = fs::read_symlink("/proc/self/exe", ec);
  return suite_search_dirs(ec ? fs::path() : self);
}

}  // namespace ab::system
