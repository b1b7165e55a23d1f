// What was built: version, git commit, compiler and flags. Filled at build time (cmake/BuildInfo.cmake).
#pragma once

#include <string>

namespace ab::system {

struct BuildInfo {
  std::string version, git_commit;
  bool git_dirty;
  std::string build_type, compiler, cxx_flags;
  bool with_cuda;
  std::string cuda_architectures;
  bool sanitizers;
};

const BuildInfo& build_info();

}  // namespace ab::system
