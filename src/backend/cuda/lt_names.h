// Readable names for cuBLASLt algorithm configuration ids (tile shape, pipeline stages).
#pragma once

#include <cstdint>
#include <string>

namespace ab::backend::cuda {

std::string tile_name(std::uint32_t id);    // cublasLtMatmulTile_t -> "128x256"
std::string stages_name(std::uint32_t id);  // cublasLtMatmulStages_t -> "64x4", "128xAUTO"

}  // namespace ab::backend::cuda
