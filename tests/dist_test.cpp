// src/dist: launcher environments (OpenMPI, Slurm, PMI, torchrun) and their errors, and the example
// Slurm script (examples/slurm: valid bash, its commands plan); nccl-tests' bus-bandwidth factors
// and counts; agreement between ranks; lock-step measurement; the MPI bootstrap with two processes
// under mpirun (a probe program and accelbench itself); data parallelism's host averaging in a
// 16-bit wire type (two ranks in one process); the topology block; the collectives and p2p
// workloads (skipped on the CPU with their reasons; on GPUs, every op × dtype × in-place at a small
// size with zero wrong elements, graph mode, peer copies).
#include <gtest/gtest.h>

#include <sys/wait.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <map>
#include <optional>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "backend/collective_traits.h"
#include "backend/collectives.h"
#include "core/error.h"
#include "core/rng.h"
#include "dist/collective_math.h"
#include "dist/comm.h"
#include "dist/data_parallel/data_parallel.h"
#include "dist/launcher.h"
#include "dist/lockstep.h"
#include "harness/axes.h"
#include "harness/ranks.h"
#include "harness/runner.h"
#include "harness/workload.h"
#include "nn/cuda/device_kernels.h"
#include "system/topology.h"
#include "test_support.h"
#include "workloads/models/models.h"
#include "workloads/registry.h"

namespace ab::dist {
namespace {

using backend::CollectiveOp;
using Env = std::map<std::string, std::string>;

TEST(Launcher, NothingSetIsOneProcess) {
  const LaunchInfo li = parse_launcher_env({{"PATH", "/usr/bin"}});
  EXPECT_EQ(li.launcher, "none");
  EXPECT_EQ(li.rank, 0);
  EXPECT_EQ(li.world_size, 1);
  EXPECT_EQ(li.local_rank, 0);
  EXPECT_EQ(li.local_size, 1);
  EXPECT_EQ(device_for_rank(li, 1), 0);
}

TEST(Launcher, OpenMpi) {
  const LaunchInfo li = parse_launcher_env({{"OMPI_COMM_WORLD_RANK", "5"},
                                            {"OMPI_COMM_WORLD_SIZE", "8"},
                                            {"OMPI_COMM_WORLD_LOCAL_RANK", "1"},
                                            {"OMPI_COMM_WORLD_LOCAL_SIZE", "4"},
                                            {"SLURM_PROCID", "0"},  // mpirun inside an allocation: OpenMPI wins
                                            {"SLURM_NTASKS", "1"}});
  EXPECT_EQ(li.launcher, "openmpi");
  EXPECT_EQ(li.rank, 5);
  EXPECT_EQ(li.world_size, 8);
  EXPECT_EQ(li.local_rank, 1);
  EXPECT_EQ(li.local_size, 4);
  EXPECT_EQ(device_for_rank(li, 4), 1);
  EXPECT_EQ(device_for_rank(li, 1), 0);
}

TEST(Launcher, SlurmWithTasksPerNodeList) {
  Env env{{"SLURM_PROCID", "9"}, {"SLURM_STEP_NUM_TASKS", "11"}, {"SLURM_LOCALID", "1"},
          {"SLURM_NODEID", "2"}, {"SLURM_TASKS_PER_NODE", "4(x2),3"}};
  LaunchInfo li = parse_launcher_env(env);
  EXPECT_EQ(li.launcher, "slurm");
  EXPECT_EQ(li.rank, 9);
  EXPECT_EQ(li.world_size, 11);
  EXPECT_EQ(li.local_rank, 1);
  EXPECT_EQ(li.local_size, 3);
  env["SLURM_NODEID"] = "0";
  EXPECT_EQ(parse_launcher_env(env).local_size, 4);
  env.erase("SLURM_NODEID");  // uneven nodes and no node id: unknown
  EXPECT_EQ(parse_launcher_env(env).local_size, 0);
  env["SLURM_NTASKS_PER_NODE"] = "4";  // takes precedence
  EXPECT_EQ(parse_launcher_env(env).local_size, 4);
  EXPECT_EQ(parse_launcher_env({{"SLURM_PROCID", "3"}, {"SLURM_STEP_NUM_TASKS", "8"}, {"SLURM_LOCALID", "3"},
                                {"SLURM_TASKS_PER_NODE", "4(x2)"}})
                .local_size,
            4);
  // A step of 2 tasks inside a job of 8: the step's own size and layout count.
  li = parse_launcher_env({{"SLURM_PROCID", "1"}, {"SLURM_NTASKS", "8"}, {"SLURM_STEP_NUM_TASKS", "2"},
                           {"SLURM_LOCALID", "1"}, {"SLURM_NTASKS_PER_NODE", "8"}, {"SLURM_STEP_TASKS_PER_NODE", "2"}});
  EXPECT_EQ(li.world_size, 2);
  EXPECT_EQ(li.local_size, 2);
}

TEST(Launcher, SlurmBatchScriptIsOneProcess) {
  // sbatch's script sees the allocation's variables, but it is no srun step: one process.
  const LaunchInfo li = parse_launcher_env({{"SLURM_PROCID", "0"}, {"SLURM_NTASKS", "16"}, {"SLURM_LOCALID", "0"},
                                            {"SLURM_TASKS_PER_NODE", "8(x2)"}, {"SLURM_JOB_ID", "42"}});
  EXPECT_EQ(li.launcher, "none");
  EXPECT_EQ(li.world_size, 1);
}

TEST(Launcher, SlurmTwoNodeStepOfEightTasksPerNode) {
  // Rank 11 of the example's srun step (examples/slurm): 2 nodes x 8 tasks, 4th task of the second.
  const Env env{{"SLURM_PROCID", "11"},  {"SLURM_STEP_NUM_TASKS", "16"}, {"SLURM_LOCALID", "3"},
                {"SLURM_NODEID", "1"},   {"SLURM_STEP_TASKS_PER_NODE", "8(x2)"},
                {"SLURM_NTASKS", "16"},  {"SLURM_TASKS_PER_NODE", "8(x2)"}};
  const LaunchInfo li = parse_launcher_env(env);
  EXPECT_EQ(li.launcher, "slurm");
  EXPECT_EQ(li.rank, 11);
  EXPECT_EQ(li.world_size, 16);
  EXPECT_EQ(li.local_rank, 3);
  EXPECT_EQ(li.local_size, 8);
  EXPECT_EQ(device_for_rank(li, 8), 3);  // all 8 of the node's GPUs visible: the node's GPU 3
  EXPECT_EQ(device_for_rank(li, 1), 0);  // one GPU bound per task: that one
}

TEST(Launcher, Pmi) {
  LaunchInfo li = parse_launcher_env({{"PMI_RANK", "6"}, {"PMI_SIZE", "8"}, {"MPI_LOCALRANKID", "2"},
                                      {"MPI_LOCALNRANKS", "4"}});
  EXPECT_EQ(li.launcher, "pmi");
  EXPECT_EQ(li.rank, 6);
  EXPECT_EQ(li.world_size, 8);
  EXPECT_EQ(li.local_rank, 2);
  EXPECT_EQ(li.local_size, 4);
  li = parse_launcher_env({{"PMI_RANK", "3"}, {"PMI_SIZE", "4"}});  // no node-local variables: one node
  EXPECT_EQ(li.local_rank, 3);
  EXPECT_EQ(li.local_size, 4);
  EXPECT_EQ(device_for_rank(li, 2), 1);
}

TEST(Launcher, Torchrun) {
  const LaunchInfo li = parse_launcher_env({{"RANK", "3"}, {"WORLD_SIZE", "16"}, {"LOCAL_RANK", "3"},
                                            {"LOCAL_WORLD_SIZE", "8"}});
  EXPECT_EQ(li.launcher, "torchrun");
  EXPECT_EQ(li.rank, 3);
  EXPECT_EQ(li.world_size, 16);
  EXPECT_EQ(li.local_rank, 3);
  EXPECT_EQ(li.local_size, 8);
  EXPECT_EQ(parse_launcher_env({{"RANK", "0"}, {"WORLD_SIZE", "2"}, {"LOCAL_RANK", "0"}}).local_size, 0);
}

void expect_usage_error(const Env& env, const std::string& fragment) {
  try {
    parse_launcher_env(env);
    ADD_FAILURE() << "no error; expected one mentioning '" << fragment << "'";
  } catch (const UsageError& e) {
    EXPECT_NE(std::string(e.what()).find(fragment), std::string::npos) << e.what();
  }
}

TEST(Launcher, InconsistentValuesAreErrors) {
  expect_usage_error({{"OMPI_COMM_WORLD_RANK", "4"}, {"OMPI_COMM_WORLD_SIZE", "4"}, {"OMPI_COMM_WORLD_LOCAL_RANK", "0"}},
                     "rank 4 is outside a world of 4");
  expect_usage_error({{"OMPI_COMM_WORLD_RANK", "0"}, {"OMPI_COMM_WORLD_LOCAL_RANK", "0"}},
                     "OMPI_COMM_WORLD_RANK is set but OMPI_COMM_WORLD_SIZE is not");
  expect_usage_error({{"OMPI_COMM_WORLD_RANK", "one"}, {"OMPI_COMM_WORLD_SIZE", "2"}},
                     "OMPI_COMM_WORLD_RANK='one' is not an integer");
  expect_usage_error({{"SLURM_PROCID", "1"}, {"SLURM_STEP_NUM_TASKS", "4"}, {"SLURM_LOCALID", "2"},
                      {"SLURM_NTASKS_PER_NODE", "2"}},
                     "local rank 2 is outside a node of 2");
  expect_usage_error({{"SLURM_PROCID", "1"}, {"SLURM_STEP_NUM_TASKS", "4"}}, "SLURM_PROCID is set but SLURM_LOCALID is not");
  expect_usage_error({{"SLURM_PROCID", "0"}, {"SLURM_STEP_NUM_TASKS", "2"}, {"SLURM_LOCALID", "0"}, {"SLURM_NODEID", "3"},
                      {"SLURM_TASKS_PER_NODE", "1(x2)"}},
                     "SLURM_NODEID=3");
  expect_usage_error({{"SLURM_PROCID", "0"}, {"SLURM_STEP_NUM_TASKS", "2"}, {"SLURM_LOCALID", "0"},
                      {"SLURM_STEP_TASKS_PER_NODE", "2(x"}},
                     "SLURM_STEP_TASKS_PER_NODE='2(x' is malformed");
  expect_usage_error({{"PMI_RANK", "0"}, {"PMI_SIZE", "0"}}, "world size 0 is below 1");
  expect_usage_error({{"RANK", "1"}, {"WORLD_SIZE", "2"}, {"LOCAL_RANK", "0"}, {"LOCAL_WORLD_SIZE", "4"}},
                     "local size 4 is larger than the world size 2");
  expect_usage_error({{"RANK", "1"}, {"WORLD_SIZE", "4"}, {"LOCAL_RANK", "2"}}, "local rank 2 is larger than the rank 1");
  expect_usage_error({{"RANK", "-1"}, {"WORLD_SIZE", "4"}, {"LOCAL_RANK", "0"}}, "rank -1 is outside");
  EXPECT_THROW(device_for_rank(LaunchInfo{}, 0), Error);
}

TEST(Launcher, ProcessEnvironmentIsRead) {
  const Env env = process_environment();
  EXPECT_FALSE(env.empty());
}

using test::quote;
using test::Ran;

// The example sbatch script (examples/slurm/accelbench-multinode.sbatch): bash accepts it, every
// srun launches with --mpi=pmix (MPI refuses singletons otherwise), it turns NVLink SHARP off, and
// each accelbench command in it, the commented mpirun variant included, names only options `run`
// has and axes and values its workload plans on CUDA.
TEST(SlurmExample, ScriptIsValidBashAndItsCommandsPlan) {
  const std::string path = std::string(AB_SOURCE_DIR) + "/examples/slurm/accelbench-multinode.sbatch";
  ASSERT_EQ(std::system(("bash -n " + quote(path)).c_str()), 0) << path;
  std::ifstream in(path);
  ASSERT_TRUE(in) << path;
  std::vector<std::string> commands;  // continuation lines joined, leading '#' of the variant dropped
  std::string line, pending;
  bool exports_nvls = false;
  while (std::getline(in, line)) {
    if (line.find("export NCCL_NVLS_ENABLE=0") == 0) exports_nvls = true;
    const std::size_t first = line.find_first_not_of("# ");
    const std::string body = first == std::string::npos ? "" : line.substr(first);
    if (!pending.empty() || body.find("accelbench run ") != std::string::npos) {
      const bool continues = !body.empty() && body.back() == '\\';
      pending += continues ? body.substr(0, body.size() - 1) : body + " ";
      if (!continues) commands.push_back(std::exchange(pending, ""));
    }
    if (line.rfind("srun ", 0) == 0) {
      EXPECT_NE(line.find(" --mpi=pmix "), std::string::npos) << line;
    }
  }
  EXPECT_TRUE(exports_nvls);
  ASSERT_EQ(commands.size(), 3u);  // srun collectives, srun train, mpirun collectives

  const Ran help_run = test::accelbench({"run", "--help"});
  ASSERT_EQ(help_run.code, 0) << help_run.output;
  const std::string& help = help_run.output;
  const std::map<std::string, std::size_t> points{{"collectives", 31u * 7u * 2u},  // 8 B..8 GiB x ops x in_place
                                                  {"train", 3u}};                  // gpus=1,8,16
  std::map<std::string, int> seen;
  for (const std::string& cmd : commands) {
    std::vector<std::string> words;
    for (std::size_t at = cmd.find("accelbench run "); at < cmd.size();) {
      const std::size_t end = std::min(cmd.find(' ', at), cmd.size());
      if (end > at) words.push_back(cmd.substr(at, end - at));
      at = end + 1;
    }
    ASSERT_GE(words.size(), 3u) << cmd;
    const std::string& workload = words[2];
    std::vector<harness::AxisOverride> overrides;
    for (std::size_t i = 3; i < words.size(); ++i) {
      if (words[i].rfind("--", 0) != 0) continue;
      EXPECT_NE(help.find("  " + words[i] + " "), std::string::npos) << "`run` has no option " << words[i];
      if (words[i] == "--axis" && i + 1 < words.size()) overrides.push_back(harness::parse_axis_argument(words[++i]));
    }
    ASSERT_TRUE(points.count(workload) != 0) << cmd;
    std::vector<harness::PlanEntry> plan;
    EXPECT_NO_THROW(plan = harness::plan_for(workloads::find_workload(workload), "cuda", overrides)) << cmd;
    EXPECT_EQ(plan.size(), points.at(workload)) << cmd;
    ++seen[workload];
  }
  EXPECT_EQ(seen["collectives"], 2);
  EXPECT_EQ(seen["train"], 1);
}

TEST(CollectiveMath, BusFactors) {
  // n = 1, 2, 4, 8 by hand: 2(n-1)/n = 0, 1, 1.5, 1.75; (n-1)/n = 0, 0.5, 0.75, 0.875.
  const std::vector<int> ns{1, 2, 4, 8};
  const std::vector<double> all_reduce{0, 1, 1.5, 1.75}, per_chunk{0, 0.5, 0.75, 0.875};
  for (std::size_t i = 0; i < ns.size(); ++i) {
    EXPECT_DOUBLE_EQ(bus_factor(CollectiveOp::all_reduce, ns[i]), all_reduce[i]);
    EXPECT_DOUBLE_EQ(bus_factor(CollectiveOp::all_gather, ns[i]), per_chunk[i]);
    EXPECT_DOUBLE_EQ(bus_factor(CollectiveOp::reduce_scatter, ns[i]), per_chunk[i]);
    EXPECT_DOUBLE_EQ(bus_factor(CollectiveOp::all_to_all, ns[i]), per_chunk[i]);
    EXPECT_DOUBLE_EQ(bus_factor(CollectiveOp::broadcast, ns[i]), 1.0);
    EXPECT_DOUBLE_EQ(bus_factor(CollectiveOp::reduce, ns[i]), 1.0);
    EXPECT_DOUBLE_EQ(bus_factor(CollectiveOp::send_recv, ns[i]), 1.0);
  }
  EXPECT_THROW(bus_factor(CollectiveOp::all_reduce, 0), UsageError);
}

TEST(CollectiveMath, CountsAndBuffers) {
  // 1000 bytes of f32 = 250 elements; split ops round down to a multiple of n.
  EXPECT_EQ(collective_count(CollectiveOp::all_reduce, 1000, 4, 8), 250);
  EXPECT_EQ(collective_count(CollectiveOp::broadcast, 1002, 4, 8), 250);
  EXPECT_EQ(collective_count(CollectiveOp::all_gather, 1000, 4, 1), 250);
  EXPECT_EQ(collective_count(CollectiveOp::all_gather, 1000, 4, 2), 250);
  EXPECT_EQ(collective_count(CollectiveOp::reduce_scatter, 1000, 4, 4), 248);
  EXPECT_EQ(collective_count(CollectiveOp::all_to_all, 1000, 4, 8), 248);
  EXPECT_EQ(collective_count(CollectiveOp::all_to_all, 8, 2, 8), 0);  // 4 elements for 8 ranks
  EXPECT_EQ(collective_count(CollectiveOp::send_recv, 3, 4, 2), 0);

  // Per-rank buffers for count 64 over n ranks.
  for (int n : {1, 2, 4, 8}) {
    const auto ag = collective_buffers(CollectiveOp::all_gather, 64, n);
    EXPECT_EQ(ag.send, 64 / n);
    EXPECT_EQ(ag.recv, 64);
    const auto rs = collective_buffers(CollectiveOp::reduce_scatter, 64, n);
    EXPECT_EQ(rs.send, 64);
    EXPECT_EQ(rs.recv, 64 / n);
    for (auto op : {CollectiveOp::all_reduce, CollectiveOp::broadcast, CollectiveOp::reduce, CollectiveOp::all_to_all,
                    CollectiveOp::send_recv}) {
      const auto b = collective_buffers(op, 64, n);
      EXPECT_EQ(b.send, 64);
      EXPECT_EQ(b.recv, 64);
    }
  }
  EXPECT_THROW(collective_buffers(CollectiveOp::all_gather, 10, 4), UsageError);
}

// The NCCL calls one rank's run() makes, as "name count peer send+offset recv+offset" lines (offsets
// in elements from the buffers' starts).
class RecordedCalls final : public backend::CollectiveCalls {
 public:
  RecordedCalls(const char* send, const char* recv, std::int64_t element_bytes)
      : send_(send), recv_(recv), es_(element_bytes) {}
  void all_reduce(const void* s, void* r, std::int64_t n) override { add("all_reduce", n, -1, s, r); }
  void all_gather(const void* s, void* r, std::int64_t n) override { add("all_gather", n, -1, s, r); }
  void reduce_scatter(const void* s, void* r, std::int64_t n) override { add("reduce_scatter", n, -1, s, r); }
  void broadcast(const void* s, void* r, std::int64_t n, int root) override { add("broadcast", n, root, s, r); }
  void reduce(const void* s, void* r, std::int64_t n, int root) override { add("reduce", n, root, s, r); }
  void send(const void* d, std::int64_t n, int peer) override { add("send", n, peer, d, nullptr); }
  void recv(void* d, std::int64_t n, int peer) override { add("recv", n, peer, nullptr, d); }
  std::vector<std::string> lines;

 private:
  void add(const char* name, std::int64_t n, int peer, const void* s, const void* r) {
    const auto at = [&](const void* p, const char* base) {
      return p == nullptr ? std::string("-") : std::to_string((static_cast<const char*>(p) - base) / es_);
    };
    lines.push_back(std::string(name) + " " + std::to_string(n) + " " + std::to_string(peer) + " " + at(s, send_) +
                    " " + at(r, recv_));
  }
  const char* send_;
  const char* recv_;
  std::int64_t es_;
};

TEST(CollectiveTraits, EachRunMakesItsNcclCallsOnRankOneOfFour) {
  std::vector<char> send(64 * 4), recv(64 * 4);
  const auto calls_of = [&](CollectiveOp op) {
    const backend::CollectiveTraits& t = backend::collective_traits(op);
    EXPECT_EQ(t.op, op);
    backend::RankCall call;
    call.send = send.data();
    call.recv = recv.data();
    call.element_bytes = 4;
    call.count = 64;
    call.lengths = t.buffers(64, 4);
    call.rank = 1;
    call.ranks = 4;
    RecordedCalls calls(send.data(), recv.data(), 4);
    t.run(calls, call);
    return calls.lines;
  };
  using Lines = std::vector<std::string>;
  EXPECT_EQ(calls_of(CollectiveOp::all_reduce), (Lines{"all_reduce 64 -1 0 0"}));
  EXPECT_EQ(calls_of(CollectiveOp::all_gather), (Lines{"all_gather 16 -1 0 0"}));
  EXPECT_EQ(calls_of(CollectiveOp::reduce_scatter), (Lines{"reduce_scatter 16 -1 0 0"}));
  EXPECT_EQ(calls_of(CollectiveOp::broadcast), (Lines{"broadcast 64 0 0 0"}));
  EXPECT_EQ(calls_of(CollectiveOp::reduce), (Lines{"reduce 64 0 0 0"}));
  EXPECT_EQ(calls_of(CollectiveOp::all_to_all),
            (Lines{"send 16 0 0 -", "recv 16 0 - 0", "send 16 1 16 -", "recv 16 1 - 16", "send 16 2 32 -",
                   "recv 16 2 - 32", "send 16 3 48 -", "recv 16 3 - 48"}));
  EXPECT_EQ(calls_of(CollectiveOp::send_recv), (Lines{"send 64 2 0 -", "recv 64 0 - 0"}));
}

TEST(CollectiveTraits, InPlaceOffsetsAndExpectedValues) {
  // In place on 4 ranks with count 64: all_gather's input is the rank's chunk of the output,
  // reduce_scatter's output the rank's chunk of the input; the others share the buffer's start.
  const backend::CollectiveBuffers ag = backend::collective_traits(CollectiveOp::all_gather).buffers(64, 4);
  EXPECT_EQ(backend::collective_traits(CollectiveOp::all_gather).in_place_send_offset(3, ag), 48);
  EXPECT_EQ(backend::collective_traits(CollectiveOp::all_gather).in_place_recv_offset(3, ag), 0);
  const backend::CollectiveBuffers rs = backend::collective_traits(CollectiveOp::reduce_scatter).buffers(64, 4);
  EXPECT_EQ(backend::collective_traits(CollectiveOp::reduce_scatter).in_place_send_offset(3, rs), 0);
  EXPECT_EQ(backend::collective_traits(CollectiveOp::reduce_scatter).in_place_recv_offset(3, rs), 48);
  EXPECT_EQ(backend::collective_traits(CollectiveOp::all_reduce).in_place_send_offset(3, {64, 64}), 0);

  // Two ranks: inputs 1 + (rank + i) % 4, so rank 0 holds 1 2 3 4 ..., rank 1 holds 2 3 4 1 ...
  EXPECT_EQ(backend::collective_input_value(0, 0), 1.0);
  EXPECT_EQ(backend::collective_input_value(1, 3), 1.0);
  backend::CheckInputs in;
  in.count = 8;
  in.ranks = 2;
  for (std::int64_t j = 0; j < 4; ++j)
    in.rank_sums[static_cast<std::size_t>(j)] =
        backend::collective_input_value(0, j) + backend::collective_input_value(1, j);
  const auto expected = [&](CollectiveOp op, int rank, std::int64_t i) {
    in.lengths = backend::collective_traits(op).buffers(8, 2);
    return backend::collective_traits(op).expected(in, rank, i);
  };
  EXPECT_EQ(expected(CollectiveOp::all_reduce, 1, 5), 2.0 + 3.0);      // element 5 of ranks 0 and 1
  EXPECT_EQ(expected(CollectiveOp::all_gather, 0, 5), 3.0);            // rank 1's element 1
  EXPECT_EQ(expected(CollectiveOp::reduce_scatter, 1, 0), 1.0 + 2.0);  // element 4 of ranks 0 and 1
  EXPECT_EQ(expected(CollectiveOp::broadcast, 1, 2), 3.0);             // rank 0's element 2
  EXPECT_EQ(expected(CollectiveOp::all_to_all, 0, 5), 3.0);            // rank 1's chunk for rank 0, element 1
  EXPECT_EQ(expected(CollectiveOp::send_recv, 0, 1), 3.0);             // from rank 1: its element 1
  EXPECT_TRUE(backend::collective_traits(CollectiveOp::reduce).root_output_only);
  EXPECT_FALSE(backend::collective_traits(CollectiveOp::all_reduce).root_output_only);
}

TEST(CollectiveNames, ParseAndList) {
  EXPECT_EQ(backend::collective_op_names().size(), 7u);
  for (const auto& name : backend::collective_op_names())
    EXPECT_EQ(backend::collective_op_name(backend::parse_collective_op(name)), name);
  try {
    backend::parse_collective_op("allreduce");
    ADD_FAILURE() << "no error";
  } catch (const UsageError& e) {
    EXPECT_NE(std::string(e.what()).find("valid: all_reduce, all_gather"), std::string::npos) << e.what();
  }
  EXPECT_FALSE(backend::collective_has_in_place(CollectiveOp::all_to_all));
  EXPECT_FALSE(backend::collective_has_in_place(CollectiveOp::send_recv));
  EXPECT_TRUE(backend::collective_has_in_place(CollectiveOp::all_reduce));
}

measure::Settings fast_settings() {
  measure::Settings s;
  s.min_time_s = 0.01;
  s.warmup_s = 0;
  s.timeout_s = 5;
  s.max_noise_pct = 50;
  s.target_sample_s = 1e-3;
  return s;
}

std::vector<nlohmann::json> run_collectives(backend::Backend& be, const std::string& kind,
                                            const std::vector<harness::AxisOverride>& overrides) {
  std::vector<nlohmann::json> records;
  harness::RunnerHooks hooks;
  hooks.sink = [&records](const nlohmann::json& r) { records.push_back(r); };
  harness::Runner runner(be, fast_settings(), nlohmann::json::object(), "run-dist", hooks, nullptr);
  const std::atomic<bool> cancel{false};
  runner.run(harness::plan_for(workloads::find_workload("collectives"), kind, overrides), cancel);
  return records;
}

TEST(CollectivesWorkload, CpuPointsAreSkippedWithTheReason) {
  auto be = backend::make_backend("cpu");
  const auto records = run_collectives(*be, "cpu", {{{"bytes"}, "1024"}});
  ASSERT_EQ(records.size(), 7u * 2u);  // 7 ops × in_place 0,1; one dtype, one size, gpus=1
  for (const auto& r : records) {
    EXPECT_EQ(r.at("status"), "skipped") << r.dump();
    EXPECT_NE(r.value("reason", "").find("NCCL on CUDA devices; cpu is not one"), std::string::npos) << r.dump();
  }
  EXPECT_THROW(backend::make_collective_group(*be, 1), Unsupported);
}

TEST(CollectivesWorkload, GpusBeyondVisibleAreSkipped) {
  if (backend::collective_device_count() == 0) GTEST_SKIP() << "no CUDA device: driver or GPU absent";
  auto be = backend::make_backend("cuda:0");
  const int too_many = backend::collective_device_count() + 1;
  const auto records =
      run_collectives(*be, "cuda", {{{"op"}, "all_reduce"}, {{"bytes"}, "1024"}, {{"in_place"}, "0"},
                                    {{"gpus"}, std::to_string(too_many)}});
  ASSERT_EQ(records.size(), 1u);
  EXPECT_EQ(records[0].at("status"), "skipped");
  EXPECT_NE(records[0].value("reason", "").find("visible"), std::string::npos) << records[0].dump();
}

// Every op × dtype × in-place on all visible GPUs, at sizes that split evenly and unevenly.
TEST(CollectivesGpu, EveryOpDtypeAndInPlaceIsExact) {
  const int gpus = backend::collective_device_count();
  if (gpus == 0) GTEST_SKIP() << "no CUDA device: driver or GPU absent";
  auto be = backend::make_backend("cuda:0");
  auto group = backend::make_collective_group(*be, gpus);
  ASSERT_EQ(group->size(), gpus);
  EXPECT_EQ(group->forced_settings().at("NCCL_NVLS_ENABLE"), "0");
  for (const auto& op_name : backend::collective_op_names()) {
    const auto op = backend::parse_collective_op(op_name);
    for (const auto& dt : backend::collective_dtype_names()) {
      const DType dtype = parse_dtype(dt);
      for (bool in_place : {false, true}) {
        if (in_place && !backend::collective_has_in_place(op)) continue;
        for (std::int64_t bytes : {std::int64_t{4096}, std::int64_t{1} << 20}) {
          const std::int64_t count = collective_count(op, bytes, static_cast<std::int64_t>(size_bytes(dtype)), gpus);
          auto plan = group->make_plan({op, dtype, count, in_place});
          EXPECT_EQ(plan->check(), 0) << op_name << " " << dt << " in_place=" << in_place << " bytes=" << bytes;
          plan->run();
          const auto t = plan->per_rank_seconds(3);
          ASSERT_EQ(t.size(), static_cast<std::size_t>(gpus));
          for (double s : t) EXPECT_GT(s, 0.0);
        }
      }
    }
  }
}

TEST(CollectivesGpu, WorkloadRecordsBusBandwidth) {
  if (backend::collective_device_count() == 0) GTEST_SKIP() << "no CUDA device: driver or GPU absent";
  auto be = backend::make_backend("cuda:0");
  const auto records = run_collectives(*be, "cuda", {{{"op"}, "all_reduce,all_gather"}, {{"bytes"}, "1048576"}});
  ASSERT_FALSE(records.empty());
  for (const auto& r : records) {
    ASSERT_EQ(r.at("status"), "ok") << r.dump();
    EXPECT_TRUE(r.at("check").at("passed").get<bool>());
    EXPECT_EQ(r.at("metrics").at("env_NCCL_NVLS_ENABLE"), "0");
    EXPECT_GT(r.at("metrics").at("algbw_gbps").get<double>(), 0.0);
    EXPECT_GE(r.at("metrics").at("busbw_gbps").get<double>(), 0.0);  // 0 for one GPU: factor 2(n-1)/n
    EXPECT_GT(r.at("metrics").at("rank_time_s").at("max").get<double>(), 0.0);
  }
}


// A world seen from one rank: allgather answers with the other ranks' scripted bytes around ours.
class ScriptedComm final : public Comm {
 public:
  ScriptedComm(int rank, std::vector<Bytes> others) : rank_(rank), others_(std::move(others)) {}
  int rank() const override { return rank_; }
  int size() const override { return static_cast<int>(others_.size()) + 1; }
  void barrier() override {}
  void broadcast(Bytes&, int) override { ADD_FAILURE() << "no broadcast expected"; }
  std::vector<Bytes> allgather(const Bytes& data) override {
    std::vector<Bytes> all = others_;
    all.insert(all.begin() + rank_, data);
    return all;
  }

 private:
  int rank_;
  std::vector<Bytes> others_;
};

Bytes outcome_bytes(int code, const std::string& message) {
  return Packer().put(static_cast<std::int64_t>(code)).put(message).bytes();
}

TEST(Agreement, FirstFailingRankIsNamedAndCommonFailuresAreNot) {
  // Rank 0 succeeded; rank 2 failed (OOM, say): rank 0 must fail too, naming rank 2.
  ScriptedComm c0(0, {outcome_bytes(0, ""), outcome_bytes(3, "out of memory on cuda:2")});
  Outcome o = agree(c0, {});
  EXPECT_EQ(o.code, 3);
  EXPECT_EQ(o.message, "rank 2: out of memory on cuda:2");
  // Ranks 1 and 2 both failed: the lowest rank's failure is the one every rank reports.
  ScriptedComm c2(2, {outcome_bytes(0, ""), outcome_bytes(5, "bad axis")});
  o = agree(c2, {4, "no device"});
  EXPECT_EQ(o.code, 5);
  EXPECT_EQ(o.message, "rank 1: bad axis");
  // All alike (a skip for the same reason on every rank): no rank named.
  ScriptedComm c1(1, {outcome_bytes(1, "cpu is not one"), outcome_bytes(1, "cpu is not one")});
  o = agree(c1, {1, "cpu is not one"});
  EXPECT_EQ(o.code, 1);
  EXPECT_EQ(o.message, "cpu is not one");
  ScriptedComm ok(1, {outcome_bytes(0, "")});
  EXPECT_EQ(agree(ok, {}).code, 0);
  // A world of one returns its own outcome.
  EXPECT_EQ(agree(world(), {7, "x"}).message, "x");
}

TEST(Agreement, SumsMaximaAndSameness) {
  ScriptedComm c(1, {Packer().put(std::int64_t{40}).bytes(), Packer().put(std::int64_t{-3}).bytes()});
  EXPECT_EQ(sum_over_ranks(c, 5), 42);
  ScriptedComm m(0, {Packer().put(2.5).bytes()});
  EXPECT_DOUBLE_EQ(max_over_ranks(m, 1.5), 2.5);
  EXPECT_DOUBLE_EQ(max_over_ranks(m, 3.5), 3.5);
  EXPECT_TRUE(same_on_all_ranks(world(), "anything"));
}

TEST(Agreement, PackerRoundTripsAndRejectsShortMessages) {
  const std::uint64_t seed = test::seed();
  const double d = uniform(seed, 0, -1e9, 1e9);
  const auto i = static_cast<std::int64_t>(mix64(seed, 1) >> 2);
  const std::string text = "rank " + std::to_string(mix64(seed, 2));
  const Bytes b = Packer().put(d).put(i).put(text).put(std::string()).bytes();
  Unpacker in(b);
  EXPECT_EQ(in.get_double(), d);
  EXPECT_EQ(in.get_int(), i);
  EXPECT_EQ(in.get_string(), text);
  EXPECT_EQ(in.get_string(), "");
  EXPECT_THROW(in.get_int(), Error);
  const Bytes cut(b.begin(), b.begin() + 20);  // the string's length promises more than is there
  Unpacker short_in(cut);
  short_in.get_double();
  short_in.get_int();
  EXPECT_THROW(short_in.get_string(), Error);
}

// --- Data parallelism's host averaging with a 16-bit wire type, two ranks in one process ---

// One rank of a world of two whose allgather answers with this rank's block and the other rank's
// block of the same call, as that rank sent it in an earlier run (each rank's message depends on
// its own gradients only, so two runs one after the other stand in for two ranks at once). With
// nothing recorded, the other rank's block is a copy of this one's (a run that only records).
class ReplayComm final : public Comm {
 public:
  ReplayComm(int rank, std::vector<Bytes> other) : rank_(rank), other_(std::move(other)) {}
  int rank() const override { return rank_; }
  int size() const override { return 2; }
  void barrier() override {}
  void broadcast(Bytes&, int) override { ADD_FAILURE() << "no broadcast expected"; }
  std::vector<Bytes> allgather(const Bytes& data) override {
    const Bytes theirs = sent.size() < other_.size() ? other_[sent.size()] : data;
    sent.push_back(data);
    return rank_ == 0 ? std::vector<Bytes>{data, theirs} : std::vector<Bytes>{theirs, data};
  }
  std::vector<Bytes> sent;

 private:
  int rank_;
  std::vector<Bytes> other_;
};

// The value of `wire` (bf16 or f16) nearest to v, ties to the even significand: the nearest of the
// neighbours of float's own rounding, compared in double (exact here), so it does not lean on the
// rounding the code under test uses.
double nearest_in_wire(double v, DType wire) {
  const auto to_bits = [wire](float f) { return wire == DType::bf16 ? float_to_bf16_bits(f) : float_to_half_bits(f); };
  const auto value = [wire](std::uint16_t b) {
    return static_cast<double>(wire == DType::bf16 ? bf16_bits_to_float(b) : half_bits_to_float(b));
  };
  const std::uint16_t guess = to_bits(static_cast<float>(v));
  std::uint16_t best = guess;
  for (const int step : {-1, 1}) {
    // The neighbours in magnitude of the same sign (gradients are far from the infinities).
    const auto b = static_cast<std::uint16_t>(guess + step);
    if (((b ^ guess) & 0x8000) != 0) continue;
    const double d = std::fabs(value(b) - v), dbest = std::fabs(value(best) - v);
    if (d < dbest || (d == dbest && (b & 1) == 0)) best = b;
  }
  return value(best);
}

// What every rank computes: rank 0's and rank 1's gradients averaged by the launch's host
// exchange, in the gradients' own f32 or rounded through bf16 / f16 (PyTorch DDP's compress hooks).
TEST(DataParallel, HostAveragingInA16BitWireTypeRoundsEachRankAndTheMean) {
  auto be = backend::make_backend("cpu");
  const std::uint64_t seed = test::seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  workloads::zoo::ModelSpec spec;
  spec.model = "tiny_resnet";
  spec.batch = 2;
  spec.image_px = 8;
  nn::GraphOptions options = workloads::zoo::graph_options(spec);
  options.seed = seed;
  options.deterministic = true;
  struct Rank {
    std::unique_ptr<nn::Kernels> kernels;
    std::unique_ptr<nn::Graph> graph;
    std::vector<std::vector<double>> own;  // each parameter's gradient before averaging
  };
  std::vector<Rank> ranks(2);
  const auto gradients = [](nn::Graph& g) {
    std::vector<std::vector<double>> out;
    for (const nn::Parameter& p : g.parameters())
      if (p.grad.defined()) out.push_back(read_host(p.grad));
    return out;
  };
  for (int r = 0; r < 2; ++r) {
    nn::GraphBuilder b(options);
    const workloads::zoo::ZooModel m = workloads::zoo::build_zoo_model(b, spec);
    Rank& rank = ranks[static_cast<std::size_t>(r)];
    rank.kernels = nn::make_device_kernels(*be);
    rank.graph = std::make_unique<nn::Graph>(std::move(b));
    rank.graph->bind(*rank.kernels);
    // Each rank its own fresh samples, as data parallelism has.
    const auto data = workloads::zoo::synthetic_batch(mix64(seed, 1), static_cast<std::uint64_t>(2 * r), 2,
                                                      m.in_channels, spec.image_px, m.classes);
    rank.graph->set_input(m.images, data.images);
    rank.graph->set_input(m.labels, data.labels);
    rank.graph->forward();
    rank.graph->backward();
    rank.own = gradients(*rank.graph);
  }
  // Not a comparison of zeros or of equal blocks: the ranks' gradients are non-zero and differ.
  std::size_t nonzero = 0, differ = 0, elements = 0;
  for (std::size_t p = 0; p < ranks[0].own.size(); ++p)
    for (std::size_t i = 0; i < ranks[0].own[p].size(); ++i) {
      ++elements;
      nonzero += ranks[0].own[p][i] != 0 ? 1 : 0;
      differ += ranks[0].own[p][i] != ranks[1].own[p][i] ? 1 : 0;
    }
  ASSERT_GT(nonzero, elements / 2);
  ASSERT_GT(differ, elements / 2);

  // Every rank's gradients averaged with `wire` (nullopt: f32) in buckets of 4 KiB: rank 0's result,
  // after checking that rank 1 got the same bits.
  const auto averaged = [&](std::optional<DType> wire) {
    // Rank r's backward with the sync attached; its messages, and its gradients in `out`.
    const auto run = [&](int r, std::vector<Bytes> other, std::vector<std::vector<double>>& out) {
      ReplayComm comm(r, std::move(other));
      Rank& rank = ranks[static_cast<std::size_t>(r)];
      DataParallelConfig config;
      config.gpus = 2;
      config.bucket_bytes = 4096;
      config.wire_dtype = wire;
      DataParallel dp(*be, comm, config);
      dp.attach(*rank.graph, *rank.kernels);
      EXPECT_GT(dp.bucket_count(), 2u);
      EXPECT_EQ(dp.wire_dtype(), wire.value_or(DType::f32));
      rank.graph->forward();
      rank.graph->backward();
      rank.graph->set_gradient_sync(nullptr);
      out = gradients(*rank.graph);
      return comm.sent;
    };
    std::vector<std::vector<double>> got0, got1;
    const std::vector<Bytes> sent1 = run(1, {}, got1);  // rank 1 alone: only its messages count
    const std::vector<Bytes> sent0 = run(0, sent1, got0);
    run(1, sent0, got1);
    EXPECT_EQ(got1, got0) << "both ranks end with the same bits";
    return got0;
  };
  const auto f32 = averaged(std::nullopt);
  for (const DType wire : {DType::bf16, DType::f16}) {
    SCOPED_TRACE(std::string(to_string(wire)));
    const auto narrow = averaged(wire);
    ASSERT_EQ(narrow.size(), ranks[0].own.size());
    std::size_t changed = 0;
    for (std::size_t p = 0; p < narrow.size(); ++p)
      for (std::size_t i = 0; i < narrow[p].size(); ++i) {
        const double a = ranks[0].own[p][i], c = ranks[1].own[p][i];
        double sum = 0;  // the f32 path: the float64 mean of the ranks in rank order, stored as f32
        sum += a;
        sum += c;
        ASSERT_EQ(f32[p][i], static_cast<double>(static_cast<float>(sum / 2))) << "parameter " << p << " element " << i;
        const double want = nearest_in_wire((nearest_in_wire(a, wire) + nearest_in_wire(c, wire)) / 2, wire);
        ASSERT_EQ(narrow[p][i], want) << "parameter " << p << " element " << i << ": " << a << ", " << c;
        changed += narrow[p][i] != f32[p][i] ? 1 : 0;
      }
    // Rounded to 8 (bf16) or 11 (f16) significant bits: most averages move.
    EXPECT_GT(changed, elements / 2);
  }

  // Only f32 gradients are cast: f64 ones (the reference kernels' gradient checks) are refused.
  nn::GraphOptions f64 = options;
  f64.dtype = DType::f64;
  nn::GraphBuilder b(f64);
  workloads::zoo::build_zoo_model(b, spec);
  auto kernels = nn::make_device_kernels(*be);
  nn::Graph g(std::move(b));
  g.bind(*kernels);
  ReplayComm comm(0, {});
  DataParallelConfig config;
  config.gpus = 2;
  config.bucket_bytes = 4096;
  config.wire_dtype = DType::bf16;
  DataParallel dp(*be, comm, config);
  const std::string msg = test::usage_error([&] { dp.attach(g, *kernels); });
  EXPECT_NE(msg.find("casts f32 gradients; these are f64"), std::string::npos) << msg;
}

TEST(Lockstep, WorldOfOneMeasuresLikeTheHarness) {
  measure::SteadyClockTimer timer;
  measure::Settings s;
  s.min_time_s = 0.02;
  s.warmup_s = 0.005;
  s.max_noise_pct = 50;
  s.target_sample_s = 1e-3;
  volatile double sink = 0;
  const double x = uniform(test::seed(), 0, 1, 2);
  const LockstepResult r = measure_lockstep(world(), timer, [&] {
    for (int i = 0; i < 20000; ++i) sink = sink + x * i;
  }, s, nullptr);
  ASSERT_GE(r.result.iteration_s.size(), s.min_samples);
  EXPECT_GT(r.result.summary.median, 0.0);
  EXPECT_GE(r.result.measured_s, s.min_time_s);
  ASSERT_EQ(r.ranks.size(), 1u);
  EXPECT_DOUBLE_EQ(r.ranks[0].median_s, r.result.summary.median);  // one rank: its own times are the samples
}

TEST(Lockstep, AFailedBatchIsRethrownAsTheSameKind) {
  measure::SteadyClockTimer timer;
  measure::Settings s;
  s.min_time_s = 0.01;
  s.max_noise_pct = 50;
  EXPECT_THROW(measure_lockstep(world(), timer, [] { throw OutOfMemory("device full"); }, s, nullptr), OutOfMemory);
  EXPECT_THROW(measure_lockstep(world(), timer, [] { throw SkipPoint("not here"); }, s, nullptr), SkipPoint);
  EXPECT_EQ(test::error_message<CheckFailed>(
                [&] { measure_lockstep(world(), timer, [] { throw CheckFailed("wrong sum"); }, s, nullptr); }),
            "wrong sum");
  EXPECT_EQ(test::error_message<Error>(
                [&] { measure_lockstep(world(), timer, [] { throw std::runtime_error("other"); }, s, nullptr); }),
            "other");
}

TEST(Ranks, AFailureOnAnotherRankIsRethrownHereAsItsOwnKind) {
  for (const ErrorKind kind : {ErrorKind::error, ErrorKind::usage, ErrorKind::out_of_memory, ErrorKind::unsupported,
                               ErrorKind::skip_point, ErrorKind::check_failed, ErrorKind::diverged}) {
    // Rank 1's outcome as dist::agree receives it; this rank (0) succeeded.
    ReplayComm comm(0, {Packer().put(static_cast<std::int64_t>(kind)).put(std::string("no GPU here")).bytes()});
    try {
      harness::on_all_ranks(comm, [] {});
      ADD_FAILURE() << "rank 1 failed, so every rank must throw";
    } catch (const Error& e) {
      EXPECT_EQ(error_kind(e), kind) << static_cast<int>(kind);
      EXPECT_EQ(std::string(e.what()), "rank 1: no GPU here");
    }
  }
  // This rank's own failure, the other rank's alike: the kind and the message are kept as they are.
  ReplayComm comm(0, {Packer().put(static_cast<std::int64_t>(ErrorKind::diverged)).put(std::string("loss is nan")).bytes()});
  EXPECT_EQ(test::error_message<Diverged>([&] { harness::on_all_ranks(comm, [] { throw Diverged("loss is nan"); }); }),
            "loss is nan");
}

TEST(Session, OneProcessNeedsNoMpiAndSeveralNeedALauncherThatBootstrapsIt) {
  const Session one(LaunchInfo{});
  EXPECT_EQ(world().size(), 1);
  EXPECT_EQ(launch_info().launcher, "none");
  LaunchInfo torchrun;
  torchrun.launcher = "torchrun";
  torchrun.world_size = 2;
  EXPECT_NE(test::error_message<Unsupported>([&] { Session s(torchrun); }).find("mpirun or srun --mpi=pmix"),
            std::string::npos);
}

// --- Two processes under mpirun (OpenMPI from Debian on the CI machine; no GPU involved) ---

// mpirun with the settings CI needs: root is allowed, two ranks may share two cores, messages stay
// in shared memory. `timeout` turns a deadlock into a failure instead of a hung test. In the
// sanitize build the children skip LeakSanitizer: OpenMPI leaves its own allocations (in plugins
// it has unloaded) at MPI_Finalize; our code's leaks are checked by every in-process test.
test::Ran mpirun(const std::string& args, bool with_stderr = true) {
  const std::string cmd = "ASAN_OPTIONS=${ASAN_OPTIONS:+$ASAN_OPTIONS:}detect_leaks=0 "
                          "OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_btl=self,vader "
                          "OMPI_MCA_btl_vader_single_copy_mechanism=none OMPI_MCA_rmaps_base_oversubscribe=1 "
                          "timeout -k 5 120 mpirun " + args + (with_stderr ? " 2>&1" : " 2>/dev/null");
  return test::shell(cmd);
}

// These tests check what a run records, not how fast: a point stops after its minimum time whatever
// its spread (on a loaded two-core CI machine the 1% noise rule held points for their full 60 s
// and the launch hit the 120 s limit above).
constexpr const char* kQuickPoints = " --min-time 0.05 --max-noise 100 --timeout 20";

bool have_mpirun() { return std::system("command -v mpirun >/dev/null 2>&1") == 0; }

#define SKIP_WITHOUT_MPI()                                                                                    \
  if (!mpi_built()) AB_SKIP_OR_REQUIRE("mpi", "this build has no MPI (libopenmpi-dev missing at configure time)"); \
  if (!have_mpirun()) AB_SKIP_OR_REQUIRE("mpi", "mpirun not found: install openmpi-bin (scripts/install-deps.sh)")

const std::string kProbe = std::string(AB_TEST_BINARY_DIR) + "/tests/dist_probe";
const std::string& kAccelbench = test::accelbench_path();

TEST(MpiBootstrap, TwoRanksExchangeAgreeAndMeasureInLockStep) {
  SKIP_WITHOUT_MPI();
  const Ran r = mpirun("-np 2 --oversubscribe " + quote(kProbe), false);
  ASSERT_EQ(r.code, 0) << r.output;
  const std::string line = r.output.substr(r.output.find('{'));
  const nlohmann::json j = nlohmann::json::parse(line.substr(0, line.find('\n')));
  EXPECT_EQ(j["size"], 2);
  EXPECT_EQ(j["launcher"], "openmpi");
  EXPECT_EQ(j["sum"], 1000 + 1007);
  EXPECT_EQ(j["gathered"], nlohmann::json::array({1000, 1007}));
  EXPECT_TRUE(j["token_same"].get<bool>());
  EXPECT_FALSE(j["rank_text_same"].get<bool>());
  EXPECT_EQ(j["agree_code"], 3);
  EXPECT_EQ(j["agree_message"], "rank 1: injected failure");
  EXPECT_TRUE(j["agree_same"].get<bool>());
  // Every sample waited for rank 1's 400 µs sleeps (rank 0's iterations are empty), and both ranks
  // hold the same result.
  EXPECT_GE(j["samples"].get<int>(), 10);
  EXPECT_GE(j["median_s"].get<double>(), 380e-6);
  EXPECT_TRUE(j["result_same"].get<bool>()) << j.dump();
  ASSERT_EQ(j["rank_medians_s"].size(), 2u);
  EXPECT_LT(j["rank_medians_s"][0].get<double>(), j["rank_medians_s"][1].get<double>());
  EXPECT_GE(j["rank_medians_s"][1].get<double>(), 380e-6);
  // The failing batch on rank 1 ended the measurement on both ranks, with the same message.
  EXPECT_TRUE(j["error_same"].get<bool>());
  EXPECT_EQ(j["error"], "rank 1: device fault injected");
}

std::vector<nlohmann::json> read_points(const std::filesystem::path& out) {
  std::vector<nlohmann::json> points;
  std::vector<std::filesystem::path> runs;
  for (const auto& e : std::filesystem::directory_iterator(out / "runs"))
    if (e.is_directory()) runs.push_back(e.path());
  EXPECT_EQ(runs.size(), 1u) << "one run folder: rank 0 alone writes";
  if (runs.empty()) return points;
  std::ifstream in(runs.front() / "points.jsonl");
  std::string line;
  while (std::getline(in, line)) points.push_back(nlohmann::json::parse(line));
  return points;
}

// A training record's loss after each trajectory step.
std::vector<double> losses(const nlohmann::json& p) { return p["metrics"]["loss_trajectory"].get<std::vector<double>>(); }

// `got` follows `want` step by step, each loss within `rel` of want's (relative).
void expect_trajectory_near(const std::vector<double>& got, const std::vector<double>& want, double rel,
                            const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  for (std::size_t i = 0; i < want.size(); ++i) EXPECT_NEAR(got[i], want[i], rel * std::abs(want[i])) << what << " step " << i;
}

TEST(MpiBootstrap, AccelbenchUnderMpirunRunsEveryPointOnBothRanksAndRankZeroWrites) {
  SKIP_WITHOUT_MPI();
  test::TempDir tmp;
  const Ran r = mpirun("-np 2 --oversubscribe " + quote(kAccelbench) +
                       " run collectives --device cpu --axis op=all_reduce,send_recv --axis bytes=4096 --out " +
                       quote(tmp.path().string()));
  ASSERT_EQ(r.code, 1) << r.output;  // every point skipped: a run that measured nothing fails
  const auto points = read_points(tmp.path());
  ASSERT_EQ(points.size(), 4u);  // 2 ops × in_place 0,1, written once
  for (const auto& p : points) {
    EXPECT_EQ(p["status"], "skipped") << p.dump();
    EXPECT_EQ(p["params"]["gpus"], 2);  // the launch's processes
    const auto& d = p["context"]["dist"];
    EXPECT_EQ(d["launcher"], "openmpi");
    EXPECT_EQ(d["processes"], 2);
    ASSERT_EQ(d["ranks"].size(), 2u);
    EXPECT_EQ(d["ranks"][1]["rank"], 1);
    EXPECT_EQ(d["ranks"][1]["device"], "cpu");
  }
  // The summary (every point skipped: one line) comes from rank 0 only.
  std::size_t tables = 0;
  for (std::size_t at = r.output.find("\ncollectives: "); at != std::string::npos;
       at = r.output.find("\ncollectives: ", at + 1))
    ++tables;
  EXPECT_EQ(tables, 1u) << r.output;
}

TEST(DataParallel, TrainUnderMpirunAveragesGradientsOverTheTrainingRanks) {
  SKIP_WITHOUT_MPI();
  test::TempDir tmp;
  const Ran r = mpirun("-np 2 --oversubscribe " + quote(kAccelbench) +
                       " run train --device cpu --axis batch=4 --axis image_size=8 --option trajectory_steps=4 "
                       "--axis graph=off --axis gpus=1,2,3 --axis bucket_mib=0.0001,25" + kQuickPoints + " --out " +
                       quote(tmp.path().string()));
  ASSERT_EQ(r.code, 0) << r.output;
  const auto points = read_points(tmp.path());
  ASSERT_EQ(points.size(), 6u);
  std::map<std::pair<int, double>, nlohmann::json> by;  // (gpus, bucket_mib)
  for (const auto& p : points) by[{p["params"]["gpus"].get<int>(), p["params"]["bucket_mib"].get<double>()}] = p;
  for (double mib : {0.0001, 25.0}) {
    const auto& one = by.at({1, mib});
    const auto& two = by.at({2, mib});
    ASSERT_EQ(one["status"], "ok") << one.dump();
    ASSERT_EQ(two["status"], "ok") << two.dump();
    EXPECT_FALSE(one["metrics"].contains("data_parallel"));
    const auto& dp = two["metrics"]["data_parallel"];
    EXPECT_EQ(dp["averaging"], "host");
    EXPECT_EQ(dp["global_batch"], 8);
    EXPECT_EQ(two["counts"]["samples"], 8);  // an iteration is one step of both ranks
    // The record's loss is the global batch's, the mean of both ranks' (rank 1's samples differ
    // from rank 0's), and the averaged gradient takes the trajectory elsewhere.
    EXPECT_NE(losses(two).front(), losses(one).front());
    EXPECT_NE(losses(two).back(), losses(one).back());
    EXPECT_GT(two["metrics"]["scaling_efficiency"].get<double>(), 0.0) << two.dump();
    EXPECT_TRUE(two["metrics"].contains("rank_step_time_s"));
    const auto& three = by.at({3, mib});
    EXPECT_EQ(three["status"], "skipped");
    EXPECT_NE(three.value("reason", "").find("needs 3 processes"), std::string::npos) << three.dump();
  }
  // Many small buckets or one large: the same averages, so the same trajectory, bit for bit.
  EXPECT_GT(by.at({2, 0.0001})["metrics"]["data_parallel"]["buckets"].get<int>(), 3);
  EXPECT_EQ(by.at({2, 25.0})["metrics"]["data_parallel"]["buckets"], 1);
  EXPECT_EQ(losses(by.at({2, 0.0001})), losses(by.at({2, 25.0})));
}

// comm_engine=copy copies between GPUs and comm_mean=update averages what they copied: on host
// averaging both are skipped saying why, and nccl with comm_mean=auto runs.
TEST(DataParallel, CopyEnginesAreSkippedOnHostAveraging) {
  SKIP_WITHOUT_MPI();
  std::map<std::string, nlohmann::json> by;  // comm_engine/comm_mean
  for (const std::string mean : {"auto", "update"}) {
    test::TempDir tmp;
    const Ran r = mpirun("-np 2 --oversubscribe " + quote(kAccelbench) +
                         " run train --device cpu --axis batch=2 --axis image_size=8 --option trajectory_steps=1 "
                         "--axis graph=off --axis gpus=2 --axis comm_engine=nccl,copy --option comm_mean=" + mean +
                         kQuickPoints + " --out " + quote(tmp.path().string()));
    ASSERT_EQ(r.code, mean == "update" ? 1 : 0) << r.output;  // with update both points skip: nothing measured
    const auto points = read_points(tmp.path());
    ASSERT_EQ(points.size(), 2u);
    for (const auto& p : points) {
      EXPECT_EQ(p["options"]["comm_mean"], mean) << p.dump();
      by[p["params"]["comm_engine"].get<std::string>() + "/" + p["options"]["comm_mean"].get<std::string>()] = p;
    }
  }
  ASSERT_EQ(by.size(), 4u);
  EXPECT_EQ(by.at("nccl/auto")["status"], "ok") << by.at("nccl/auto").dump();
  EXPECT_EQ(by.at("nccl/auto")["metrics"]["data_parallel"]["averaging"], "host");
  for (const std::string skipped : {"copy/auto", "nccl/update", "copy/update"}) {
    EXPECT_EQ(by.at(skipped)["status"], "skipped") << by.at(skipped).dump();
    EXPECT_NE(by.at(skipped).value("reason", "").find("averages through the host"), std::string::npos)
        << by.at(skipped).dump();
  }
}

// comm_dtype=bf16 / fp16 on the host exchange: each rank's buckets and their mean rounded to the
// wire type (the in-process test above checks the bits). The trajectory starts where f32
// averaging's does (the first loss precedes any update), then leaves it but stays close; the
// record says what travelled and how many bytes.
TEST(DataParallel, TrainUnderMpirunAveragesInTheCommDtype) {
  SKIP_WITHOUT_MPI();
  test::TempDir tmp;
  const Ran r = mpirun("-np 2 --oversubscribe " + quote(kAccelbench) +
                       " run train --device cpu --axis batch=4 --axis image_size=8 --option trajectory_steps=4 "
                       "--axis graph=off --axis gpus=2 --axis comm_dtype=grad,bf16,fp16" + kQuickPoints + " --out " +
                       quote(tmp.path().string()));
  ASSERT_EQ(r.code, 0) << r.output;
  const auto points = read_points(tmp.path());
  ASSERT_EQ(points.size(), 3u);
  std::map<std::string, nlohmann::json> by;
  for (const auto& p : points) {
    ASSERT_EQ(p["status"], "ok") << p.dump();
    by[p["params"]["comm_dtype"].get<std::string>()] = p;
  }
  const auto& grad = by.at("grad")["metrics"]["data_parallel"];
  EXPECT_EQ(grad["comm_dtype"], "grad");
  EXPECT_EQ(grad["wire_dtype"], "f32");
  const auto f32_bytes = grad["allreduce_bytes_per_step"].get<std::int64_t>();
  EXPECT_GT(f32_bytes, 4 * 1000);  // tiny_resnet's parameters, 4 bytes each
  const auto f32 = losses(by.at("grad"));
  EXPECT_NE(f32.front(), f32.back());
  for (const auto& [axis, wire] : {std::pair{"bf16", "bf16"}, std::pair{"fp16", "f16"}}) {
    const auto& dp = by.at(axis)["metrics"]["data_parallel"];
    EXPECT_EQ(dp["comm_dtype"], axis);
    EXPECT_EQ(dp["wire_dtype"], wire);
    EXPECT_EQ(dp["allreduce_bytes_per_step"].get<std::int64_t>() * 2, f32_bytes);
    const auto narrow = losses(by.at(axis));
    ASSERT_EQ(narrow.size(), f32.size());
    EXPECT_EQ(narrow.front(), f32.front()) << axis;
    EXPECT_NE(narrow.back(), f32.back()) << axis << ": rounded gradients took the trajectory elsewhere";
    ASSERT_NO_FATAL_FAILURE(expect_trajectory_near(narrow, f32, 1e-2, axis));
  }
}

// Strong scaling of a model without batch norm: two ranks on halves of one batch of 8 train exactly
// as one process on all 8 (their gradient mean is the full batch's gradient, their loss mean the
// full batch's loss), so the trajectories agree to rounding. Batch norm would not: each rank
// normalises over its own half.
TEST(DataParallel, StrongScalingFollowsTheSingleProcessTrajectory) {
  SKIP_WITHOUT_MPI();
  test::TempDir tmp;
  const Ran r = mpirun("-np 2 --oversubscribe " + quote(kAccelbench) +
                       " run train --device cpu --axis model=tiny_compression_ae --axis batch=8 --axis image_size=16 "
                       "--axis scaling=strong --axis gpus=1,2 --option trajectory_steps=5 --axis graph=off" +
                       kQuickPoints + " --out " + quote(tmp.path().string()));
  ASSERT_EQ(r.code, 0) << r.output;
  const auto points = read_points(tmp.path());
  ASSERT_EQ(points.size(), 2u);
  std::map<int, nlohmann::json> by;
  for (const auto& p : points) {
    ASSERT_EQ(p["status"], "ok") << p.dump();
    by[p["params"]["gpus"].get<int>()] = p;
  }
  EXPECT_EQ(by.at(2)["metrics"]["data_parallel"]["batch_per_gpu"], 4);
  const auto one = losses(by.at(1)), two = losses(by.at(2));
  ASSERT_EQ(one.size(), 5u);
  EXPECT_NE(one.front(), one.back());  // it trains: the comparison below is not of a constant
  ASSERT_NO_FATAL_FAILURE(expect_trajectory_near(two, one, 1e-5, "two ranks"));
  EXPECT_NEAR(by.at(2)["metrics"]["mse"].get<double>(), by.at(1)["metrics"]["mse"].get<double>(),
              1e-5 * by.at(1)["metrics"]["mse"].get<double>());
}

// The 2-GPU tests' model: tiny_resnet in f32, 8 images of 16x16 per GPU, 4 trajectory steps.
constexpr const char* kTinyResnetTraining =
    "--axis model=tiny_resnet --axis precision=fp32 --axis batch=8 --axis image_size=16 --option trajectory_steps=4 ";

// `accelbench run train ARGS` under `mpirun -np 2` on the GPUs: its records by (gpus, graph), each
// expected ok; empty when the run failed (the caller's size check stops there).
std::map<std::pair<int, std::string>, nlohmann::json> two_gpu_train_points(const std::string& args) {
  test::TempDir tmp;
  const Ran r = mpirun("-np 2 " + quote(kAccelbench) + " run train " + args + kQuickPoints + " --out " +
                       quote(tmp.path().string()));
  EXPECT_EQ(r.code, 0) << r.output;
  std::map<std::pair<int, std::string>, nlohmann::json> by;
  if (r.code != 0) return by;
  for (const auto& p : read_points(tmp.path())) {
    EXPECT_EQ(p["status"], "ok") << p.dump();
    // mpirun here binds each rank to a core (no --bind-to none): rank 0 then reads no GPU counters
    // and the context says why (NVML sampling on one CPU corrupted the heap); otherwise rank 0's GPU
    // is in the record's telemetry.
    const bool one_cpu = p["context"].contains("telemetry_note");
    EXPECT_EQ(p["telemetry"].contains("gpus"), !one_cpu) << p["context"].value("telemetry_note", "no note");
    by[{p["params"]["gpus"].get<int>(), p["params"]["graph"].get<std::string>()}] = p;
  }
  if (!by.empty())
    std::printf("two-GPU run: %s\n", by.begin()->second["context"].value("telemetry_note", "GPU counters on").c_str());
  return by;
}

// The data-parallel device check: on two GPUs (NCCL averaging, eager and captured) the strong-scaling
// trajectory follows one GPU's on the same global batch, to float32 rounding.
TEST(DataParallel, TwoGpusStrongScalingFollowsOneGpu) {
  SKIP_WITHOUT_MPI();
  if (backend::collective_device_count() < 2) GTEST_SKIP() << "needs 2 CUDA devices";
  const auto by = two_gpu_train_points(
      "--axis model=tiny_compression_ae --axis precision=fp32 --axis batch=16 --axis image_size=32 "
      "--axis scaling=strong --axis gpus=1,2 --option trajectory_steps=5 --axis graph=off,on");
  ASSERT_EQ(by.size(), 4u);
  for (const std::string graph : {"off", "on"}) {
    const auto one = losses(by.at({1, graph}));
    const auto two = losses(by.at({2, graph}));
    EXPECT_NE(one.front(), one.back());
    ASSERT_NO_FATAL_FAILURE(expect_trajectory_near(two, one, 1e-4, "graph=" + graph));
  }
}

// The same on two GPUs: NCCL averaging on a side stream, eager and inside a captured step.
TEST(DataParallel, TrainOnTwoGpusAveragesOverNccl) {
  SKIP_WITHOUT_MPI();
  if (backend::collective_device_count() < 2) GTEST_SKIP() << "needs 2 CUDA devices";
  const auto by = two_gpu_train_points(
      std::string(kTinyResnetTraining) +
      "--axis gpus=1,2 --axis graph=off,on --axis bucket_mib=0.0001 --axis comm_engine=nccl");
  ASSERT_EQ(by.size(), 4u);
  for (const std::string graph : {"off", "on"}) {
    const auto& one = by.at({1, graph});
    const auto& two = by.at({2, graph});
    EXPECT_EQ(two["metrics"]["data_parallel"]["averaging"], "nccl");
    EXPECT_GT(two["metrics"]["data_parallel"]["buckets"].get<int>(), 3);
    // The global batch's loss includes rank 1's samples; the averaged gradient then differs.
    EXPECT_NE(losses(two).front(), losses(one).front());
    EXPECT_NE(losses(two).back(), losses(one).back());
    EXPECT_GT(two["metrics"]["scaling_efficiency"].get<double>(), 0.0) << two.dump();
  }
  // The captured step (all-reduces inside the CUDA graph) trains like the eager one.
  ASSERT_NO_FATAL_FAILURE(expect_trajectory_near(losses(by.at({2, "on"})), losses(by.at({2, "off"})), 1e-4, "captured vs eager"));
}

// comm_dtype=bf16 on two GPUs: each bucket cast to bf16 on the side stream, all-reduced and cast
// back, eager and inside a captured step; the trajectory stays near f32 averaging's, and half the
// bytes travel.
TEST(DataParallel, TrainOnTwoGpusAveragesInBf16) {
  SKIP_WITHOUT_MPI();
  if (backend::collective_device_count() < 2) GTEST_SKIP() << "needs 2 CUDA devices";
  const std::string args =
      std::string(kTinyResnetTraining) +
      "--axis gpus=2 --axis graph=off,on --axis bucket_mib=0.0001 --axis comm_dtype=";
  const auto f32 = two_gpu_train_points(args + "grad");
  const auto bf16 = two_gpu_train_points(args + "bf16");
  ASSERT_EQ(f32.size(), 2u);
  ASSERT_EQ(bf16.size(), 2u);
  for (const std::string graph : {"off", "on"}) {
    const auto& dp = bf16.at({2, graph})["metrics"]["data_parallel"];
    EXPECT_EQ(dp["averaging"], "nccl");
    EXPECT_EQ(dp["wire_dtype"], "bf16");
    EXPECT_EQ(dp["allreduce_bytes_per_step"].get<std::int64_t>() * 2,
              f32.at({2, graph})["metrics"]["data_parallel"]["allreduce_bytes_per_step"].get<std::int64_t>());
    const auto want = losses(f32.at({2, graph})), got = losses(bf16.at({2, graph}));
    EXPECT_NE(got.back(), want.back()) << "graph=" << graph << ": the bf16 gradients changed nothing";
    ASSERT_NO_FATAL_FAILURE(expect_trajectory_near(got, want, 1e-2, "graph=" + graph));
  }
  // The captured step (casts and all-reduces inside the CUDA graph) trains like the eager one.
  ASSERT_NO_FATAL_FAILURE(expect_trajectory_near(losses(bf16.at({2, "on"})), losses(bf16.at({2, "off"})), 1e-4, "captured vs eager"));
}

// Copy engines on two GPUs (comm_engine=auto chooses them here: 2 GPUs, one host, f32 on the
// wire): each rank copies the other's buckets with a copy engine and averages them, inside SGD's
// update (comm_mean=auto chooses it for sgd) or with a mean kernel per bucket (comm_mean=kernel),
// eager and inside a captured step; either trajectory is NCCL averaging's to float32 rounding (all
// compute (a + b) / 2 in f32). comm_engine=copy with a 16-bit wire, and comm_mean=update with
// NCCL, are skipped saying why.
TEST(DataParallel, TrainOnTwoGpusAveragesOverCopyEngines) {
  SKIP_WITHOUT_MPI();
  if (backend::collective_device_count() < 2) GTEST_SKIP() << "needs 2 CUDA devices";
  const std::string args =
      std::string(kTinyResnetTraining) +
      "--axis gpus=2 --axis graph=off,on --axis bucket_mib=0.0001 --axis comm_engine=";
  const auto nccl = two_gpu_train_points(args + "nccl");
  const auto in_update = two_gpu_train_points(args + "auto");
  const auto by_kernel = two_gpu_train_points(args + "copy --option comm_mean=kernel");
  ASSERT_EQ(nccl.size(), 2u);
  for (const auto* copy : {&in_update, &by_kernel}) {
    ASSERT_EQ(copy->size(), 2u);
    const bool update = copy == &in_update;
    for (const std::string graph : {"off", "on"}) {
      const auto& dp = copy->at({2, graph})["metrics"]["data_parallel"];
      EXPECT_EQ(dp["averaging"], update ? "copy engines, mean in the update" : "copy engines");
      EXPECT_EQ(dp["averaging_fallback"], "");
      EXPECT_GT(dp["buckets"].get<int>(), 3);
      const auto want = losses(nccl.at({2, graph}));
      EXPECT_NE(want.front(), want.back());
      ASSERT_NO_FATAL_FAILURE(expect_trajectory_near(losses(copy->at({2, graph})), want, 1e-5,
                             std::string(update ? "mean in the update" : "mean kernel") + ", graph=" + graph));
    }
  }
  for (const std::string refused : {"copy --axis comm_dtype=bf16", "nccl --option comm_mean=update"}) {
    SCOPED_TRACE(refused);
    test::TempDir tmp;
    const Ran r = mpirun("-np 2 " + quote(kAccelbench) + " run train " + args + refused + kQuickPoints + " --out " +
                         quote(tmp.path().string()));
    ASSERT_EQ(r.code, 0) << r.output;
    const auto skipped = read_points(tmp.path());
    ASSERT_EQ(skipped.size(), 2u);  // graph=off,on
    for (const auto& p : skipped) {
      EXPECT_EQ(p["status"], "skipped") << p.dump();
      EXPECT_NE(p.value("reason", "").find(refused.starts_with("copy") ? "comm_engine=nccl" : "leaves the mean in place"),
                std::string::npos) << p.dump();
    }
  }
}

TEST(MpiBootstrap, ARankThatCannotStartStopsEveryRank) {
  SKIP_WITHOUT_MPI();
  test::TempDir tmp;
  const std::string ab = quote(kAccelbench) + " run collectives --device cpu --axis bytes=4096 --out " + quote(tmp.path().string());
  // Rank 1 alone has a bad axis: both ranks exit 2, rank 1's reason named, nothing written.
  Ran r = mpirun("-np 1 " + ab + " : -np 1 " + ab + " --axis nonsense=1");
  EXPECT_EQ(r.code, 2) << r.output;
  EXPECT_NE(r.output.find("rank 1: unknown axis"), std::string::npos) << r.output;
  EXPECT_FALSE(std::filesystem::exists(tmp.path() / "runs"));
  // Different sweeps on the two ranks: refused before any point runs.
  r = mpirun("-np 1 " + ab + " : -np 1 " + ab + " --axis op=broadcast");
  EXPECT_EQ(r.code, 2) << r.output;
  EXPECT_NE(r.output.find("the ranks built different sweeps"), std::string::npos) << r.output;
  // Rank 0 cannot write its results: every rank stops.
  tmp.write("occupied", "a file where the output folder should be");
  r = mpirun("-np 2 --oversubscribe " + quote(kAccelbench) + " run collectives --device cpu --axis bytes=4096 --out " +
             quote((tmp.path() / "occupied").string()));
  EXPECT_EQ(r.code, 2) << r.output;
  EXPECT_NE(r.output.find("cannot write results"), std::string::npos) << r.output;
}

TEST(MpiBootstrap, P2pIsSkippedUnderALauncher) {
  SKIP_WITHOUT_MPI();
  test::TempDir tmp;
  const Ran r = mpirun("-np 2 --oversubscribe " + quote(kAccelbench) + " run p2p --device cpu --axis bytes=8 --out " +
                       quote(tmp.path().string()));
  ASSERT_EQ(r.code, 1) << r.output;  // its only point skipped: nothing measured
  for (const auto& p : read_points(tmp.path())) {
    EXPECT_EQ(p["status"], "skipped");
    EXPECT_NE(p.value("reason", "").find("without mpirun or srun"), std::string::npos) << p.dump();
  }
}

// --- Topology (context.topology) ---

TEST(Topology, BusIdsNamesAndPlacement) {
  EXPECT_EQ(system::canonical_bus_id("00000000:1B:00.0"), "0000:1b:00.0");
  EXPECT_EQ(system::canonical_bus_id("0000:1b:00.0"), "0000:1b:00.0");
  EXPECT_EQ(system::canonical_bus_id("not a bus id"), "not a bus id");
  EXPECT_EQ(system::nvlink_version_name(6), "4.0");
  EXPECT_EQ(system::nvlink_version_name(7), "5.0");
  EXPECT_EQ(system::nvlink_version_name(42), "code 42");
  EXPECT_EQ(system::pcie_path_name(10), "PIX");
  EXPECT_EQ(system::pcie_path_name(50), "SYS");
  test::TempDir sys;
  sys.write("bus/pci/devices/0000:1b:00.0/numa_node", "1\n");
  sys.write("bus/pci/devices/0000:1b:00.0/local_cpulist", "56-111,168-223\n");
  const auto p = system::pci_placement("00000000:1B:00.0", sys.path());
  EXPECT_EQ(p.numa_node, 1);
  EXPECT_EQ(p.local_cpus, "56-111,168-223");
  EXPECT_EQ(system::pci_placement("0000:99:00.0", sys.path()).numa_node, -1);
}

telemetry::GpuLinkFacts gpu(const std::string& bus, int links, int remote_type, const std::string& remote = "") {
  telemetry::GpuLinkFacts g;
  g.pci_bus_id = bus;
  g.pcie_gen = 5;
  g.pcie_width = 16;
  for (int l = 0; l < links; ++l) g.nvlinks.push_back({static_cast<unsigned>(l), 6, remote, remote_type});
  return g;
}

TEST(Topology, PairsThroughNvswitchDirectNvlinkAndPcie) {
  // Two HGX GPUs on NVSwitches (18 links each), a pair joined by 4 direct links, a PCIe-only pair.
  telemetry::NvmlTopology t;
  t.gpus = {gpu("00000000:19:00.0", 18, 2, "00000000:05:00.0"), gpu("00000000:3B:00.0", 18, 2, "00000000:06:00.0")};
  t.pairs = {{0, 1, 50, 0, 0}};
  nlohmann::json j = system::describe_topology({"cuda:0", "cuda:1"}, t, {{0, "0-55"}, {1, "56-111"}}, "2.28.9");
  EXPECT_EQ(j["nccl"], "2.28.9");
  ASSERT_EQ(j["gpus"].size(), 2u);
  EXPECT_EQ(j["gpus"][1]["pci_bus_id"], "0000:3b:00.0");
  EXPECT_EQ(j["gpus"][1]["numa_node"], 1);
  EXPECT_EQ(j["gpus"][0]["nvlink"]["links"], 18);
  EXPECT_EQ(j["gpus"][0]["nvlink"]["to_switch"], 18);
  EXPECT_EQ(j["gpus"][0]["nvlink"]["version"], "4.0");
  EXPECT_EQ(j["gpus"][0]["pcie"]["gen"], 5);
  ASSERT_EQ(j["links"].size(), 1u);
  EXPECT_EQ(j["links"][0]["via"], "nvswitch");
  EXPECT_EQ(j["links"][0]["nvlinks"], 18);
  EXPECT_EQ(j["links"][0]["pcie_path"], "SYS");
  EXPECT_EQ(j["links"][0]["p2p_read"], "ok");

  t.gpus = {gpu("0000:19:00.0", 4, 0, "00000000:3B:00.0"), gpu("0000:3b:00.0", 4, 0, "00000000:19:00.0"),
            gpu("0000:5e:00.0", 0, -1)};
  t.pairs = {{0, 1, 40, 0, 0}, {0, 2, 10, 0, 5}, {1, 2, 20, 0, 5}};
  j = system::describe_topology({"cuda:0", "cuda:1", "cuda:2"}, t, {}, "");
  EXPECT_FALSE(j.contains("nccl"));
  EXPECT_EQ(j["links"][0]["via"], "nvlink");
  EXPECT_EQ(j["links"][0]["nvlinks"], 4);
  EXPECT_EQ(j["links"][1]["via"], "pcie");
  EXPECT_EQ(j["links"][1]["pcie_path"], "PIX");
  EXPECT_EQ(j["links"][1]["p2p_nvlink"], "not supported");
  EXPECT_EQ(j["links"][2]["pcie_path"], "PXB");
  EXPECT_EQ(j["gpus"][2]["nvlink"]["links"], 0);
  EXPECT_FALSE(j["gpus"][2]["nvlink"].contains("version"));
}

TEST(Topology, ContextHasItWhereThereAreGpus) {
  const auto devices = backend::list_devices();
  const bool gpus = std::any_of(devices.begin(), devices.end(), [](const auto& d) { return d.kind == "cuda"; });
  const nlohmann::json t = system::topology_json(devices);
  if (!gpus) {
    EXPECT_TRUE(t.is_null());
    GTEST_SKIP() << "no CUDA device: the topology block is left out, as checked";
  }
  ASSERT_TRUE(t.is_object());
  EXPECT_EQ(t["source"], "nvml") << t.dump();
  EXPECT_FALSE(t["gpus"].empty());
}

// --- p2p ---

TEST(P2pWorkload, CpuPointsAreSkippedWithTheReason) {
  auto be = backend::make_backend("cpu");
  std::vector<nlohmann::json> records;
  harness::RunnerHooks hooks;
  hooks.sink = [&records](const nlohmann::json& r) { records.push_back(r); };
  harness::Runner runner(*be, fast_settings(), nlohmann::json::object(), "run-p2p", hooks, nullptr);
  const std::atomic<bool> cancel{false};
  runner.run(harness::plan_for(workloads::find_workload("p2p"), "cpu", {}), cancel);
  ASSERT_EQ(records.size(), 2u);  // src 0, dst 0, 8 B and 256 MiB
  for (const auto& r : records) {
    EXPECT_EQ(r.at("status"), "skipped");
    EXPECT_NE(r.value("reason", "").find("need CUDA GPUs"), std::string::npos) << r.dump();
  }
  EXPECT_THROW(harness::plan_for(workloads::find_workload("p2p"), "cpu", {{{"src"}, "7"}}), UsageError);
}

TEST(P2pGpu, EveryPairCopiesExactly) {
  const int gpus = backend::collective_device_count();
  if (gpus == 0) GTEST_SKIP() << "no CUDA device: driver or GPU absent";
  std::vector<int> sides{backend::kHostSide};
  for (int g = 0; g < gpus; ++g) sides.push_back(g);
  for (int src : sides)
    for (int dst : sides) {
      if (src == backend::kHostSide && dst == backend::kHostSide) continue;
      for (bool bi : {false, true}) {
        auto plan = backend::make_peer_copy({src, dst, (std::int64_t{1} << 20) + 3, bi});
        EXPECT_EQ(plan->check(), 0) << src << " -> " << dst << " bi=" << bi;
        auto timer = plan->make_timer();
        EXPECT_GT(timer->time_batch([&] { plan->run(); }, 3), 0.0);
        if (src >= 0 && dst >= 0 && src != dst) {
          EXPECT_EQ(plan->link_facts().count("peer_access"), 1u);
        }
      }
    }
  EXPECT_THROW(backend::make_peer_copy({backend::kHostSide, backend::kHostSide, 8, false}), UsageError);
  EXPECT_THROW(backend::make_peer_copy({0, gpus, 8, false}), UsageError);
}

TEST(P2pGpu, WorkloadRecordsBandwidthAndLatency) {
  if (backend::collective_device_count() == 0) GTEST_SKIP() << "no CUDA device: driver or GPU absent";
  auto be = backend::make_backend("cuda:0");
  std::vector<nlohmann::json> records;
  harness::RunnerHooks hooks;
  hooks.sink = [&records](const nlohmann::json& r) { records.push_back(r); };
  harness::Runner runner(*be, fast_settings(), nlohmann::json::object(), "run-p2p", hooks, nullptr);
  const std::atomic<bool> cancel{false};
  runner.run(harness::plan_for(workloads::find_workload("p2p"), "cuda", {{{"bytes"}, "8,4194304"}}), cancel);
  ASSERT_FALSE(records.empty());
  for (const auto& r : records) {
    if (r["params"]["src"] == "host" && r["params"]["dst"] == "host") {
      EXPECT_EQ(r["status"], "skipped");
      continue;
    }
    ASSERT_EQ(r["status"], "ok") << r.dump();
    EXPECT_TRUE(r["check"]["passed"].get<bool>());
    EXPECT_GT(r["rates"]["gbps"].get<double>(), 0.0);
    EXPECT_GT(r["metrics"]["latency_us"].get<double>(), 0.0);
  }
}

// --- collectives: graph mode and the multi-process shape at one rank ---

TEST(CollectivesGpu, GraphModeAndOneRankCommunicatorAreExact) {
  if (backend::collective_device_count() == 0) GTEST_SKIP() << "no CUDA device: driver or GPU absent";
  auto be = backend::make_backend("cuda:0");
  const int gpus = backend::collective_device_count();
  if (gpus > 1) {  // several GPUs in one process: refused, as NCCL advises
    auto group = backend::make_collective_group(*be, gpus);
    EXPECT_NE(test::error_message<Unsupported>([&] { group->make_plan({CollectiveOp::all_reduce, DType::f32, 1024, false, 5}); })
                  .find("one GPU per process"),
              std::string::npos);
  }
  for (auto op : {CollectiveOp::all_reduce, CollectiveOp::all_gather, CollectiveOp::send_recv}) {
    auto group = backend::make_collective_group(*be, 1);
    const std::int64_t count = collective_count(op, 1 << 20, 4, 1);
    auto plan = group->make_plan({op, DType::f32, count, false, 5});
    EXPECT_EQ(plan->collectives_per_run(), 5);
    plan->run();  // captures, then replays
    EXPECT_EQ(plan->check(), 0) << backend::collective_op_name(op);
    const auto t = plan->per_rank_seconds(2);
    for (double s : t) EXPECT_GT(s, 0.0);
  }
  // The multi-process shape with a world of one: ncclCommInitRank, cached by id.
  const auto id = backend::collective_unique_id();
  auto rank = backend::make_collective_rank(*be, 0, 1, id);
  EXPECT_EQ(rank->size(), 1);
  EXPECT_EQ(rank->local_ranks(), 1);
  for (int repeat = 0; repeat < 2; ++repeat) {
    auto plan = rank->make_plan({CollectiveOp::all_reduce, DType::bf16, 4096, repeat == 1, repeat == 1 ? 3 : 0});
    EXPECT_EQ(plan->check(), 0);
    plan->run();
  }
  EXPECT_THROW(backend::make_collective_rank(*be, 1, 1, id), UsageError);
}

TEST(CollectivesGpu, WorkloadInGraphMode) {
  if (backend::collective_device_count() == 0) GTEST_SKIP() << "no CUDA device: driver or GPU absent";
  auto be = backend::make_backend("cuda:0");
  const auto records = run_collectives(
      *be, "cuda", {{{"op"}, "all_reduce"}, {{"bytes"}, "1048576"}, {{"in_place"}, "0"}, {{"graph"}, "on"}, {{"gpus"}, "1,2"}});
  ASSERT_EQ(records.size(), 2u);
  ASSERT_EQ(records[0].at("status"), "ok") << records[0].dump();
  EXPECT_EQ(records[1].at("status"), "skipped");  // two GPUs in one process (or only one visible)
  EXPECT_EQ(records[0]["metrics"]["graph_collectives"], 20);
  EXPECT_EQ(records[0]["counts"]["samples"], 20);
  EXPECT_GT(records[0]["metrics"]["algbw_gbps"].get<double>(), 0.0);
}

// Time to train data parallel: each rank trains its shard of every epoch (so an epoch is half the
// steps of one rank's), the gradients averaged; rank 0 alone writes the record and the MLPerf log.
// An image classifier to its accuracy, and a GPT on a text file ending not_converged on both
// ranks together (neither waits for the other in an all-reduce); a captured step on host
// averaging is skipped.
TEST(DataParallel, TimeToTrainUnderMpirunShardsEachEpoch) {
  SKIP_WITHOUT_MPI();
  test::TempDir tmp;
  // 512 training and 96 test images of 8x8, each class its own brightness (plus noise).
  for (const auto& [stem, n] : {std::pair<std::string, std::uint32_t>{"train", 512}, {"t10k", 96}}) {
    std::vector<std::uint8_t> pixels, labels;
    const std::uint64_t seed = test::seed();
    for (std::uint32_t i = 0; i < n; ++i) {
      const auto label = static_cast<std::uint8_t>(mix64(seed, i) % 4);
      labels.push_back(label);
      for (std::uint64_t px = 0; px < 64; ++px)
        pixels.push_back(static_cast<std::uint8_t>(40 + 50 * label + uniform(mix64(seed, i), px, -15, 15)));
    }
    test::write_bytes(tmp.path() / "data" / (stem + "-images-idx3-ubyte"), test::idx_file({n, 8, 8}, pixels));
    test::write_bytes(tmp.path() / "data" / (stem + "-labels-idx1-ubyte"), test::idx_file({n}, labels));
  }
  const std::string common =
      " run train --device cpu --axis gpus=2 --option warmup_epochs=0.5 --option "
      "schedule_epochs=6 --option data_threads=1";
  Ran r = mpirun("-np 2 --oversubscribe " + quote(kAccelbench) + common +
                 " --axis model=tiny_resnet --axis layout=nhwc --axis batch=16 --axis dataset=idx:" +
                 quote((tmp.path() / "data").string()) +
                 " --axis target_accuracy=0.9 --axis graph=off,on --option lr=0.1 --option max_epochs=8 --out " +
                 quote((tmp.path() / "image").string()));
  ASSERT_EQ(r.code, 0) << r.output;
  auto points = read_points(tmp.path() / "image");
  ASSERT_EQ(points.size(), 2u);
  const auto& image = points[0]["params"]["graph"] == "off" ? points[0] : points[1];
  const auto& captured = points[0]["params"]["graph"] == "off" ? points[1] : points[0];
  ASSERT_EQ(image["status"], "ok") << image.dump();
  const auto& t = image["metrics"]["time_to_train"];
  EXPECT_GT(t["time_to_train_s"].get<double>(), 0.0);
  EXPECT_EQ(t["steps"].get<std::int64_t>(), t["epochs"].get<std::int64_t>() * (512 / 32));
  EXPECT_EQ(image["metrics"]["data_parallel"]["global_batch"], 32);
  EXPECT_EQ(image["metrics"]["data_parallel"]["averaging"], "host");
  const auto artifacts = tmp.path() / "image" / "runs";
  std::size_t logs = 0;
  for (const auto& e : std::filesystem::recursive_directory_iterator(artifacts))
    logs += e.path().filename() == "mllog.txt" ? 1 : 0;
  EXPECT_EQ(logs, 1u);
  EXPECT_EQ(captured["status"], "skipped");
  EXPECT_NE(captured.value("reason", "").find("use graph=off"), std::string::npos) << captured.dump();

  // 4000 bytes: 3600 train, 112 windows of 32 + 1, 56 a rank: 14 batches of 4 an epoch.
  {
    std::ofstream text(tmp.path() / "text.txt");
    for (int i = 0; i < 4000; ++i) text << "abcd efgh. "[i % 11];
  }
  r = mpirun("-np 2 --oversubscribe " + quote(kAccelbench) + common +
             " --axis model=tiny_gpt2 --axis batch=4 --axis seq=32 --axis graph=off --axis dataset=text:" +
             quote((tmp.path() / "text.txt").string()) +
             " --axis target_loss=0.0001 --option lr=0.003 --option max_epochs=1 --out " +
             quote((tmp.path() / "text").string()));
  points = read_points(tmp.path() / "text");
  ASSERT_EQ(points.size(), 1u) << r.output;
  ASSERT_EQ(points[0]["status"], "not_converged") << points[0].dump();
  const auto& g = points[0]["metrics"]["time_to_train"];
  EXPECT_EQ(g["steps"], 14);
  EXPECT_EQ(g["curve"].size(), 1u);
  EXPECT_EQ(points[0]["metrics"]["data_parallel"]["global_batch"], 8);
}

}  // namespace
}  // namespace ab::dist
