#include "dist/world_group.h"

#include <map>

#include "core/error.h"

namespace ab::dist {

namespace {

// Rank 0 creates an NCCL unique id and every rank of `comm` receives it (or rank 0's failure).
Bytes shared_unique_id(Comm& comm) {
  Outcome made;
  Bytes mine;
  if (comm.rank() == 0) {
    try {
      mine = backend::collective_unique_id();
    } catch (const std::exception& e) {
      made = {1, e.what()};
    }
  }
  Bytes message = Packer().put(static_cast<std::int64_t>(made.code)).put(made.message).bytes();
  message.insert(message.end(), mine.begin(), mine.end());
  comm.broadcast(message, 0);
  Unpacker in(message);
  const std::int64_t code = in.get_int();
  const std::string why = in.get_string();
  if (code != 0) throw Error("rank 0 could not create the NCCL unique id: " + why);
  const std::size_t header = sizeof(std::int64_t) * 2 + why.size();
  return Bytes(message.begin() + static_cast<std::ptrdiff_t>(header), message.end());
}

}  // namespace

std::unique_ptr<backend::CollectiveGroup> world_collective_group(backend::Backend& backend, Comm& comm) {
  return first_ranks_collective_group(backend, comm, comm.size());
}

std::unique_ptr<backend::CollectiveGroup> first_ranks_collective_group(backend::Backend& backend, Comm& comm,
                                                                       int ranks, const backend::CommOptions& options) {
  if (ranks < 1 || ranks > comm.size())
    throw UsageError("a communicator of " + std::to_string(ranks) + " ranks in a launch of " +
                     std::to_string(comm.size()));
  // One id per size, options and process (an id makes one communicator): every group after the
  // first of a kind reuses its communicator.
  static std::map<std::pair<int, int>, Bytes> ids;
  Bytes& id = ids[{ranks, options.max_ctas}];
  if (id.empty()) id = shared_unique_id(comm);
  if (comm.rank() >= ranks) return nullptr;
  return backend::make_collective_rank(backend, comm.rank(), ranks, id, options);
}

}  // namespace ab::dist
