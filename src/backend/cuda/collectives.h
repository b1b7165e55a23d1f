// NCCL collectives and peer copies (backend/collectives.h is the interface).
#pragma once

#include <memory>

#include "backend/collectives.h"

namespace ab::backend::cuda {

std::unique_ptr<CollectiveGroup> make_collective_group(Backend& backend, int gpus);
std::vector<std::uint8_t> collective_unique_id();
std::unique_ptr<CollectiveGroup> make_collective_rank(Backend& backend, int rank, int ranks,
                                                      const std::vector<std::uint8_t>& unique_id,
                                                      const CommOptions& options);
std::unique_ptr<PeerCopyPlan> make_peer_copy(const PeerCopyDesc& desc);  // p2p.cpp

}  // namespace ab::backend::cuda
