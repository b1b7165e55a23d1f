#include "dist/world_group.h"

#include "core/error.h"

namespace ab::dist {

std::unique_ptr<backend::CollectiveGroup> world_collective_group(backend::Backend& backend, Comm& comm) {
  static Bytes id;  // one id per process's launch: every group after the first reuses its communicator
  if (id.empty()) {
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
    id.assign(message.begin() + static_cast<std::ptrdiff_t>(header), message.end());
  }
  return backend::make_collective_rank(backend, comm.rank(), comm.size(), id);
}

}  // namespace ab::dist
