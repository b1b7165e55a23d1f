// Internal to src/report: the Vega, Vega-Lite and vega-embed browser builds, embedded at build time
// from node_modules by embed_js.cmake (the generated vega_assets.cpp defines these).
#pragma once

#include <string>
#include <string_view>
#include <vector>

namespace ab::report::detail {

struct ScriptAsset {
  const char* name;     // npm package
  const char* version;  // from its package.json
  std::string_view text;
};

// In load order (vega, vega-lite, vega-embed); empty when node_modules was missing at build time.
const std::vector<ScriptAsset>& vega_scripts();
// Why the list is empty, with what to do; "" when the scripts are there.
std::string vega_missing_reason();

}  // namespace ab::report::detail
