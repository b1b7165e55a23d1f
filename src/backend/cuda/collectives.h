// NCCL collectives across the GPUs of one process (backend/collectives.h is the interface).
#pragma once

#include <memory>

#include "backend/collectives.h"

namespace ab::backend::cuda {

std::unique_ptr<CollectiveGroup> make_collective_group(Backend& backend, int gpus);

}  // namespace ab::backend::cuda
