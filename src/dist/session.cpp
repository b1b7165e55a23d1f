// The Session: MPI's world when the launcher started several processes, this process alone
// otherwise. MPI is compiled in only where CMake found it (ACCELBENCH_WITH_MPI).
#include <climits>
#include <memory>

#include "core/error.h"
#include "dist/comm.h"
#ifdef ACCELBENCH_WITH_MPI
#include <mpi.h>
#endif

namespace ab::dist {
namespace {

class SelfComm final : public Comm {
 public:
  int rank() const override { return 0; }
  int size() const override { return 1; }
  void barrier() override {}
  void broadcast(Bytes&, int root) override {
    if (root != 0) throw Error("dist: broadcast from rank " + std::to_string(root) + " in a world of one");
  }
  std::vector<Bytes> allgather(const Bytes& data) override { return {data}; }
};

#ifdef ACCELBENCH_WITH_MPI
void check_mpi(int rc, const char* call) {
  if (rc == MPI_SUCCESS) return;
  char text[MPI_MAX_ERROR_STRING] = {};
  int len = 0;
  MPI_Error_string(rc, text, &len);
  throw Error(std::string(call) + " failed: " + std::string(text, static_cast<std::size_t>(len)));
}
#define AB_MPI(call) check_mpi((call), #call)

int as_count(std::size_t n) {
  if (n > static_cast<std::size_t>(INT_MAX)) throw Error("dist: a message of " + std::to_string(n) + " bytes is too long for MPI");
  return static_cast<int>(n);
}

class MpiComm final : public Comm {
 public:
  MpiComm() {
    AB_MPI(MPI_Comm_rank(MPI_COMM_WORLD, &rank_));
    AB_MPI(MPI_Comm_size(MPI_COMM_WORLD, &size_));
  }
  int rank() const override { return rank_; }
  int size() const override { return size_; }
  void barrier() override { AB_MPI(MPI_Barrier(MPI_COMM_WORLD)); }

  void broadcast(Bytes& data, int root) override {
    int n = as_count(data.size());
    AB_MPI(MPI_Bcast(&n, 1, MPI_INT, root, MPI_COMM_WORLD));
    data.resize(static_cast<std::size_t>(n));
    if (n > 0) AB_MPI(MPI_Bcast(data.data(), n, MPI_BYTE, root, MPI_COMM_WORLD));
  }

  std::vector<Bytes> allgather(const Bytes& data) override {
    const int n = as_count(data.size());
    std::vector<int> sizes(static_cast<std::size_t>(size_)), offsets(static_cast<std::size_t>(size_));
    AB_MPI(MPI_Allgather(&n, 1, MPI_INT, sizes.data(), 1, MPI_INT, MPI_COMM_WORLD));
    std::size_t total = 0;
    for (std::size_t r = 0; r < sizes.size(); ++r) {
      offsets[r] = as_count(total);
      total += static_cast<std::size_t>(sizes[r]);
    }
    Bytes all(std::max<std::size_t>(total, 1));
    AB_MPI(MPI_Allgatherv(data.data(), n, MPI_BYTE, all.data(), sizes.data(), offsets.data(), MPI_BYTE, MPI_COMM_WORLD));
    std::vector<Bytes> out;
    for (std::size_t r = 0; r < sizes.size(); ++r)
      out.emplace_back(all.begin() + offsets[r], all.begin() + offsets[r] + sizes[r]);
    return out;
  }

 private:
  int rank_ = 0, size_ = 1;
};
#endif

SelfComm g_self;
std::unique_ptr<Comm> g_mpi;
LaunchInfo g_launch;

std::string where(const LaunchInfo& l) {
  return "launched by " + l.launcher + " as rank " + std::to_string(l.rank) + " of " + std::to_string(l.world_size);
}

}  // namespace

bool mpi_built() {
#ifdef ACCELBENCH_WITH_MPI
  return true;
#else
  return false;
#endif
}

Comm& world() { return g_mpi ? *g_mpi : static_cast<Comm&>(g_self); }
const LaunchInfo& launch_info() { return g_launch; }

void abort_launch(int code) {
#ifdef ACCELBENCH_WITH_MPI
  if (g_mpi) MPI_Abort(MPI_COMM_WORLD, code);
#else
  (void)code;
#endif
}

Session::Session(const LaunchInfo& launch) : launch_(launch) {
  if (launch.world_size <= 1) {
    g_launch = launch;
    return;
  }
  if (launch.launcher == "torchrun")
    throw Unsupported(where(launch) + ", but accelbench bootstraps several processes through MPI: start them with "
                      "mpirun or srun --mpi=pmix");
#ifdef ACCELBENCH_WITH_MPI
  int initialised = 0;
  AB_MPI(MPI_Initialized(&initialised));
  if (initialised != 0) throw Error("dist: MPI is already initialised; one Session per process");
  int provided = 0;
  AB_MPI(MPI_Init_thread(nullptr, nullptr, MPI_THREAD_FUNNELED, &provided));
  joined_ = true;
  try {
    auto comm = std::make_unique<MpiComm>();
    if (comm->size() != launch.world_size || comm->rank() != launch.rank)
      throw Error(where(launch) + ", but MPI sees rank " + std::to_string(comm->rank()) + " of " +
                  std::to_string(comm->size()) +
                  ": the launcher did not start an MPI job (under Slurm use srun --mpi=pmix, or mpirun)");
    g_mpi = std::move(comm);
  } catch (...) {
    MPI_Finalize();
    joined_ = false;
    throw;
  }
  g_launch = launch;
#else
  throw Unsupported(where(launch) + ", but this accelbench was built without MPI (install libopenmpi-dev and "
                    "reconfigure), so its processes cannot find each other; run it without a launcher for one process");
#endif
}

Session::~Session() {
  g_launch = LaunchInfo{};
#ifdef ACCELBENCH_WITH_MPI
  if (joined_) {
    g_mpi.reset();
    MPI_Finalize();
  }
#endif
}

}  // namespace ab::dist
