// Where accelbench finds the files it ships beside the binary (the bundled suites), whether it runs
// from an installed tree (cmake --install, the .deb, unpacked anywhere) or from its build folder.
#pragma once

#include <filesystem>
#include <vector>

namespace ab::system {

// The folders holding the bundled suites (<name>.yaml), most specific first, each existing, none
// twice. An installed binary (<prefix>/bin/accelbench, or libexec/accelbench/ behind the launcher)
// looks beside itself first: <prefix>/share/accelbench/suites, so an unpacked copy uses its own
// suites; then the install folder compiled in (AB_INSTALL_SUITES_DIR). A binary that was not
// installed (its build folder) uses the source tree's suites/ (AB_SOURCE_SUITES_DIR) first, so a
// developer never runs the stale suites of an older install.
std::vector<std::filesystem::path> suite_search_dirs();
// The same rule for a given executable path (tests give one).
std::vector<std::filesystem::path> suite_search_dirs(const std::filesystem::path& executable);

}  // namespace ab::system
