// SHA-256 (FIPS 180-4) of a byte string, as lowercase hex: the model file's identity in records.
#pragma once

#include <string>

namespace ab::onnx {

std::string sha256_hex(const std::string& bytes);

}  // namespace ab::onnx
