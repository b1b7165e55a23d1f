#include "core/dtype.h"

#include <array>
#include <atomic>
#include <bit>
#include <chrono>
#include <cmath>
#include <cstring>
#include <utility>

#include "core/error.h"
#include "core/rng.h"

namespace ab {
namespace {

constexpr std::array<std::pair<DType, std::string_view>, 9> kDTypes{{
    {DType::f64, "f64"}, {DType::f32, "f32"}, {DType::f16, "f16"}, {DType::bf16, "bf16"},
    {DType::f8e4m3, "f8e4m3"}, {DType::f8e5m2, "f8e5m2"}, {DType::i8, "i8"}, {DType::i32, "i32"},
    {DType::i64, "i64"}}};

constexpr std::array<std::pair<Precision, std::string_view>, 6> kPrecisions{{
    {Precision::fp32, "fp32"}, {Precision::tf32, "tf32"}, {Precision::fp16, "fp16"},
    {Precision::bf16, "bf16"}, {Precision::fp8, "fp8"}, {Precision::int8, "int8"}}};

template <typename Table>
std::string list_names(const Table& table) {
  std::string out;
  for (const auto& [value, name] : table) {
    if (!out.empty()) out += ", ";
    out += name;
  }
  return out;
}

float e5m2_bits_to_float(std::uint8_t b) {
  // e5m2 is the top byte of an IEEE half.
  return half_bits_to_float(static_cast<std::uint16_t>(b << 8));
}

}  // namespace

std::string_view to_string(DType t) {
  for (const auto& [value, name] : kDTypes)
    if (value == t) return name;
  return "?";
}

DType parse_dtype(std::string_view name) {
  for (const auto& [value, n] : kDTypes)
    if (n == name) return value;
  throw UsageError("unknown dtype '" + std::string(name) + "'; valid: " + list_names(kDTypes));
}

std::size_t size_bytes(DType t) {
  switch (t) {
    case DType::f64: case DType::i64: return 8;
    case DType::f32: case DType::i32: return 4;
    case DType::f16: case DType::bf16: return 2;
    case DType::f8e4m3: case DType::f8e5m2: case DType::i8: return 1;
  }
  return 0;
}

std::string_view to_string(Precision p) {
  for (const auto& [value, name] : kPrecisions)
    if (value == p) return name;
  return "?";
}

Precision parse_precision(std::string_view name) {
  for (const auto& [value, n] : kPrecisions)
    if (n == name) return value;
  throw UsageError("unknown precision '" + std::string(name) + "'; valid: " + list_names(kPrecisions));
}

const std::vector<std::string>& precision_names() {
  static const std::vector<std::string> names = [] {
    std::vector<std::string> v;
    for (const auto& [value, name] : kPrecisions) v.emplace_back(name);
    return v;
  }();
  return names;
}

bool is_integer(Precision p) { return p == Precision::int8; }

std::uint16_t float_to_half_bits(float v) {
  const auto x = std::bit_cast<std::uint32_t>(v);
  const auto sign = static_cast<std::uint16_t>((x >> 16) & 0x8000u);
  const std::uint32_t abs_bits = x & 0x7fffffffu;
  if (abs_bits >= 0x7f800000u)  // inf or NaN
    return static_cast<std::uint16_t>(sign | (abs_bits > 0x7f800000u ? 0x7e00u : 0x7c00u));
  if (abs_bits >= 0x477ff000u) return static_cast<std::uint16_t>(sign | 0x7c00u);  // rounds past 65504
  if (abs_bits < 0x38800000u) {  // below the smallest normal half: subnormal, step 2^-24
    const float scaled = std::bit_cast<float>(abs_bits) * 16777216.0f;  // exact: power-of-two scale
    return static_cast<std::uint16_t>(sign | static_cast<std::uint32_t>(std::nearbyint(scaled)));
  }
  const std::uint32_t mant = abs_bits & 0x7fffffu;
  const std::uint32_t exp = (abs_bits >> 23) - 127u + 15u;
  std::uint32_t h = (exp << 10) | (mant >> 13);
  const std::uint32_t rest = mant & 0x1fffu;
  if (rest > 0x1000u || (rest == 0x1000u && (h & 1u))) ++h;  // round to nearest even
  return static_cast<std::uint16_t>(sign | h);
}

float half_bits_to_float(std::uint16_t h) {
  const std::uint32_t sign = static_cast<std::uint32_t>(h & 0x8000u) << 16;
  const std::uint32_t exp = (h >> 10) & 0x1fu;
  const std::uint32_t mant = h & 0x3ffu;
  if (exp == 0) {
    const float value = std::ldexp(static_cast<float>(mant), -24);
    return sign ? -value : value;
  }
  if (exp == 31) return std::bit_cast<float>(sign | 0x7f800000u | (mant << 13));
  return std::bit_cast<float>(sign | ((exp - 15u + 127u) << 23) | (mant << 13));
}

std::uint16_t float_to_bf16_bits(float v) {
  const auto x = std::bit_cast<std::uint32_t>(v);
  if ((x & 0x7fffffffu) > 0x7f800000u) return static_cast<std::uint16_t>((x >> 16) | 0x40u);  // quiet NaN
  const std::uint32_t rounded = x + 0x7fffu + ((x >> 16) & 1u);
  return static_cast<std::uint16_t>(rounded >> 16);
}

float bf16_bits_to_float(std::uint16_t b) { return std::bit_cast<float>(static_cast<std::uint32_t>(b) << 16); }

std::uint8_t float_to_e4m3_bits(float v) {
  if (std::isnan(v)) return 0x7f;
  const std::uint8_t sign = std::signbit(v) ? 0x80 : 0x00;
  const float a = std::fmin(std::fabs(v), 448.0f);  // e4m3fn has no infinity: saturate
  if (a < 0x1.0p-6f) {  // subnormal, step 2^-9; m == 8 lands on the smallest normal's encoding
    return static_cast<std::uint8_t>(sign | static_cast<std::uint32_t>(std::nearbyint(a * 512.0f)));
  }
  int e = 0;
  const float fraction = std::frexp(a, &e);  // a = fraction * 2^e, fraction in [0.5, 1)
  int exponent = e - 1;
  auto mant = static_cast<int>(std::nearbyint((fraction * 2.0f - 1.0f) * 8.0f));
  if (mant == 8) {
    mant = 0;
    ++exponent;
  }
  return static_cast<std::uint8_t>(sign | ((exponent + 7) << 3) | mant);
}

float e4m3_bits_to_float(std::uint8_t b) {
  const int exp = (b >> 3) & 0xf;
  const int mant = b & 0x7;
  float value = 0.0f;
  if (exp == 15 && mant == 7) return std::nanf("");
  if (exp == 0)
    value = std::ldexp(static_cast<float>(mant), -9);
  else
    value = std::ldexp(1.0f + static_cast<float>(mant) / 8.0f, exp - 7);
  return (b & 0x80) ? -value : value;
}

float round_to_tf32(float v) {
  const auto x = std::bit_cast<std::uint32_t>(v);
  if ((x & 0x7fffffffu) >= 0x7f800000u) return v;
  const std::uint32_t rounded = (x + 0xfffu + ((x >> 13) & 1u)) & 0xffffe000u;
  return std::bit_cast<float>(rounded);
}

std::vector<double> to_doubles(DType t, const void* data, std::size_t count) {
  std::vector<double> out(count);
  const auto* bytes = static_cast<const unsigned char*>(data);
  for (std::size_t i = 0; i < count; ++i) {
    switch (t) {
      case DType::f64: { double v; std::memcpy(&v, bytes + i * 8, 8); out[i] = v; break; }
      case DType::f32: { float v; std::memcpy(&v, bytes + i * 4, 4); out[i] = v; break; }
      case DType::f16: { std::uint16_t v; std::memcpy(&v, bytes + i * 2, 2); out[i] = half_bits_to_float(v); break; }
      case DType::bf16: { std::uint16_t v; std::memcpy(&v, bytes + i * 2, 2); out[i] = bf16_bits_to_float(v); break; }
      case DType::f8e4m3: out[i] = e4m3_bits_to_float(bytes[i]); break;
      case DType::f8e5m2: out[i] = e5m2_bits_to_float(bytes[i]); break;
      case DType::i8: out[i] = static_cast<signed char>(bytes[i]); break;
      case DType::i32: { std::int32_t v; std::memcpy(&v, bytes + i * 4, 4); out[i] = v; break; }
      case DType::i64: { std::int64_t v; std::memcpy(&v, bytes + i * 8, 8); out[i] = static_cast<double>(v); break; }
    }
  }
  return out;
}

std::uint64_t fresh_seed() {
  static std::atomic<std::uint64_t> counter{0};
  const auto now = static_cast<std::uint64_t>(std::chrono::steady_clock::now().time_since_epoch().count());
  return mix64(now, ++counter);
}

}  // namespace ab
