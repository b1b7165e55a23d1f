// The CUDA backend against backend/ref: every precision and layout cuBLASLt supports, STREAM,
// copies, errors (Unsupported, OutOfMemory), the event timer and the gradient averager's 16-bit
// wire casts. Skips where no GPU answers.
#include <gtest/gtest.h>

#include <cuda_runtime_api.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>
#include <memory>
#include <string>
#include <tuple>
#include <vector>

#include "backend/collectives.h"
#include "backend/cuda/check.h"
#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/wire_cast.h"
#include "backend/ref/ref.h"
#include "core/dtype.h"
#include "core/error.h"
#include "core/rng.h"
#include "test_support.h"

namespace ab::backend {
namespace {

#define SKIP_WITHOUT_GPU()                                                 \
  if (cuda::device_count() == 0) GTEST_SKIP() << "no CUDA device: driver or GPU absent"

Backend& gpu() {
  static const std::unique_ptr<Backend> backend = cuda::make_backend(0);
  return *backend;
}

bool has_fp8() {
  const std::string& cc = gpu().info().compute_capability;
  const auto dot = cc.find('.');
  return std::stoi(cc.substr(0, dot)) * 10 + std::stoi(cc.substr(dot + 1)) >= 89;
}

TEST(CudaBackend, DeviceInfo) {
  SKIP_WITHOUT_GPU();
  const DeviceInfo info = cuda::device_info(0);
  EXPECT_EQ(info.id, "cuda:0");
  EXPECT_EQ(info.kind, "cuda");
  EXPECT_FALSE(info.name.empty());
  EXPECT_GT(info.memory_bytes, 0);
  EXPECT_GT(info.compute_units, 0);
  EXPECT_GT(info.l2_bytes, 0);
  EXPECT_NE(info.compute_capability.find('.'), std::string::npos);
  EXPECT_FALSE(info.pci_bus_id.empty());
  for (const char* key : {"driver", "cuda_runtime", "cublaslt"}) EXPECT_TRUE(info.versions.contains(key)) << key;
  EXPECT_NE(cuda::native_stream(gpu()), nullptr);
}

TEST(CudaBackend, MissingDeviceThrows) {
  SKIP_WITHOUT_GPU();
  EXPECT_THROW(cuda::device_info(cuda::device_count()), Error);
}

// precision, m, n, k, trans_a, trans_b
using GemmCase = std::tuple<Precision, std::int64_t, std::int64_t, std::int64_t, bool, bool>;

class CudaGemm : public ::testing::TestWithParam<GemmCase> {};

bool narrow(Precision p) { return p == Precision::fp8 || p == Precision::int8; }

TEST_P(CudaGemm, MatchesReferenceOrIsUnsupported) {
  SKIP_WITHOUT_GPU();
  const auto [p, m, n, k, ta, tb] = GetParam();
  const GemmDesc d{p, m, n, k, ta, tb};
  // cuBLASLt runs fp8 and int8 only as TN; int8 needs k % 4 == 0, fp8 k % 16 == 0 and m % 8 == 0.
  const bool misaligned =
      (p == Precision::int8 && k % 4 != 0) || (p == Precision::fp8 && (k % 16 != 0 || m % 8 != 0));
  const bool expect_unsupported =
      (p == Precision::fp8 && !has_fp8()) || (narrow(p) && (!ta || tb || misaligned));
  if (expect_unsupported) {
    EXPECT_THROW(gpu().make_gemm(d), Unsupported);
    return;
  }
  auto plan = gpu().make_gemm(d);
  EXPECT_EQ(plan->algorithm().rfind("cublasLt algo", 0), 0u) << plan->algorithm();
  plan->run();
  const auto a = plan->a_values();
  const auto b = plan->b_values();
  const auto c = plan->c_values();
  ASSERT_EQ(a.size(), static_cast<std::size_t>(m * k));
  ASSERT_EQ(b.size(), static_cast<std::size_t>(k * n));
  ASSERT_EQ(c.size(), static_cast<std::size_t>(m * n));
  EXPECT_TRUE(std::any_of(c.begin(), c.end(), [](double v) { return v != 0.0; })) << "output is all zero";
  if (p == Precision::int8) {
    for (double v : a) ASSERT_TRUE(v >= -127 && v <= 127 && v == std::floor(v)) << v;
  }
  const double err = ref::rel_error(c, ref::gemm(d, a, b));
  EXPECT_LE(err, ref::gemm_tolerance(p)) << plan->algorithm();
}

std::string gemm_case_name(const ::testing::TestParamInfo<GemmCase>& info) {
  const auto [p, m, n, k, ta, tb] = info.param;
  return std::string(to_string(p)) + "_" + std::to_string(m) + "x" + std::to_string(n) + "x" + std::to_string(k) +
         "_" + (ta ? "T" : "N") + (tb ? "T" : "N");
}

INSTANTIATE_TEST_SUITE_P(
    AllPrecisionsAndLayouts, CudaGemm,
    ::testing::Combine(::testing::Values(Precision::fp32, Precision::tf32, Precision::fp16, Precision::bf16,
                                         Precision::fp8, Precision::int8),
                       ::testing::Values(64), ::testing::Values(48), ::testing::Values(80), ::testing::Bool(),
                       ::testing::Bool()),
    gemm_case_name);

// Sizes that are no multiple of 8, as TN: fine for the float types; k = 45 is refused for fp8 and
// int8, k = 36 runs for int8 only (fp8 also needs m % 8 == 0).
INSTANTIATE_TEST_SUITE_P(
    OddShapes, CudaGemm,
    ::testing::Combine(::testing::Values(Precision::fp32, Precision::tf32, Precision::fp16, Precision::bf16,
                                         Precision::fp8, Precision::int8),
                       ::testing::Values(33), ::testing::Values(17), ::testing::Values(45, 36),
                       ::testing::Values(true), ::testing::Values(false)),
    gemm_case_name);

TEST(CudaBackend, NarrowGemmNeedsTN) {
  SKIP_WITHOUT_GPU();
  for (Precision p : {Precision::fp8, Precision::int8}) {
    try {
      gpu().make_gemm({p, 64, 64, 64, false, false});
      ADD_FAILURE() << to_string(p) << " NN did not throw";
    } catch (const Unsupported& e) {
      EXPECT_FALSE(std::string(e.what()).empty());
    }
  }
}

TEST(CudaBackend, HugeGemmIsOutOfMemoryAndBackendSurvives) {
  SKIP_WITHOUT_GPU();
  EXPECT_THROW(gpu().make_gemm({Precision::fp32, 1 << 20, 1 << 20, 1 << 20, false, false}), OutOfMemory);
  // The failed allocation must leave no sticky error behind.
  auto plan = gpu().make_gemm({Precision::fp32, 64, 64, 64, false, false});
  plan->run();
  gpu().synchronize();
}

class CudaStreamOps : public ::testing::TestWithParam<std::tuple<StreamOp, std::int64_t>> {};

TEST_P(CudaStreamOps, MatchesHost) {
  SKIP_WITHOUT_GPU();
  const auto [op, n] = GetParam();
  auto plan = gpu().make_stream(op, n);
  plan->run();
  EXPECT_LT(plan->check(), 1e-12);
}

// Odd lengths exercise the scalar tail; 1 << 22 + 1 also the unrolled main loop.
INSTANTIATE_TEST_SUITE_P(AllOps, CudaStreamOps,
                         ::testing::Combine(::testing::Values(StreamOp::copy, StreamOp::scale, StreamOp::add,
                                                              StreamOp::triad),
                                            ::testing::Values(std::int64_t{1}, std::int64_t{7},
                                                              (std::int64_t{1} << 22) + 1)));

class CudaCopies : public ::testing::TestWithParam<std::tuple<CopyKind, HostMemory>> {};

TEST_P(CudaCopies, CopiesEveryByte) {
  SKIP_WITHOUT_GPU();
  const auto [kind, host] = GetParam();
  for (std::int64_t bytes : {std::int64_t{1}, (std::int64_t{1} << 20) + 3}) {
    auto plan = gpu().make_copy(kind, host, bytes);
    plan->run();
    EXPECT_EQ(plan->check(), 0) << copy_kind_name(kind) << " " << bytes;
  }
}

INSTANTIATE_TEST_SUITE_P(AllKinds, CudaCopies,
                         ::testing::Combine(::testing::Values(CopyKind::host_to_device, CopyKind::device_to_host,
                                                              CopyKind::device_to_device),
                                            ::testing::Values(HostMemory::pageable, HostMemory::pinned)));

TEST(CudaBackend, TimerScalesWithCount) {
  SKIP_WITHOUT_GPU();
  // A triad over 3 x 128 MiB moves ~400 MB: about 100 us on an H200, well above event resolution.
  auto plan = gpu().make_stream(StreamOp::triad, std::int64_t{1} << 24);
  auto timer = gpu().make_timer();
  const auto iteration = [&] { plan->run(); };
  timer->time_batch(iteration, 3);  // warm-up
  double one = 1e30, ten = 1e30;
  for (int i = 0; i < 5; ++i) {  // the minimum of a few tries filters out stray interference
    one = std::min(one, timer->time_batch(iteration, 1));
    ten = std::min(ten, timer->time_batch(iteration, 10));
  }
  EXPECT_GT(one, 0.0);
  EXPECT_GT(ten / one, 7.0);
  EXPECT_LT(ten / one, 13.0);
  const double cold = timer->time_cold(iteration);
  EXPECT_GT(cold, 0.0);
  EXPECT_EQ(timer->time_batch(iteration, 0) >= 0.0, true);
}

// The copy-engine averager's pairwise mean (average_in_place) on fresh random values in f32, bf16
// and f16: data[i] = (data[i] + other[i]) / 2, summed in f32 and rounded once to the dtype, bit for
// bit as the host computes it; at an address the vector loop cannot take; the rest untouched; and
// the two orders of the operands give the same bits (what keeps two ranks' gradients equal).
TEST(CudaCollectives, PairwiseMeanMatchesTheHostBitForBit) {
  SKIP_WITHOUT_GPU();
  auto* stream = static_cast<cudaStream_t>(cuda::native_stream(gpu()));
  const int sm_count = 132;  // only sizes the grid
  const std::uint64_t seed = test::seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  constexpr std::int64_t n = 10007;  // odd: the vector loop leaves a remainder
  for (const DType dtype : {DType::f32, DType::bf16, DType::f16}) {
    SCOPED_TRACE(std::string(to_string(dtype)));
    const std::size_t elem = size_bytes(dtype);
    // Values as the dtype holds them, as f32, and the dtype's bits of an f32.
    const auto to_bits = [dtype](float v) -> std::uint32_t {
      if (dtype == DType::bf16) return float_to_bf16_bits(v);
      if (dtype == DType::f16) return float_to_half_bits(v);
      return std::bit_cast<std::uint32_t>(v);
    };
    const auto to_float = [dtype](std::uint32_t b) {
      if (dtype == DType::bf16) return bf16_bits_to_float(static_cast<std::uint16_t>(b));
      if (dtype == DType::f16) return half_bits_to_float(static_cast<std::uint16_t>(b));
      return std::bit_cast<float>(b);
    };
    std::vector<std::uint32_t> a(n), b(n);
    for (std::int64_t i = 0; i < n; ++i) {
      const auto u = static_cast<std::uint64_t>(i);
      a[static_cast<std::size_t>(i)] = to_bits(static_cast<float>(uniform(seed, u, -8.0, 8.0)));
      b[static_cast<std::size_t>(i)] = to_bits(static_cast<float>(uniform(seed, u + n, -8.0, 8.0)));
    }
    const auto pack = [&](const std::vector<std::uint32_t>& v) {
      std::vector<unsigned char> bytes(v.size() * elem);
      for (std::size_t i = 0; i < v.size(); ++i) std::memcpy(bytes.data() + i * elem, &v[i], elem);  // little end
      return bytes;
    };
    const auto unpack = [&](const std::vector<unsigned char>& bytes) {
      std::vector<std::uint32_t> v(bytes.size() / elem, 0);
      for (std::size_t i = 0; i < v.size(); ++i) std::memcpy(&v[i], bytes.data() + i * elem, elem);
      return v;
    };
    cuda::DeviceBuffer d_x(n * static_cast<std::int64_t>(elem), "mean test x"), d_y(n * static_cast<std::int64_t>(elem), "mean test y");
    // x = mean(x, y) over [offset, offset + count), with x and y given as `first` and `second`.
    const auto mean = [&](const std::vector<std::uint32_t>& first, const std::vector<std::uint32_t>& second,
                          std::int64_t offset, std::int64_t count) {
      const auto x = pack(first), y = pack(second);
      AB_CUDA(cudaMemcpyAsync(d_x.get(), x.data(), x.size(), cudaMemcpyHostToDevice, stream), "mean test input");
      AB_CUDA(cudaMemcpyAsync(d_y.get(), y.data(), y.size(), cudaMemcpyHostToDevice, stream), "mean test input");
      cuda::average_in_place(dtype, d_x.as<unsigned char>() + offset * static_cast<std::int64_t>(elem),
                             d_y.as<unsigned char>() + offset * static_cast<std::int64_t>(elem), count, sm_count, stream);
      std::vector<unsigned char> out(x.size());
      AB_CUDA(cudaMemcpyAsync(out.data(), d_x.get(), out.size(), cudaMemcpyDeviceToHost, stream), "mean test output");
      AB_CUDA(cudaStreamSynchronize(stream), "mean test output");
      return unpack(out);
    };
    for (const auto& [offset, count] : {std::pair<std::int64_t, std::int64_t>{0, n}, {1, n - 2}}) {
      SCOPED_TRACE("offset " + std::to_string(offset));
      const auto ab = mean(a, b, offset, count), ba = mean(b, a, offset, count);
      std::int64_t changed = 0;
      for (std::int64_t i = 0; i < n; ++i) {
        const auto k = static_cast<std::size_t>(i);
        const bool inside = i >= offset && i < offset + count;
        const std::uint32_t want = inside ? to_bits((to_float(a[k]) + to_float(b[k])) * 0.5f) : a[k];
        ASSERT_EQ(ab[k], want) << "element " << i;
        if (inside) {
          ASSERT_EQ(ba[k], want) << "element " << i << ", operands swapped";
        }
        changed += want != a[k] ? 1 : 0;
      }
      EXPECT_GT(changed, n / 2);  // the mean moved most values: not a check of a no-op
    }
  }
  EXPECT_THROW(cuda::average_in_place(DType::i32, nullptr, nullptr, 4, 1, stream), Unsupported);
}

// StreamAverager with a 16-bit wire type on a communicator of one rank (one rank's average is its
// own value, so what comes back is the casts' work): every f32 element rounded to nearest even in
// bf16 / f16 as the host conversions round (ties and f16 subnormals included), widened exactly;
// at an address the vector loop cannot take; and replayed from a captured graph (average()
// allocates nothing). Elements outside the averaged range are untouched.
TEST(CudaCollectives, AveragerInA16BitWireTypeRoundsToNearestEven) {
  SKIP_WITHOUT_GPU();
  const auto group = make_collective_rank(gpu(), 0, 1, collective_unique_id());
  auto* stream = static_cast<cudaStream_t>(cuda::native_stream(gpu()));
  const std::uint64_t seed = test::seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  constexpr std::int64_t n = 100003;  // odd: the vector loop leaves a remainder
  std::vector<float> x(static_cast<std::size_t>(n));
  for (std::int64_t i = 0; i < n; ++i)  // magnitudes 2^-20 .. 2^10: f16's subnormals too
    x[static_cast<std::size_t>(i)] = static_cast<float>(
        std::ldexp(uniform(seed, static_cast<std::uint64_t>(i), -1.0, 1.0),
                   static_cast<int>(std::floor(uniform(seed, static_cast<std::uint64_t>(n + i), -20.0, 11.0)))));
  // Exact ties: bf16's between 1 and 1 + 2^-7 (to even: down) and above it (up); f16's likewise.
  const std::uint32_t ties[] = {0x3f808000u, 0x3f818000u, 0xbf808000u, 0x3f801000u, 0x3f803000u, 0xbf803000u};
  for (std::size_t i = 0; i < std::size(ties); ++i) x[i] = std::bit_cast<float>(ties[i]);
  const std::size_t bytes = x.size() * sizeof(float);
  cuda::DeviceBuffer buf(static_cast<std::int64_t>(bytes), "wire cast test");
  for (const DType wire : {DType::bf16, DType::f16}) {
    SCOPED_TRACE(std::string(to_string(wire)));
    const auto rounded = [wire](float v) {
      return wire == DType::bf16 ? bf16_bits_to_float(float_to_bf16_bits(v)) : half_bits_to_float(float_to_half_bits(v));
    };
    auto averager = group->make_averager(false, backend::AveragerEngine::nccl);
    averager->set_wire_dtype(wire, n);
    // Elements [offset, offset + count) averaged, eagerly or from a captured graph; all n back.
    const auto averaged = [&](std::int64_t offset, std::int64_t count, bool captured) {
      AB_CUDA(cudaMemcpyAsync(buf.get(), x.data(), bytes, cudaMemcpyHostToDevice, stream), "wire cast test input");
      float* p = buf.as<float>() + offset;
      if (captured) {
        cudaGraph_t graph = nullptr;
        cudaGraphExec_t exec = nullptr;
        AB_CUDA(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal), "wire cast test capture");
        averager->average(p, count, DType::f32);
        averager->join();
        AB_CUDA(cudaStreamEndCapture(stream, &graph), "wire cast test capture");
        AB_CUDA(cudaGraphInstantiate(&exec, graph, 0), "wire cast test instantiate");
        AB_CUDA(cudaGraphLaunch(exec, stream), "wire cast test launch");
        AB_CUDA(cudaStreamSynchronize(stream), "wire cast test replay");
        cudaGraphExecDestroy(exec);
        cudaGraphDestroy(graph);
      } else {
        averager->average(p, count, DType::f32);
        averager->join();
      }
      std::vector<float> out(x.size());
      AB_CUDA(cudaMemcpyAsync(out.data(), buf.get(), bytes, cudaMemcpyDeviceToHost, stream), "wire cast test output");
      AB_CUDA(cudaStreamSynchronize(stream), "wire cast test output");
      return out;
    };
    const std::tuple<std::int64_t, std::int64_t, bool> cases[] = {{0, n, false}, {1, n - 2, false}, {0, n, true}};
    for (const auto& [offset, count, captured] : cases) {
      SCOPED_TRACE("offset " + std::to_string(offset) + (captured ? ", captured" : ", eager"));
      const std::vector<float> got = averaged(offset, count, captured);
      std::int64_t moved = 0;
      for (std::int64_t i = 0; i < n; ++i) {
        const float v = x[static_cast<std::size_t>(i)];
        const bool inside = i >= offset && i < offset + count;
        const float want = inside ? rounded(v) : v;
        ASSERT_EQ(std::bit_cast<std::uint32_t>(got[static_cast<std::size_t>(i)]), std::bit_cast<std::uint32_t>(want))
            << "element " << i << ": " << v;
        moved += want != v ? 1 : 0;
      }
      EXPECT_GT(moved, n / 2);  // not a check of values the wire type holds already
    }
    EXPECT_THROW(averager->average(buf.get(), n + 1, DType::f32), Error);  // longer than the staging buffer
    AB_CUDA(cudaStreamSynchronize(stream), "wire cast test");
  }
  // The tie cases round as intended (to even), so the host conversions they are checked against do.
  EXPECT_EQ(float_to_bf16_bits(std::bit_cast<float>(0x3f808000u)), 0x3f80);
  EXPECT_EQ(float_to_bf16_bits(std::bit_cast<float>(0x3f818000u)), 0x3f82);
  EXPECT_EQ(float_to_half_bits(std::bit_cast<float>(0x3f801000u)), 0x3c00);
  EXPECT_EQ(float_to_half_bits(std::bit_cast<float>(0x3f803000u)), 0x3c02);
}

}  // namespace
}  // namespace ab::backend
