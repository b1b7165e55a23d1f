// src/dist: launcher environments (OpenMPI, Slurm, PMI, torchrun) and their errors; nccl-tests'
// bus-bandwidth factors and counts; the collectives workload (skipped on the CPU with its reason;
// on GPUs, every op × dtype × in-place at a small size with zero wrong elements).
#include <gtest/gtest.h>

#include <atomic>
#include <map>
#include <string>
#include <vector>

#include "backend/collectives.h"
#include "core/error.h"
#include "dist/collective_math.h"
#include "dist/launcher.h"
#include "workloads/runner.h"
#include "workloads/workload.h"

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
  Env env{{"SLURM_PROCID", "9"},  {"SLURM_NTASKS", "11"}, {"SLURM_LOCALID", "1"},
          {"SLURM_NODEID", "2"},  {"SLURM_TASKS_PER_NODE", "4(x2),3"}};
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
  EXPECT_EQ(parse_launcher_env({{"SLURM_PROCID", "3"}, {"SLURM_NTASKS", "8"}, {"SLURM_LOCALID", "3"},
                                {"SLURM_TASKS_PER_NODE", "4(x2)"}})
                .local_size,
            4);
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
  expect_usage_error({{"SLURM_PROCID", "1"}, {"SLURM_NTASKS", "4"}, {"SLURM_LOCALID", "2"}, {"SLURM_NTASKS_PER_NODE", "2"}},
                     "local rank 2 is outside a node of 2");
  expect_usage_error({{"SLURM_PROCID", "1"}, {"SLURM_NTASKS", "4"}}, "SLURM_PROCID is set but SLURM_LOCALID is not");
  expect_usage_error({{"SLURM_PROCID", "0"}, {"SLURM_NTASKS", "2"}, {"SLURM_LOCALID", "0"}, {"SLURM_NODEID", "3"},
                      {"SLURM_TASKS_PER_NODE", "1(x2)"}},
                     "SLURM_NODEID=3");
  expect_usage_error({{"SLURM_PROCID", "0"}, {"SLURM_NTASKS", "2"}, {"SLURM_LOCALID", "0"},
                      {"SLURM_TASKS_PER_NODE", "2(x"}},
                     "SLURM_TASKS_PER_NODE");
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
                                            const std::vector<workloads::AxisOverride>& overrides) {
  std::vector<nlohmann::json> records;
  workloads::RunnerHooks hooks;
  hooks.sink = [&records](const nlohmann::json& r) { records.push_back(r); };
  workloads::Runner runner(be, fast_settings(), nlohmann::json::object(), "run-dist", hooks, nullptr);
  const std::atomic<bool> cancel{false};
  runner.run(workloads::plan_for(workloads::find_workload("collectives"), kind, overrides), cancel);
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

}  // namespace
}  // namespace ab::dist
