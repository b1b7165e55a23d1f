// Started by dist_test under `mpirun -np 2`: joins the launch as accelbench does, then exercises
// each exchange the multi-process path rests on (allgather, broadcast, agreement on an outcome that
// one rank alone failed, a lock-step measurement with a slow rank and one with a failing rank).
// Rank 0 prints one JSON line; dist_test asserts on it. No GPU involved.
#include <chrono>
#include <iostream>
#include <thread>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "core/rng.h"
#include "dist/comm.h"
#include "dist/launcher.h"
#include "dist/lockstep.h"
#include "measure/timer.h"

using namespace ab;

int main() {
  try {
    dist::Session session(dist::parse_launcher_env(dist::process_environment()));
    dist::Comm& comm = dist::world();
    const int rank = comm.rank();
    nlohmann::json out = {{"size", comm.size()}, {"launcher", session.launch().launcher}};

    // Every rank's value reaches every rank.
    const std::int64_t mine = 1000 + 7 * rank;
    out["sum"] = dist::sum_over_ranks(comm, mine);
    std::vector<std::int64_t> seen;
    for (const auto& b : comm.allgather(dist::Packer().put(mine).bytes())) seen.push_back(dist::Unpacker(b).get_int());
    out["gathered"] = seen;

    // Rank 0's fresh random token replaces every other rank's.
    dist::Bytes token;
    if (rank == 0) token = dist::Packer().put(static_cast<std::int64_t>(fresh_seed() >> 1)).bytes();
    comm.broadcast(token, 0);
    out["token_same"] = dist::same_on_all_ranks(comm, std::string(token.begin(), token.end()));
    out["rank_text_same"] = dist::same_on_all_ranks(comm, "rank " + std::to_string(rank));

    // Only the last rank fails; every rank hears of it, named.
    const dist::Outcome local = rank == comm.size() - 1 ? dist::Outcome{3, "injected failure"} : dist::Outcome{};
    const dist::Outcome agreed = dist::agree(comm, local);
    out["agree_code"] = agreed.code;
    out["agree_message"] = agreed.message;
    out["agree_same"] = dist::same_on_all_ranks(comm, std::to_string(agreed.code) + agreed.message);

    // Lock step: rank 1's iterations sleep, rank 0's do nothing, so every sample is rank 1's time.
    measure::SteadyClockTimer timer;
    measure::Settings s;
    s.min_time_s = 0.05;
    s.warmup_s = 0.01;
    s.max_noise_pct = 50;
    s.target_sample_s = 2e-3;
    s.timeout_s = 20;
    volatile int work = 0;
    const dist::LockstepResult r = dist::measure_lockstep(comm, timer, [&] {
      if (rank == 1) std::this_thread::sleep_for(std::chrono::microseconds(400));
      else work = work + 1;
    }, s, nullptr);
    out["samples"] = r.result.iteration_s.size();
    out["median_s"] = r.result.summary.median;
    out["stop_reason"] = r.result.stop_reason;
    out["result_same"] = dist::same_on_all_ranks(
        comm, std::to_string(r.result.iteration_s.size()) + " " + std::to_string(r.result.summary.median) + " " +
                  std::to_string(r.result.total_iterations) + " " + r.result.stop_reason);
    nlohmann::json ranks = nlohmann::json::array();
    for (const auto& t : r.ranks) ranks.push_back(t.median_s);
    out["rank_medians_s"] = ranks;

    // Lock step where rank 1's third batch throws: every rank throws, naming rank 1.
    int calls = 0;
    std::string error;
    try {
      dist::measure_lockstep(comm, timer, [&] {
        if (rank == 1 && ++calls == 3) throw Error("device fault injected");
      }, s, nullptr);
    } catch (const Error& e) {
      error = e.what();
    }
    out["error_same"] = dist::same_on_all_ranks(comm, error);
    out["error"] = error;
    if (rank == 0) std::cout << out.dump() << std::endl;
    return 0;
  } catch (const std::exception& e) {
    std::cerr << "dist_probe: " << e.what() << '\n';
    return 1;
  }
}
