// Element types and precisions, with host-side conversions for the narrow formats so that
// device results can be checked against the float64 reference on the host.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace ab {

enum class DType { f64, f32, f16, bf16, f8e4m3, f8e5m2, i8, i32, i64 };

std::string_view to_string(DType t);
DType parse_dtype(std::string_view name);  // throws UsageError listing valid names
std::size_t size_bytes(DType t);

// A GEMM/compute precision: the operand type plus how the math units treat it.
enum class Precision { fp32, tf32, fp16, bf16, fp8, int8 };

std::string_view to_string(Precision p);
Precision parse_precision(std::string_view name);  // throws UsageError listing valid names
const std::vector<std::string>& precision_names();
bool is_integer(Precision p);

// Narrow-format conversions (round to nearest even; saturating for fp8 e4m3 as cuBLASLt does).
std::uint16_t float_to_half_bits(float v);
float half_bits_to_float(std::uint16_t h);
std::uint16_t float_to_bf16_bits(float v);
float bf16_bits_to_float(std::uint16_t b);
std::uint8_t float_to_e4m3_bits(float v);
float e4m3_bits_to_float(std::uint8_t b);
// tf32 keeps 10 mantissa bits of an fp32 value (what the tensor cores read).
float round_to_tf32(float v);

// Decodes `count` elements of type `t` stored at `data` into doubles.
std::vector<double> to_doubles(DType t, const void* data, std::size_t count);

}  // namespace ab
