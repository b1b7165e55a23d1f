#include "harness/suite.h"

#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <cstdlib>
#include <fstream>
#include <map>

#include "core/error.h"
#include "harness/workload.h"
#include "measure/measure.h"

namespace ab::harness {
namespace {

[[noreturn]] void fail(const std::filesystem::path& file, const YAML::Mark& mark, const std::string& what) {
  throw UsageError(file.string() + ":" + std::to_string(mark.line + 1) + ": " + what);
}

// A key twice in one mapping: yaml-cpp keeps one silently, so the other would be ignored.
void refuse_duplicate_keys(const std::filesystem::path& file, const YAML::Node& n) {
  if (n.IsSequence()) {
    for (const auto& item : n) refuse_duplicate_keys(file, item);
    return;
  }
  if (!n.IsMap()) return;
  std::map<std::string, int> first_line;
  for (const auto& kv : n) {
    if (kv.first.IsScalar()) {
      const auto [it, added] = first_line.emplace(kv.first.Scalar(), kv.first.Mark().line + 1);
      if (!added)
        fail(file, kv.first.Mark(),
             "key '" + kv.first.Scalar() + "' is given twice (first on line " + std::to_string(it->second) + ")");
    }
    refuse_duplicate_keys(file, kv.second);
  }
}

std::string where(const std::filesystem::path& file, const YAML::Node& n) {
  return file.string() + ":" + std::to_string(n.Mark().line + 1);
}

Suite parse_suite(const std::filesystem::path& file, const YAML::Node& root, const Registry& registry);

std::string scalar_list(const std::filesystem::path& file, const YAML::Node& n, const std::string& axis) {
  if (n.IsScalar()) return n.as<std::string>();
  if (!n.IsSequence() || n.size() == 0) fail(file, n.Mark(), "axis '" + axis + "' needs a value or a list of values");
  std::string out;
  for (const auto& item : n) {
    if (!item.IsScalar()) fail(file, item.Mark(), "axis '" + axis + "' list items must be plain values");
    out += (out.empty() ? "" : ",") + item.as<std::string>();
  }
  return out;
}

std::optional<double> number(const std::filesystem::path& file, const YAML::Node& settings, const char* key) {
  if (!settings[key]) return std::nullopt;
  try {
    return settings[key].as<double>();
  } catch (const YAML::Exception&) {
    fail(file, settings[key].Mark(), std::string("setting '") + key + "' must be a number");
  }
}

// A step's `options:` mapping, each checked against the workload's declarations at its line.
OptionValues step_options(const std::filesystem::path& file, const YAML::Node& options, const Workload& w) {
  if (!options.IsMap()) fail(file, options.Mark(), "'options' must be a mapping of option names to one value each");
  OptionValues out;
  for (const auto& kv : options) {
    const auto name = kv.first.as<std::string>();
    if (!kv.second.IsScalar()) fail(file, kv.second.Mark(), "option '" + name + "' takes one value");
    out[name] = kv.second.as<std::string>();
    try {
      resolve_options(w.name(), w.options(), {{name, out[name]}});
    } catch (const UsageError& e) {
      fail(file, kv.first.Mark(), e.what());
    }
  }
  return out;
}

}  // namespace

std::vector<std::filesystem::path> suite_dirs() {
  namespace fs = std::filesystem;
  std::vector<fs::path> dirs;
  if (const char* env = std::getenv("ACCELBENCH_SUITES"); env != nullptr && *env != '\0') dirs.emplace_back(env);
  std::error_code ec;
  if (const fs::path exe = fs::read_symlink("/proc/self/exe", ec); !ec)
    dirs.push_back(exe.parent_path().parent_path() / "share" / "accelbench" / "suites");
  dirs.emplace_back(ACCELBENCH_INSTALL_SUITES_DIR);
  dirs.emplace_back(ACCELBENCH_SOURCE_SUITES_DIR);
  std::vector<fs::path> present;
  for (const auto& d : dirs) {
    const fs::path canonical = fs::weakly_canonical(d, ec);
    if (!ec && fs::is_directory(canonical, ec) && std::find(present.begin(), present.end(), canonical) == present.end())
      present.push_back(canonical);
  }
  return present;
}

std::vector<BundledSuite> bundled_suites() {
  std::map<std::string, BundledSuite> by_name;
  for (const auto& dir : suite_dirs()) {
    std::error_code ec;
    for (const auto& e : std::filesystem::directory_iterator(dir, ec)) {
      if (!e.is_regular_file(ec) || !looks_like_suite(e.path().string())) continue;
      const std::string name = e.path().stem().string();
      if (by_name.contains(name)) continue;
      BundledSuite s{name, "", e.path()};
      try {
        const YAML::Node root = YAML::LoadFile(e.path().string());
        if (root.IsMap() && root["description"] && root["description"].IsScalar())
          s.description = root["description"].as<std::string>();
      } catch (const YAML::Exception&) {  // a broken file is listed; running it names the error
      }
      by_name.emplace(name, std::move(s));
    }
  }
  std::vector<BundledSuite> out;
  for (auto& [name, s] : by_name) out.push_back(std::move(s));
  return out;
}

std::optional<std::filesystem::path> find_bundled_suite(const std::string& name) {
  const std::string stem = looks_like_suite(name) ? std::filesystem::path(name).stem().string() : name;
  if (stem.empty() || name.find('/') != std::string::npos) return std::nullopt;
  for (const auto& s : bundled_suites())
    if (s.name == stem) return s.path;
  return std::nullopt;
}

bool looks_like_suite(const std::string& name) {
  const auto ext = std::filesystem::path(name).extension();
  return ext == ".yaml" || ext == ".yml";
}

Suite load_suite(const std::filesystem::path& file, const Registry& registry) {
  std::ifstream in(file);
  if (!in) throw UsageError("cannot read suite file " + file.string());
  try {
    const YAML::Node root = YAML::Load(in);
    refuse_duplicate_keys(file, root);
    return parse_suite(file, root, registry);
  } catch (const YAML::ParserException& e) {
    fail(file, e.mark, e.msg);
  } catch (const YAML::Exception& e) {  // a wrong type anywhere (a list where a name goes): our place, our words
    fail(file, e.mark, e.msg + ": a value of the wrong type here");
  }
}

namespace {

Suite parse_suite(const std::filesystem::path& file, const YAML::Node& root, const Registry& registry) {
  if (!root.IsMap()) fail(file, root.Mark(), "a suite is a mapping with 'name' and 'steps'");
  for (const auto& kv : root) {
    const auto key = kv.first.as<std::string>();
    if (key != "name" && key != "description" && key != "settings" && key != "steps")
      fail(file, kv.first.Mark(), "unknown key '" + key + "'; valid: name, description, settings, steps");
  }
  Suite s;
  s.name = root["name"] ? root["name"].as<std::string>() : file.stem().string();
  if (root["description"]) s.description = root["description"].as<std::string>();
  if (const auto settings = root["settings"]; settings) {
    if (!settings.IsMap()) fail(file, settings.Mark(), "'settings' must be a mapping");
    for (const auto& kv : settings) {
      const auto key = kv.first.as<std::string>();
      if (key != "min_time" && key != "max_noise" && key != "timeout" && key != "warmup" && key != "mode" &&
          key != "counters")
        fail(file, kv.first.Mark(),
             "unknown setting '" + key + "'; valid: min_time, max_noise, timeout, warmup, mode, counters");
    }
    s.min_time_s = number(file, settings, "min_time");
    s.max_noise_pct = number(file, settings, "max_noise");
    s.timeout_s = number(file, settings, "timeout");
    s.warmup_s = number(file, settings, "warmup");
    if (settings["mode"]) {
      s.mode = settings["mode"].as<std::string>();
      try {
        measure::parse_timing_mode(*s.mode);
      } catch (const UsageError& e) {
        fail(file, settings["mode"].Mark(), e.what());
      }
    }
    if (settings["counters"]) {
      s.counters = settings["counters"].as<std::string>();
      try {
        counters::parse_metric_set(*s.counters);
      } catch (const UsageError& e) {
        fail(file, settings["counters"].Mark(), e.what());
      }
    }
    for (const auto& kv : settings) s.setting_at[kv.first.as<std::string>()] = where(file, kv.first);
  }
  const auto steps = root["steps"];
  if (!steps || !steps.IsSequence() || steps.size() == 0) fail(file, root.Mark(), "'steps' must be a non-empty list");
  for (const auto& step : steps) {
    if (!step.IsMap() || !step["workload"]) fail(file, step.Mark(), "each step needs 'workload'");
    SuiteStep st;
    st.line = step.Mark().line + 1;
    st.workload = step["workload"].as<std::string>();
    Workload* w = nullptr;
    try {
      w = &registry.find(st.workload);
    } catch (const UsageError& e) {
      fail(file, step["workload"].Mark(), e.what());
    }
    for (const auto& kv : step) {
      const auto key = kv.first.as<std::string>();
      if (key != "workload" && key != "axes" && key != "options")
        fail(file, kv.first.Mark(), "unknown step key '" + key + "'; valid: workload, axes, options");
    }
    if (const auto axes = step["axes"]; axes) {
      if (!axes.IsMap()) fail(file, axes.Mark(), "'axes' must be a mapping of axis names to values");
      for (const auto& kv : axes) {
        const auto name = kv.first.as<std::string>();
        try {
          st.overrides.push_back(parse_axis_argument(name + "=" + scalar_list(file, kv.second, name)));
          // Validate now, for both device kinds, so a typo fails before anything runs.
          for (const char* kind : {"cpu", "cuda"}) build_sweep(w->axes(kind), w->zip_groups(), {st.overrides.back()});
        } catch (const UsageError& e) {
          fail(file, kv.first.Mark(), e.what());
        }
      }
    }
    try {
      refuse_conflicting_overrides(st.overrides);
    } catch (const UsageError& e) {
      fail(file, step["axes"].Mark(), e.what());
    }
    if (const auto options = step["options"]; options) st.options = step_options(file, options, *w);
    s.steps.push_back(std::move(st));
  }
  return s;
}

}  // namespace

}  // namespace ab::harness
