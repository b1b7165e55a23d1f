// Tests for src/core: narrow-format conversions (fp16, bf16, fp8 e4m3, tf32), decoding buffers to
// doubles, dtype/precision names and their errors, and the counter-based RNG.
#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <stdexcept>
#include <new>
#include <set>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "test_support.h"

#include "core/checked.h"
#include "core/dtype.h"
#include "core/error.h"
#include "core/rng.h"

namespace ab {
namespace {

constexpr float kInf = std::numeric_limits<float>::infinity();
const float kNaN = std::numeric_limits<float>::quiet_NaN();

std::uint32_t bits(float v) { return std::bit_cast<std::uint32_t>(v); }


// ---------------------------------------------------------------------------------------------
// fp16

TEST(Half, KnownEncodings) {
  EXPECT_EQ(float_to_half_bits(0.0f), 0x0000u);
  EXPECT_EQ(float_to_half_bits(-0.0f), 0x8000u);
  EXPECT_EQ(float_to_half_bits(1.0f), 0x3c00u);
  EXPECT_EQ(float_to_half_bits(-2.0f), 0xc000u);
  EXPECT_EQ(float_to_half_bits(0.5f), 0x3800u);
  EXPECT_EQ(float_to_half_bits(65504.0f), 0x7bffu);           // largest finite half
  EXPECT_EQ(float_to_half_bits(0x1.0p-14f), 0x0400u);        // smallest normal
  EXPECT_EQ(float_to_half_bits(0x1.0p-24f), 0x0001u);        // smallest subnormal
  EXPECT_EQ(float_to_half_bits(1023.0f * 0x1.0p-24f), 0x03ffu);  // largest subnormal
  EXPECT_EQ(half_bits_to_float(0x3c00), 1.0f);
  EXPECT_EQ(half_bits_to_float(0xc000), -2.0f);
  EXPECT_EQ(half_bits_to_float(0x7bff), 65504.0f);
  EXPECT_EQ(half_bits_to_float(0x0001), 0x1.0p-24f);
  EXPECT_EQ(half_bits_to_float(0x8001), -0x1.0p-24f);
  EXPECT_EQ(half_bits_to_float(0x03ff), 1023.0f * 0x1.0p-24f);
  EXPECT_EQ(half_bits_to_float(0x7c00), kInf);
  EXPECT_EQ(half_bits_to_float(0xfc00), -kInf);
  EXPECT_TRUE(std::isnan(half_bits_to_float(0x7e00)));
  EXPECT_TRUE(std::isnan(half_bits_to_float(0x7c01)));
  EXPECT_TRUE(std::signbit(half_bits_to_float(0x8000)));
}

TEST(Half, EveryNonNaNEncodingRoundTrips) {
  int nan_count = 0;
  for (std::uint32_t h = 0; h <= 0xffffu; ++h) {
    const auto hb = static_cast<std::uint16_t>(h);
    const float f = half_bits_to_float(hb);
    if (((h >> 10) & 0x1fu) == 0x1fu && (h & 0x3ffu) != 0) {
      ++nan_count;
      ASSERT_TRUE(std::isnan(f)) << std::hex << h;
      EXPECT_TRUE(std::isnan(half_bits_to_float(float_to_half_bits(f)))) << std::hex << h;
      continue;
    }
    ASSERT_EQ(float_to_half_bits(f), hb) << "half 0x" << std::hex << h << " -> " << f;
  }
  EXPECT_EQ(nan_count, 2 * 1023);
}

TEST(Half, RoundsToNearestEvenOnTies) {
  // Halfway between 1 (0x3c00, even) and 1 + 2^-10 (0x3c01): stays at the even 1.
  EXPECT_EQ(float_to_half_bits(1.0f + 0x1.0p-11f), 0x3c00u);
  // Halfway between 1 + 2^-10 (odd) and 1 + 2^-9 (0x3c02, even): goes up.
  EXPECT_EQ(float_to_half_bits(1.0f + 3.0f * 0x1.0p-11f), 0x3c02u);
  // Just above / below a tie rounds to the nearer value.
  EXPECT_EQ(float_to_half_bits(1.0f + 0x1.0p-11f + 0x1.0p-20f), 0x3c01u);
  EXPECT_EQ(float_to_half_bits(1.0f + 3.0f * 0x1.0p-11f - 0x1.0p-20f), 0x3c01u);
  // Negative values mirror positive ones.
  EXPECT_EQ(float_to_half_bits(-(1.0f + 0x1.0p-11f)), 0xbc00u);
  EXPECT_EQ(float_to_half_bits(-(1.0f + 3.0f * 0x1.0p-11f)), 0xbc02u);
  // A carry out of the mantissa bumps the exponent: 2 - 2^-11 is halfway between 0x3bff (odd) and 2.
  EXPECT_EQ(float_to_half_bits(2.0f - 0x1.0p-11f), 0x4000u);
  // Nearest, not truncation.
  EXPECT_EQ(float_to_half_bits(1.0f + 0.9f * 0x1.0p-10f), 0x3c01u);
  EXPECT_EQ(float_to_half_bits(3.14159265f), 0x4248u);  // 3.140625
}

TEST(Half, Subnormals) {
  // Subnormal step 2^-24; ties go to even.
  EXPECT_EQ(float_to_half_bits(0x1.0p-25f), 0x0000u);         // half of the smallest: to even 0
  EXPECT_EQ(float_to_half_bits(0x1.8p-25f), 0x0001u);         // 0.75 steps
  EXPECT_EQ(float_to_half_bits(3.0f * 0x1.0p-25f), 0x0002u);  // 1.5 steps: to even 2
  EXPECT_EQ(float_to_half_bits(5.0f * 0x1.0p-25f), 0x0002u);  // 2.5 steps: to even 2
  EXPECT_EQ(float_to_half_bits(-5.0f * 0x1.0p-24f), 0x8005u);
  EXPECT_EQ(float_to_half_bits(1e-10f), 0x0000u);             // underflows to zero
  EXPECT_EQ(float_to_half_bits(-1e-10f), 0x8000u);
  // 1023.5 steps rounds up into the smallest normal.
  EXPECT_EQ(float_to_half_bits(1023.5f * 0x1.0p-24f), 0x0400u);
  for (std::uint16_t m = 1; m < 0x400; ++m)
    ASSERT_EQ(half_bits_to_float(m), static_cast<float>(m) * 0x1.0p-24f) << m;
}

TEST(Half, OverflowBecomesInfinity) {
  EXPECT_EQ(float_to_half_bits(65519.0f), 0x7bffu);  // below the rounding midpoint 65520
  EXPECT_EQ(float_to_half_bits(65520.0f), 0x7c00u);  // the midpoint rounds to even: infinity
  EXPECT_EQ(float_to_half_bits(65536.0f), 0x7c00u);
  EXPECT_EQ(float_to_half_bits(1e6f), 0x7c00u);
  EXPECT_EQ(float_to_half_bits(-1e6f), 0xfc00u);
  EXPECT_EQ(float_to_half_bits(std::numeric_limits<float>::max()), 0x7c00u);
  EXPECT_EQ(float_to_half_bits(kInf), 0x7c00u);
  EXPECT_EQ(float_to_half_bits(-kInf), 0xfc00u);
  EXPECT_EQ(half_bits_to_float(float_to_half_bits(1e6f)), kInf);
}

TEST(Half, NaNStaysNaN) {
  const std::uint16_t h = float_to_half_bits(kNaN);
  EXPECT_EQ(h & 0x7c00u, 0x7c00u);
  EXPECT_NE(h & 0x3ffu, 0u);
  EXPECT_TRUE(std::isnan(half_bits_to_float(h)));
  // A signalling NaN whose payload sits only in the low float bits must not become infinity.
  const float snan = std::bit_cast<float>(0x7f800001u);
  EXPECT_TRUE(std::isnan(half_bits_to_float(float_to_half_bits(snan))));
}

// ---------------------------------------------------------------------------------------------
// bf16

TEST(BFloat16, KnownEncodings) {
  EXPECT_EQ(float_to_bf16_bits(1.0f), 0x3f80u);
  EXPECT_EQ(float_to_bf16_bits(-2.0f), 0xc000u);
  EXPECT_EQ(float_to_bf16_bits(0.0f), 0x0000u);
  EXPECT_EQ(float_to_bf16_bits(-0.0f), 0x8000u);
  EXPECT_EQ(float_to_bf16_bits(kInf), 0x7f80u);
  EXPECT_EQ(float_to_bf16_bits(-kInf), 0xff80u);
  EXPECT_EQ(bf16_bits_to_float(0x3f80), 1.0f);
  EXPECT_EQ(bf16_bits_to_float(0x4049), 3.140625f);
  EXPECT_EQ(float_to_bf16_bits(3.14159265f), 0x4049u);
}

TEST(BFloat16, EveryNonNaNEncodingRoundTrips) {
  for (std::uint32_t b = 0; b <= 0xffffu; ++b) {
    const auto bb = static_cast<std::uint16_t>(b);
    const float f = bf16_bits_to_float(bb);
    ASSERT_EQ(bits(f), b << 16);
    if (std::isnan(f)) continue;
    ASSERT_EQ(float_to_bf16_bits(f), bb) << std::hex << b;
  }
}

TEST(BFloat16, RoundsToNearestEvenOnTies) {
  EXPECT_EQ(float_to_bf16_bits(1.0f + 0x1.0p-8f), 0x3f80u);         // tie, down to even
  EXPECT_EQ(float_to_bf16_bits(1.0f + 3.0f * 0x1.0p-8f), 0x3f82u);  // tie, up to even
  EXPECT_EQ(float_to_bf16_bits(1.0f + 0x1.0p-8f + 0x1.0p-20f), 0x3f81u);
  EXPECT_EQ(float_to_bf16_bits(-(1.0f + 3.0f * 0x1.0p-8f)), 0xbf82u);
  EXPECT_EQ(float_to_bf16_bits(2.0f - 0x1.0p-8f), 0x4000u);  // carry into the exponent
  // The largest float is beyond the midpoint after bf16's largest finite value: infinity.
  EXPECT_EQ(float_to_bf16_bits(std::numeric_limits<float>::max()), 0x7f80u);
  // Float subnormals round like everything else (bf16 keeps fp32's exponent range).
  EXPECT_EQ(float_to_bf16_bits(std::bit_cast<float>(0x00018000u)), 0x0002u);  // tie, up to even
  EXPECT_EQ(float_to_bf16_bits(std::bit_cast<float>(0x00008000u)), 0x0000u);  // tie, down to even
}

TEST(BFloat16, NaNStaysNaN) {
  EXPECT_TRUE(std::isnan(bf16_bits_to_float(float_to_bf16_bits(kNaN))));
  EXPECT_TRUE(std::isnan(bf16_bits_to_float(float_to_bf16_bits(-kNaN))));
  // Payload only in the bits bf16 drops: naive rounding or truncation would give infinity.
  for (std::uint32_t x : {0x7f800001u, 0x7f807fffu, 0x7fffffffu, 0xff800001u, 0x7fbfffffu}) {
    const std::uint16_t b = float_to_bf16_bits(std::bit_cast<float>(x));
    EXPECT_TRUE(std::isnan(bf16_bits_to_float(b))) << std::hex << x << " -> " << b;
    EXPECT_EQ(b & 0x8000u, (x >> 16) & 0x8000u) << "sign kept";
  }
}

// ---------------------------------------------------------------------------------------------
// fp8 e4m3 (the "fn" variant: no infinities, one NaN encoding per sign, max 448)

TEST(E4M3, KnownEncodings) {
  EXPECT_EQ(float_to_e4m3_bits(1.0f), 0x38u);
  EXPECT_EQ(float_to_e4m3_bits(-1.0f), 0xb8u);
  EXPECT_EQ(float_to_e4m3_bits(0.0f), 0x00u);
  EXPECT_EQ(float_to_e4m3_bits(-0.0f), 0x80u);
  EXPECT_EQ(float_to_e4m3_bits(448.0f), 0x7eu);
  EXPECT_EQ(float_to_e4m3_bits(0x1.0p-6f), 0x08u);  // smallest normal
  EXPECT_EQ(float_to_e4m3_bits(0x1.0p-9f), 0x01u);  // smallest subnormal
  EXPECT_EQ(float_to_e4m3_bits(1.75f), 0x3eu);
  EXPECT_EQ(e4m3_bits_to_float(0x7e), 448.0f);
  EXPECT_EQ(e4m3_bits_to_float(0xfe), -448.0f);
  EXPECT_EQ(e4m3_bits_to_float(0x78), 256.0f);
  EXPECT_EQ(e4m3_bits_to_float(0x07), 7.0f * 0x1.0p-9f);
  EXPECT_EQ(e4m3_bits_to_float(0x3c), 1.5f);
}

TEST(E4M3, EveryNonNaNEncodingRoundTrips) {
  int nan_count = 0;
  for (std::uint32_t b = 0; b <= 0xffu; ++b) {
    const auto bb = static_cast<std::uint8_t>(b);
    const float f = e4m3_bits_to_float(bb);
    if ((b & 0x7fu) == 0x7fu) {
      ++nan_count;
      EXPECT_TRUE(std::isnan(f)) << std::hex << b;
      continue;
    }
    ASSERT_FALSE(std::isnan(f)) << std::hex << b;
    ASSERT_TRUE(std::isfinite(f)) << std::hex << b;
    ASSERT_LE(std::fabs(f), 448.0f);
    ASSERT_EQ(float_to_e4m3_bits(f), bb) << "e4m3 0x" << std::hex << b << " -> " << f;
  }
  EXPECT_EQ(nan_count, 2);
}

TEST(E4M3, RoundsToNearestEvenOnTies) {
  EXPECT_EQ(float_to_e4m3_bits(1.0625f), 0x38u);  // between 1 (even) and 1.125
  EXPECT_EQ(float_to_e4m3_bits(1.1875f), 0x3au);  // between 1.125 (odd) and 1.25 (even)
  EXPECT_EQ(float_to_e4m3_bits(1.07f), 0x39u);    // nearer 1.125
  EXPECT_EQ(float_to_e4m3_bits(-1.1875f), 0xbau);
  EXPECT_EQ(float_to_e4m3_bits(1.9375f), 0x40u);  // tie between 1.875 (odd) and 2: carry into exponent
  EXPECT_EQ(float_to_e4m3_bits(248.0f), 0x78u);   // tie between 240 and 256
  EXPECT_EQ(float_to_e4m3_bits(232.0f), 0x76u);   // tie between 224 (even) and 240
}

TEST(E4M3, Subnormals) {
  EXPECT_EQ(float_to_e4m3_bits(0x1.0p-10f), 0x00u);         // half a step: to even 0
  EXPECT_EQ(float_to_e4m3_bits(3.0f * 0x1.0p-10f), 0x02u);  // 1.5 steps: to even 2
  EXPECT_EQ(float_to_e4m3_bits(5.0f * 0x1.0p-10f), 0x02u);  // 2.5 steps: to even 2
  EXPECT_EQ(float_to_e4m3_bits(-3.0f * 0x1.0p-9f), 0x83u);
  EXPECT_EQ(float_to_e4m3_bits(7.5f * 0x1.0p-9f), 0x08u);   // rounds up into the smallest normal
  EXPECT_EQ(float_to_e4m3_bits(1e-6f), 0x00u);
  for (std::uint8_t m = 1; m < 8; ++m) EXPECT_EQ(e4m3_bits_to_float(m), static_cast<float>(m) * 0x1.0p-9f);
}

TEST(E4M3, SaturatesAt448) {
  EXPECT_EQ(float_to_e4m3_bits(449.0f), 0x7eu);
  EXPECT_EQ(float_to_e4m3_bits(464.0f), 0x7eu);  // would round to 480, which does not exist
  EXPECT_EQ(float_to_e4m3_bits(1e4f), 0x7eu);
  EXPECT_EQ(float_to_e4m3_bits(-1e4f), 0xfeu);
  EXPECT_EQ(float_to_e4m3_bits(kInf), 0x7eu);
  EXPECT_EQ(float_to_e4m3_bits(-kInf), 0xfeu);
  EXPECT_EQ(float_to_e4m3_bits(std::numeric_limits<float>::max()), 0x7eu);
  EXPECT_EQ(e4m3_bits_to_float(float_to_e4m3_bits(1e30f)), 448.0f);
}

TEST(E4M3, NaN) {
  const std::uint8_t b = float_to_e4m3_bits(kNaN);
  EXPECT_EQ(b & 0x7fu, 0x7fu);
  EXPECT_TRUE(std::isnan(e4m3_bits_to_float(b)));
  EXPECT_TRUE(std::isnan(e4m3_bits_to_float(0x7f)));
  EXPECT_TRUE(std::isnan(e4m3_bits_to_float(0xff)));
}

// ---------------------------------------------------------------------------------------------
// tf32

TEST(TF32, KeepsTenMantissaBitsRoundingToNearestEven) {
  EXPECT_EQ(round_to_tf32(1.0f), 1.0f);
  EXPECT_EQ(round_to_tf32(1.0f + 0x1.0p-10f), 1.0f + 0x1.0p-10f);              // representable
  EXPECT_EQ(round_to_tf32(1.0f + 0x1.0p-11f), 1.0f);                            // tie, to even
  EXPECT_EQ(round_to_tf32(1.0f + 3.0f * 0x1.0p-11f), 1.0f + 0x1.0p-9f);         // tie, to even
  EXPECT_EQ(round_to_tf32(1.0f + 0x1.0p-11f + 0x1.0p-20f), 1.0f + 0x1.0p-10f);  // above the tie
  EXPECT_EQ(round_to_tf32(-(1.0f + 3.0f * 0x1.0p-11f)), -(1.0f + 0x1.0p-9f));
  EXPECT_EQ(round_to_tf32(2.0f - 0x1.0p-11f), 2.0f);  // carry into the exponent
  EXPECT_EQ(round_to_tf32(3.14159265f), 3.140625f);
  EXPECT_EQ(round_to_tf32(kInf), kInf);
  EXPECT_EQ(round_to_tf32(-kInf), -kInf);
  EXPECT_TRUE(std::isnan(round_to_tf32(kNaN)));
  EXPECT_TRUE(std::isnan(round_to_tf32(std::bit_cast<float>(0x7f800001u))));
}

TEST(TF32, ResultHasTenMantissaBitsAndIsNearest) {
  for (std::uint64_t i = 0; i < 20000; ++i) {
    const auto v = static_cast<float>(uniform(1234, i, -1000.0, 1000.0));
    const float r = round_to_tf32(v);
    ASSERT_EQ(bits(r) & 0x1fffu, 0u) << v;
    // Within half a unit in the last place of a 10-bit mantissa.
    int e = 0;
    std::frexp(v, &e);
    ASSERT_LE(std::fabs(static_cast<double>(r) - v), std::ldexp(1.0, e - 12)) << v;
  }
}

// ---------------------------------------------------------------------------------------------
// to_doubles

template <typename T>
std::vector<unsigned char> as_bytes(const std::vector<T>& v) {
  std::vector<unsigned char> out(v.size() * sizeof(T));
  std::memcpy(out.data(), v.data(), out.size());
  return out;
}

TEST(ToDoubles, EveryDType) {
  {
    const auto b = as_bytes(std::vector<double>{1.5, -2.25, 1e300});
    EXPECT_EQ(to_doubles(DType::f64, b.data(), 3), (std::vector<double>{1.5, -2.25, 1e300}));
  }
  {
    const auto b = as_bytes(std::vector<float>{0.5f, -3.0f, 0.1f});
    EXPECT_EQ(to_doubles(DType::f32, b.data(), 3), (std::vector<double>{0.5, -3.0, static_cast<double>(0.1f)}));
  }
  {
    const auto b = as_bytes(std::vector<std::uint16_t>{0x3c00, 0xc000, 0x0001, 0x7bff});
    EXPECT_EQ(to_doubles(DType::f16, b.data(), 4), (std::vector<double>{1.0, -2.0, 0x1.0p-24, 65504.0}));
  }
  {
    const auto b = as_bytes(std::vector<std::uint16_t>{0x3f80, 0xc040, 0x4049});
    EXPECT_EQ(to_doubles(DType::bf16, b.data(), 3), (std::vector<double>{1.0, -3.0, 3.140625}));
  }
  {
    const std::vector<unsigned char> b{0x38, 0x7e, 0xfe, 0x01};
    EXPECT_EQ(to_doubles(DType::f8e4m3, b.data(), 4), (std::vector<double>{1.0, 448.0, -448.0, 0x1.0p-9}));
  }
  {
    // e5m2 is the top byte of an IEEE half: 1, -2, the largest finite (57344), +inf, smallest subnormal.
    const std::vector<unsigned char> b{0x3c, 0xc0, 0x7b, 0x7c, 0x01};
    const auto d = to_doubles(DType::f8e5m2, b.data(), 5);
    ASSERT_EQ(d.size(), 5u);
    EXPECT_EQ(d[0], 1.0);
    EXPECT_EQ(d[1], -2.0);
    EXPECT_EQ(d[2], 57344.0);
    EXPECT_EQ(d[3], std::numeric_limits<double>::infinity());
    EXPECT_EQ(d[4], 0x1.0p-16);
  }
  {
    const std::vector<unsigned char> b{0x7f, 0x80, 0xff, 0x05};
    EXPECT_EQ(to_doubles(DType::i8, b.data(), 4), (std::vector<double>{127, -128, -1, 5}));
  }
  {
    const auto b = as_bytes(std::vector<std::int32_t>{-5, 2147483647, -2147483647 - 1});
    EXPECT_EQ(to_doubles(DType::i32, b.data(), 3), (std::vector<double>{-5, 2147483647.0, -2147483648.0}));
  }
  {
    const auto b = as_bytes(std::vector<std::int64_t>{-(std::int64_t{1} << 40), 123});
    EXPECT_EQ(to_doubles(DType::i64, b.data(), 2), (std::vector<double>{-1099511627776.0, 123.0}));
  }
}

TEST(ToDoubles, UnalignedSourceAndZeroCount) {
  // Decoding reads through memcpy: an odd offset into a byte buffer must work.
  std::vector<unsigned char> buf(1 + 2 * sizeof(float));
  const float vals[2] = {2.5f, -7.0f};
  std::memcpy(buf.data() + 1, vals, sizeof(vals));
  EXPECT_EQ(to_doubles(DType::f32, buf.data() + 1, 2), (std::vector<double>{2.5, -7.0}));
  EXPECT_TRUE(to_doubles(DType::f64, buf.data(), 0).empty());
}

// ---------------------------------------------------------------------------------------------
// Names

TEST(Names, DTypeRoundTripAndSizes) {
  const std::vector<std::pair<DType, std::size_t>> all{
      {DType::f64, 8}, {DType::f32, 4}, {DType::f16, 2}, {DType::bf16, 2}, {DType::f8e4m3, 1},
      {DType::f8e5m2, 1}, {DType::i8, 1}, {DType::i32, 4}, {DType::i64, 8}};
  std::set<std::string> names;
  for (const auto& [t, size] : all) {
    const std::string name(to_string(t));
    EXPECT_NE(name, "?");
    names.insert(name);
    EXPECT_EQ(parse_dtype(name), t) << name;
    EXPECT_EQ(size_bytes(t), size) << name;
  }
  EXPECT_EQ(names.size(), all.size()) << "names are distinct";
}

TEST(Names, PrecisionRoundTrip) {
  const auto& names = precision_names();
  ASSERT_EQ(names.size(), 6u);
  for (const auto& n : names) EXPECT_EQ(to_string(parse_precision(n)), n);
  EXPECT_EQ(parse_precision("bf16"), Precision::bf16);
  EXPECT_EQ(parse_precision("tf32"), Precision::tf32);
  EXPECT_TRUE(is_integer(Precision::int8));
  for (auto p : {Precision::fp32, Precision::tf32, Precision::fp16, Precision::bf16, Precision::fp8})
    EXPECT_FALSE(is_integer(p)) << to_string(p);
}

TEST(Names, ParseDTypeErrorListsValidNames) {
  const std::string msg = ab::test::usage_error([] { parse_dtype("float"); });
  EXPECT_NE(msg.find("'float'"), std::string::npos) << msg;
  for (const char* n : {"f64", "f32", "f16", "bf16", "f8e4m3", "f8e5m2", "i8", "i32", "i64"})
    EXPECT_NE(msg.find(n), std::string::npos) << n << " missing from: " << msg;
  // Case matters and no partial matches.
  ab::test::usage_error([] { parse_dtype("BF16"); });
  ab::test::usage_error([] { parse_dtype("bf1"); });
  ab::test::usage_error([] { parse_dtype(""); });
}

TEST(Names, ParsePrecisionErrorListsValidNames) {
  const std::string msg = ab::test::usage_error([] { parse_precision("fp64"); });
  EXPECT_NE(msg.find("'fp64'"), std::string::npos) << msg;
  for (const auto& n : precision_names()) EXPECT_NE(msg.find(n), std::string::npos) << n << " missing from: " << msg;
  ab::test::usage_error([] { parse_precision("f32"); });  // a dtype name is not a precision
  // UsageError is an ab::Error, so generic handlers catch it too.
  EXPECT_THROW(parse_precision("x"), Error);
}

// ---------------------------------------------------------------------------------------------
// Errors

TEST(Errors, OneFamilyWhoseKindsSurviveBeingCarriedAsNumbers) {
  const std::vector<ErrorKind> kinds{ErrorKind::error,      ErrorKind::usage,       ErrorKind::out_of_memory,
                                     ErrorKind::unsupported, ErrorKind::skip_point, ErrorKind::check_failed,
                                     ErrorKind::diverged};
  for (const ErrorKind kind : kinds) {
    const auto number = static_cast<std::int64_t>(kind);
    EXPECT_NE(number, 0) << "0 means no error";
    try {
      throw_error(static_cast<ErrorKind>(number), "why " + std::to_string(number));
      ADD_FAILURE() << "throw_error returned";
    } catch (const Error& e) {  // every kind is an ab::Error, so generic handlers catch them all
      EXPECT_EQ(error_kind(e), kind) << number;
      EXPECT_EQ(std::string(e.what()), "why " + std::to_string(number));
    }
  }
  EXPECT_THROW(throw_error(ErrorKind::skip_point, "n/a"), SkipPoint);
  EXPECT_THROW(throw_error(ErrorKind::check_failed, "wrong"), CheckFailed);
  EXPECT_THROW(throw_error(ErrorKind::diverged, "nan"), Diverged);
  // Brace initialisation from the reason, as the workloads throw them.
  try {
    throw SkipPoint{"not for this point"};
  } catch (const Error& e) {
    EXPECT_STREQ(e.what(), "not for this point");
    EXPECT_EQ(error_kind(e), ErrorKind::skip_point);
  }
  EXPECT_EQ(error_kind(std::runtime_error("other")), ErrorKind::error);
  EXPECT_EQ(error_kind(std::bad_alloc()), ErrorKind::error);
  EXPECT_THROW(throw_error(static_cast<ErrorKind>(99), "from a newer build"), Error);
  try {
    throw_error(static_cast<ErrorKind>(99), "x");
  } catch (const Error& e) {
    EXPECT_EQ(error_kind(e), ErrorKind::error);
  }
}

// ---------------------------------------------------------------------------------------------
// RNG

TEST(Rng, UniformStaysInRangeAndCoversIt) {
  double sum = 0, lo_seen = 1e9, hi_seen = -1e9;
  constexpr int kN = 100000;
  int below_zero = 0;
  for (std::uint64_t i = 0; i < kN; ++i) {
    const double v = uniform(42, i, -2.0, 3.0);
    ASSERT_GE(v, -2.0);
    ASSERT_LT(v, 3.0);
    sum += v;
    lo_seen = std::min(lo_seen, v);
    hi_seen = std::max(hi_seen, v);
    below_zero += v < 0;
  }
  EXPECT_NEAR(sum / kN, 0.5, 0.03);
  EXPECT_LT(lo_seen, -1.99);
  EXPECT_GT(hi_seen, 2.99);
  EXPECT_NEAR(static_cast<double>(below_zero) / kN, 0.4, 0.01);
}

// mix64(seed, i) is SplitMix64's (i+1)-th output from state `seed`: Vigna's reference outputs (seeds
// 0 and 1234567), and uniform's 53 top bits scaled, so a changed constant or shift cannot pass.
TEST(Rng, KnownValuesOfSplitMix64AndUniform) {
  EXPECT_EQ(mix64(0, 0), 0xE220A8397B1DCDAFULL);
  EXPECT_EQ(mix64(0, 1), 0x6E789E6AA1B965F4ULL);
  EXPECT_EQ(mix64(0, 2), 0x06C45D188009454FULL);
  const std::uint64_t seed_1234567[] = {6457827717110365317ULL, 3203168211198807973ULL, 9817491932198370423ULL,
                                        4593380528125082431ULL, 16408922859458223821ULL};
  for (std::uint64_t i = 0; i < 5; ++i) EXPECT_EQ(mix64(1234567, i), seed_1234567[i]) << "index " << i;
  EXPECT_EQ(mix64(7, 999), 0x9793FB91046FFFEEULL);
  EXPECT_EQ(uniform(7, 0, 0.0, 1.0), 0.3898297483912715);
  EXPECT_EQ(uniform(7, 1, 0.0, 1.0), 0.01678829452815611);
  EXPECT_EQ(uniform(7, 999, 0.0, 1.0), 0.5921017865225052);
  EXPECT_EQ(uniform(7, 0, -2.0, 2.0), -2.0 + 4.0 * 0.3898297483912715);
  // Usable at compile time, so tables of inputs can be built there.
  static_assert(mix64(0, 0) == 0xE220A8397B1DCDAFULL);
  static_assert(uniform(1, 2, 0.0, 1.0) >= 0.0 && uniform(1, 2, 0.0, 1.0) < 1.0);
}

TEST(Rng, DifferentIndicesAndSeedsGiveDifferentValues) {
  std::set<std::uint64_t> seen;
  for (std::uint64_t i = 0; i < 10000; ++i) seen.insert(mix64(99, i));
  EXPECT_EQ(seen.size(), 10000u);
  int same = 0;
  for (std::uint64_t i = 0; i < 1000; ++i) same += uniform(1, i, 0.0, 1.0) == uniform(2, i, 0.0, 1.0);
  EXPECT_EQ(same, 0);
  EXPECT_NE(uniform(5, 0, 0.0, 1.0), uniform(5, 1, 0.0, 1.0));
}

TEST(Rng, FreshSeedDiffersBetweenCalls) {
  std::set<std::uint64_t> seeds;
  for (int i = 0; i < 1000; ++i) seeds.insert(fresh_seed());
  EXPECT_EQ(seeds.size(), 1000u);
}

TEST(Checked, ProductsAndSumsThatOverflowAreUsageErrorsNamingTheQuantity) {
  constexpr std::int64_t max = std::numeric_limits<std::int64_t>::max();
  EXPECT_EQ(checked_mul(std::int64_t{1} << 31, std::int64_t{1} << 31, "x"), std::int64_t{1} << 62);
  EXPECT_EQ(checked_add(max - 1, 1, "x"), max);
  std::string msg = test::usage_error([] { checked_mul(std::int64_t{1} << 32, std::int64_t{1} << 32, "gemm elements of A"); });
  EXPECT_NE(msg.find("gemm elements of A overflows 64 bits"), std::string::npos) << msg;
  msg = test::usage_error([&] { checked_add(max, 1, "bytes of A and B"); });
  EXPECT_NE(msg.find("bytes of A and B overflows"), std::string::npos) << msg;
  msg = test::usage_error([] { checked_mul(-1, 4, "elements"); });
  EXPECT_NE(msg.find("negative"), std::string::npos) << msg;
  EXPECT_NO_THROW(check_fits_memory(100, 100, "buffers", "cpu"));
  EXPECT_NO_THROW(check_fits_memory(max, 0, "buffers", "cpu")) << "an unknown capacity bounds nothing";
  msg = test::usage_error([] { check_fits_memory(101, 100, "buffers", "cuda:0"); });
  EXPECT_NE(msg.find("more than the 100 bytes of memory of cuda:0"), std::string::npos) << msg;
}

}  // namespace
}  // namespace ab
