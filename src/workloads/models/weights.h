// A trained model's parameters in a file: what train writes (--option save_weights=FILE) and
// infer reads (--option weights=FILE). docs/METHODOLOGY.md, "Weights files", gives the format:
//   8 bytes  "ABWEIGHT"
//   8 bytes  the header's length in bytes, little-endian unsigned
//   header   JSON {"format": 1, "model": NAME, "dtype": "f32",
//                  "tensors": [{"name": "layer1.0.conv1.weight", "count": N}, ...]}
//   data     each tensor's `count` values in order, little-endian IEEE f32, in logical row-major
//            order (nn::ParameterValues's), batch-norm running statistics included.
#pragma once

#include <filesystem>
#include <string>

#include "nn/graph.h"

namespace ab::workloads::zoo {

struct WeightsFile {
  std::string model;
  nn::ParameterValues values;
};
void save_weights(const std::filesystem::path& path, const WeightsFile& weights);
// Error naming the file for one that is missing, not a weights file, truncated or inconsistent.
WeightsFile load_weights(const std::filesystem::path& path);

}  // namespace ab::workloads::zoo
