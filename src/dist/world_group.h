// The launch-wide NCCL communicator, bootstrapped over MPI: rank 0 creates NCCL's unique id, MPI
// broadcasts it once per process, and each rank joins with its own rank on its own GPU. The
// backend keeps the communicator for (id, rank), so every later point reuses it.
#pragma once

#include <memory>

#include "backend/collectives.h"
#include "dist/comm.h"

namespace ab::dist {

// This process's rank of the communicator over all of `comm`'s ranks, on the backend's device and
// stream. Every rank must call it for the same point: NCCL's set-up waits for all of them. When
// rank 0 cannot create the id, every rank throws ab::Error saying so.
std::unique_ptr<backend::CollectiveGroup> world_collective_group(backend::Backend& backend, Comm& comm);

}  // namespace ab::dist
