// The processes of one launch and the few host-side exchanges accelbench needs between them: MPI
// only bootstraps (ranks, the NCCL id, agreement on outcomes, per-rank results to rank 0); the
// data moves over NCCL. Without a multi-process launch the world is this process alone.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "dist/launcher.h"

namespace ab::dist {

using Bytes = std::vector<std::uint8_t>;

class Comm {
 public:
  virtual ~Comm() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  virtual void barrier() = 0;
  // `data` on `root` replaces `data` on every rank (any length).
  virtual void broadcast(Bytes& data, int root) = 0;
  // Every rank's `data`, in rank order, on every rank (lengths may differ).
  virtual std::vector<Bytes> allgather(const Bytes& data) = 0;
};

// True where this build has MPI (CMake found it): multi-process launches need it.
bool mpi_built();

// Joins the launch the environment describes for as long as it lives: MPI_Init when the launcher
// started more than one process, MPI_Finalize at the end; nothing for a single process. Throws
// Unsupported when several processes were launched but this build has no MPI or the launcher
// cannot bootstrap MPI (torchrun), and Error when MPI's world disagrees with the launcher's (srun
// without --mpi=pmix). One Session per process, on the main thread.
class Session {
 public:
  explicit Session(const LaunchInfo& launch);
  ~Session();
  Session(const Session&) = delete;
  Session& operator=(const Session&) = delete;
  const LaunchInfo& launch() const { return launch_; }

 private:
  LaunchInfo launch_;
  bool joined_ = false;
};

// The world of the live Session (one rank alone when there is none or it has one process).
Comm& world();
// Where this process sits in the launch ("none" and rank 0 of 1 without a Session).
const LaunchInfo& launch_info();

// Ends every process of the launch at once (MPI_Abort) after a failure on one rank that the
// others cannot learn of (rank 0's store failing mid-run); returns in a world of one.
void abort_launch(int code);

// A step's outcome on one rank: code 0 is success; the meaning of other codes is the caller's.
struct Outcome {
  int code = 0;
  std::string message;
};
// Every rank's outcome of the same step; all ranks get the same answer: success when every rank
// succeeded, the common outcome when all failed alike, else the failure of the lowest failing
// rank with its message prefixed "rank R: ". Every rank must call it, whatever happened locally.
Outcome agree(Comm& comm, const Outcome& local);

// Sums and maxima over ranks (every rank gets the result).
std::int64_t sum_over_ranks(Comm& comm, std::int64_t value);
double max_over_ranks(Comm& comm, double value);

// True on every rank when every rank's `text` is the same (compared by a 64-bit hash and length).
bool same_on_all_ranks(Comm& comm, const std::string& text);

// Where each rank runs: its host and device, in rank order, on every rank (the context block).
struct RankPlace {
  int rank = 0, local_rank = 0;
  std::string host, device, pci_bus_id;
};
std::vector<RankPlace> gather_places(Comm& comm, const std::string& device, const std::string& pci_bus_id);

// Byte packing for the exchanges: fixed-size values and length-prefixed strings.
class Packer {
 public:
  Packer& put(double v);
  Packer& put(std::int64_t v);
  Packer& put(const std::string& s);
  const Bytes& bytes() const { return out_; }

 private:
  Bytes out_;
};
class Unpacker {
 public:
  explicit Unpacker(const Bytes& in) : in_(in) {}
  double get_double();
  std::int64_t get_int();
  std::string get_string();

 private:
  void take(void* out, std::size_t n);
  const Bytes& in_;
  std::size_t pos_ = 0;
};

}  // namespace ab::dist
