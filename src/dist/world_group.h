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

// The communicator of ranks 0..ranks-1 of `comm` (a scaling sweep's gpus=k point in a launch of
// more processes): every rank of `comm` must call it (the id travels over all of them); ranks
// from `ranks` on get null. One id per size and options, kept for the process's life like the world's.
std::unique_ptr<backend::CollectiveGroup> first_ranks_collective_group(backend::Backend& backend, Comm& comm,
                                                                       int ranks,
                                                                       const backend::CommOptions& options = {});

}  // namespace ab::dist
