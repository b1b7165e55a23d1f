// "Did you mean" for a mistyped name (a workload, axis, option, subcommand): the closest valid
// name by edit distance, offered only when it is close enough to be the likely intent.
#pragma once

#include <optional>
#include <string>
#include <vector>

namespace ab::harness {

// The valid name `typed` most likely meant: the one at the smallest edit distance (insertions,
// deletions, substitutions and swaps of neighbours count 1), if that distance is at most a third
// of the longer name (and at least 1); or the one name `typed` begins. nullopt when none is close.
std::optional<std::string> closest_name(const std::string& typed, const std::vector<std::string>& valid);

// "; did you mean 'gemm'?" where closest_name finds one, else "": the end of a message that has
// listed the valid names ("unknown workload 'gemn'; valid: ...; did you mean 'gemm'?").
std::string did_you_mean(const std::string& typed, const std::vector<std::string>& valid);

}  // namespace ab::harness
