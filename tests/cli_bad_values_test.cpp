// Every subcommand of accelbench, each option given a bad value (negative, NaN, infinite, 0 where
// not allowed, garbage text, empty, a missing file or folder): the command exits with its
// documented code (2 for a usage error; a run whose point refuses a value records it `invalid`
// and exits 2 too), the message names the option or the value, and nothing aborts.
#include <gtest/gtest.h>

#include <regex>
#include <set>
#include <string>
#include <vector>

#include "test_support.h"

namespace fs = std::filesystem;
namespace {

using ab::test::Ran;
using ab::test::TempDir;
namespace test = ab::test;

struct BadValue {
  std::vector<std::string> args;  // $OUT: a folder with one run; $RUN: that run's id
  std::string names;              // what the message must contain: the option, or the value it refused
  int code = 2;
};

// Small and fast where a command would go on to run: every run row stops before measuring, or
// at a point refused for its value.
const std::vector<BadValue>& bad_values() {
  static const std::vector<BadValue> rows = [] {
    std::vector<BadValue> r{
        {{"sysinfo", "--json=garbage"}, "--json"},
        {{"list", "--json=garbage"}, "--json"},
        {{"run", "no-such-workload", "--out", "$OUT"}, "no-such-workload"},
        {{"run", "$OUT/missing.yaml", "--out", "$OUT"}, "missing.yaml"},
        {{"run", "stream", "--device", "tpu:0", "--out", "$OUT"}, "device 'tpu:0'"},
        {{"run", "stream", "--device", "cuda:-1", "--out", "$OUT"}, "device 'cuda:-1'"},
        {{"run", "stream", "--device", "cuda:x", "--out", "$OUT"}, "device 'cuda:x'"},
        {{"run", "stream", "--device", "", "--out", "$OUT"}, "--device"},
        {{"run", "stream", "--device", "cpu", "--axis", "garbage", "--out", "$OUT"}, "--axis"},
        {{"run", "stream", "--device", "cpu", "--axis", "array_bytes=abc", "--out", "$OUT"}, "axis array_bytes"},
        {{"run", "stream", "--device", "cpu", "--axis", "array_bytes=nan", "--out", "$OUT"}, "axis array_bytes"},
        {{"run", "stream", "--device", "cpu", "--axis", "array_bytes=inf", "--out", "$OUT"}, "axis array_bytes"},
        {{"run", "stream", "--device", "cpu", "--axis", "op=garbage", "--out", "$OUT"}, "op 'garbage'"},
        {{"run", "stream", "--device", "cpu", "--axis", "array_bytes=-1", "--axis", "op=copy", "--out", "$OUT", "-q"},
         "array_bytes=-1"},
        {{"run", "stream", "--device", "cpu", "--axis", "array_bytes=0", "--axis", "op=copy", "--out", "$OUT", "-q"},
         "array_bytes=0"},
        {{"run", "train", "--device", "cpu", "--option", "garbage", "--out", "$OUT"}, "option 'garbage'"},
        {{"run", "train", "--device", "cpu", "--option", "steps_per_sample=abc", "--out", "$OUT"},
         "option steps_per_sample"},
        {{"run", "train", "--device", "cpu", "--option", "lr=nan", "--out", "$OUT"}, "option lr"},
        {{"run", "train", "--device", "cpu", "--option", "lr=inf", "--out", "$OUT"}, "option lr"},
        {{"run", "train", "--device", "cpu", "--option", "no_such=1", "--out", "$OUT"}, "no_such"},
        {{"run", "stream", "--device", "cpu", "--mode", "garbage", "--out", "$OUT"}, "--mode"},
        {{"run", "stream", "--device", "cpu", "--out", "$OUT/runs/accelbench.db"}, "accelbench.db"},
        {{"run", "stream", "--device", "cpu", "--out", ""}, "--out"},
        {{"run", "stream", "--device", "cpu", "--telemetry-trace=garbage", "--out", "$OUT"}, "--telemetry-trace"},
        {{"run", "stream", "--device", "cpu", "--no-gpu-telemetry=garbage", "--out", "$OUT"}, "--no-gpu-telemetry"},
        {{"run", "stream", "--device", "cpu", "--quiet=garbage", "--out", "$OUT"}, "--quiet"},
        {{"results", "no-such-run", "--out", "$OUT"}, "no-such-run"},
        {{"results", "--out", "$OUT/missing"}, "$OUT/missing/runs"},
        {{"results", "--out", ""}, "--out"},
        {{"results", "--out", "$OUT", "--csv=garbage"}, "--csv"},
        {{"results", "--out", "$OUT", "--csv", "-o", "$OUT/missing/x.csv"}, "missing/x.csv"},
        {{"results", "--out", "$OUT", "--csv", "-o", "$OUT"}, "refusing to write"},
        {{"results", "--out", "$OUT", "--fields", ""}, "--fields"},
        {{"results", "--out", "$OUT", "--fields", ",,"}, "--fields"},
        {{"results", "--out", "$OUT", "--fields", "no.such.field"}, "--fields"},
        {{"report", "no-such-run", "--out", "$OUT", "--format", "md"}, "no-such-run"},
        {{"report", "$OUT/missing/points.jsonl", "--format", "md"}, "missing/points.jsonl"},
        {{"report", "$RUN", "--out", "$OUT", "--format", "garbage"}, "--format"},
        {{"report", "$RUN", "--out", "$OUT", "--format", "md", "-o", "$OUT/missing/r.md"}, "missing/r.md"},
        {{"report", "--out", "$OUT/missing", "--format", "md"}, "$OUT/missing/runs"},
        {{"report", "$RUN", "--out", "", "--format", "md"}, "--out"},
        {{"compare", "$RUN", "--out", "$OUT"}, "runs"},
        {{"compare", "$RUN", "no-such-run", "--out", "$OUT"}, "no-such-run"},
        {{"compare", "$RUN", "$RUN", "--out", "$OUT", "--format", "garbage"}, "--format"},
        {{"compare", "$RUN", "$RUN", "--out", "$OUT", "-o", "$OUT/missing/c.txt"}, "missing/c.txt"},
        {{"compare", "$RUN", "$RUN", "--out", "$OUT/missing"}, "$OUT/missing/runs"},
        {{"compare", "$RUN", "$RUN", "--out", ""}, "--out"},
        {{"import", "$OUT/missing.csv", "--system", "X", "--out", "$OUT"}, "missing.csv"},
        {{"import", "$OUT/figures.csv", "--system", "", "--out", "$OUT"}, "--system"},
        {{"import", "$OUT/figures.csv", "--system", "a\x01z", "--out", "$OUT"}, "--system"},
        {{"import", "$OUT/figures.csv", "--system", "X", "--out", "$OUT/figures.csv"}, "figures.csv/runs"},
        {{"import", "$OUT/figures.csv", "--system", "X", "--out", ""}, "--out"},
        {{"data", "make-imagefolder", "$OUT/missing-images-idx3-ubyte", "$OUT/x"}, "missing-images-idx3-ubyte"},
        {{"data", "make-imagefolder", "fashion-mnist:valid", "$OUT/x"}, "'valid'"},
        {{"data", "make-imagefolder", "", "$OUT/x"}, "source"},
        {{"data", "make-imagefolder", "fashion-mnist", ""}, "out"},
        {{"data", "make-imagefolder", "fashion-mnist", "$OUT/figures.csv/x"}, "figures.csv/x"},
        {{"data", "make-imagefolder", "$OUT/figures.csv", "$OUT/x", "--labels", ""}, "--labels"},
        {{"data", "make-imagefolder", "$OUT/figures.csv", "$OUT/x", "--labels", "$OUT/figures.csv"},
         "not an IDX file",
         1},
        {{"data", "make-imagefolder", "fashion-mnist", "$OUT/x", "--size", "0"}, "--size"},
        {{"data", "make-imagefolder", "fashion-mnist", "$OUT/x", "--size", "garbage"}, "--size"},
        {{"data", "make-imagefolder", "fashion-mnist", "$OUT/x", "--quality", "101"}, "--quality"},
        {{"data", "make-imagefolder", "fashion-mnist", "$OUT/x", "--limit", "-3"}, "--limit"},
        {{"inspect", ""}, "file"},
        {{"inspect", "$OUT/missing.onnx"}, "missing.onnx"},
        {{"inspect", "$OUT/figures.csv"}, "figures.csv"},
    };
    // The measurement settings and the monitor's: every number that is not finite, or out of range.
    const std::vector<std::pair<std::string, std::vector<std::string>>> settings{
        {"--min-time", {"nan", "inf", "-inf", "-1", "1e400", "garbage", ""}},
        {"--max-noise", {"nan", "inf", "-1", "0", "garbage"}},
        {"--timeout", {"nan", "inf", "-1", "0", "garbage"}},
        {"--warmup", {"nan", "inf", "-1", "garbage"}},
        {"--telemetry-period", {"nan", "inf", "-1", "0", "garbage"}}};
    for (const auto& [option, values] : settings)
      for (const auto& v : values)
        r.push_back({{"run", "stream", "--device", "cpu", option, v, "--out", "$OUT"}, option});
    for (const auto& v : {"nan", "inf", "-5", "0", "garbage"})
      r.push_back({{"monitor", "--interval", v}, "--interval"});
    for (const auto& v : {"nan", "inf", "-1", "garbage"}) r.push_back({{"monitor", "--duration", v}, "--duration"});
    return r;
  }();
  return rows;
}

std::string substitute(std::string s, const std::string& out, const std::string& run_id) {
  for (const auto& [key, value] : {std::pair<std::string, std::string>{"$OUT", out}, {"$RUN", run_id}})
    for (std::size_t at = s.find(key); at != std::string::npos; at = s.find(key, at + value.size()))
      s.replace(at, key.size(), value);
  return s;
}

// The subcommands `accelbench --help` lists.
std::set<std::string> listed_subcommands() {
  const Ran help = test::accelbench({"--help"});
  std::set<std::string> names;
  const std::regex line(R"(^  ([a-z]+) +\S)");
  std::smatch m;
  std::istringstream in(help.output);
  bool in_list = false;
  for (std::string l; std::getline(in, l);) {
    if (l.rfind("SUBCOMMANDS", 0) == 0 || l.rfind("Subcommands", 0) == 0) in_list = true;
    else if (in_list && std::regex_search(l, m, line)) names.insert(m[1]);
  }
  return names;
}

}  // namespace

TEST(CliBadValues, EverySubcommandRefusesBadValuesOfEveryOptionNamingIt) {
  TempDir dir;
  const std::string out = dir.path().string();
  const Ran made = test::accelbench({"run", "stream", "--device", "cpu", "--axis", "array_bytes=65536", "--axis",
                                     "op=copy", "--min-time", "0.01", "--max-noise", "50", "--out", out, "-q"});
  ASSERT_EQ(made.code, 0) << made.output;
  std::string run_id;
  for (const auto& e : fs::directory_iterator(dir.path() / "runs"))
    if (e.is_directory()) run_id = e.path().filename().string();
  dir.write("figures.csv", "workload,params,metric,value,unit,source\ngemm,m=64,tflops,1,TFLOP/s,datasheet\n");

  const std::set<std::string> listed = listed_subcommands();
  ASSERT_GE(listed.size(), 8u) << "the help lists the subcommands";
  std::set<std::string> covered;
  for (const auto& row : bad_values()) {
    std::vector<std::string> args;
    std::string shown;
    for (const auto& a : row.args) {
      args.push_back(substitute(a, out, run_id));
      shown += " " + test::quote(args.back());
    }
    covered.insert(args[0]);
    const Ran o = test::accelbench(args);
    EXPECT_EQ(o.code, row.code) << "accelbench" << shown << ":\n" << o.output;
    EXPECT_NE(o.output.find(substitute(row.names, out, run_id)), std::string::npos)
        << "accelbench" << shown << ": the message should name '" << row.names << "':\n"
        << o.output;
    EXPECT_EQ(o.output.find("terminate called"), std::string::npos) << "accelbench" << shown << ":\n" << o.output;
    EXPECT_EQ(o.output.find("what():"), std::string::npos) << "accelbench" << shown << ":\n" << o.output;
  }
  for (const auto& name : listed) EXPECT_TRUE(covered.contains(name)) << "no bad value tried for subcommand " << name;
  // Nothing refused may have left a run behind: only the first one is in the store.
  std::size_t run_folders = 0;
  for (const auto& e : fs::directory_iterator(dir.path() / "runs")) run_folders += e.is_directory();
  EXPECT_EQ(run_folders, 1u + 2u) << "the first run, and the two whose point refused its value (recorded invalid)";
}
