#include "harness/suggest.h"

#include <algorithm>

namespace ab::harness {
namespace {

// Optimal string alignment distance (Damerau-Levenshtein without repeated edits of one span).
std::size_t edit_distance(const std::string& a, const std::string& b) {
  std::vector<std::vector<std::size_t>> d(a.size() + 1, std::vector<std::size_t>(b.size() + 1));
  for (std::size_t i = 0; i <= a.size(); ++i) d[i][0] = i;
  for (std::size_t j = 0; j <= b.size(); ++j) d[0][j] = j;
  for (std::size_t i = 1; i <= a.size(); ++i)
    for (std::size_t j = 1; j <= b.size(); ++j) {
      const std::size_t cost = a[i - 1] == b[j - 1] ? 0 : 1;
      d[i][j] = std::min({d[i - 1][j] + 1, d[i][j - 1] + 1, d[i - 1][j - 1] + cost});
      if (i > 1 && j > 1 && a[i - 1] == b[j - 2] && a[i - 2] == b[j - 1])
        d[i][j] = std::min(d[i][j], d[i - 2][j - 2] + 1);
    }
  return d[a.size()][b.size()];
}

}  // namespace

std::optional<std::string> closest_name(const std::string& typed, const std::vector<std::string>& valid) {
  if (typed.empty()) return std::nullopt;
  std::optional<std::string> best;
  std::size_t best_distance = 0;
  for (const auto& name : valid) {
    const std::size_t d = edit_distance(typed, name);
    if (d == 0) continue;
    const std::size_t allowed = std::max<std::size_t>(1, std::max(typed.size(), name.size()) / 3);
    if (d <= allowed && (!best || d < best_distance)) {
      best = name;
      best_distance = d;
    }
  }
  if (best) return best;
  std::vector<std::string> begun;
  for (const auto& name : valid)
    if (name.size() > typed.size() && name.compare(0, typed.size(), typed) == 0) begun.push_back(name);
  if (begun.size() == 1) return begun.front();
  return std::nullopt;
}

std::string did_you_mean(const std::string& typed, const std::vector<std::string>& valid) {
  const auto name = closest_name(typed, valid);
  return name ? "; did you mean '" + *name + "'?" : "";
}

}  // namespace ab::harness
