#include "backend/cpu/cpu_backend.h"

#include <cblas.h>
#include <omp.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <new>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "core/error.h"
#include "core/rng.h"

namespace ab::backend::cpu {
namespace {

// The last-level cache one core reaches, from sysfs (cpu0's highest cache level): glibc's
// sysconf may report the sum over the package's L3 slices (320 MiB on a 2-vCPU EPYC guest whose
// core sees 32 MiB), which would take DRAM-sized working sets for cache-resident ones.
std::int64_t last_level_cache_bytes() {
  std::int64_t best_level = 0, bytes = 0;
  for (int index = 0; index < 16; ++index) {
    const std::string dir = "/sys/devices/system/cpu/cpu0/cache/index" + std::to_string(index) + "/";
    std::ifstream level_in(dir + "level"), size_in(dir + "size");
    std::int64_t level = 0, size = 0;
    std::string unit;
    if (!(level_in >> level) || !(size_in >> size)) continue;
    size_in >> unit;  // "32768K"
    if (unit == "K") size *= 1024;
    else if (unit == "M") size *= 1024 * 1024;
    if (level > best_level) best_level = level, bytes = size;
  }
  if (bytes > 0) return bytes;
  const long l3 = sysconf(_SC_LEVEL3_CACHE_SIZE);
  return l3 > 0 ? l3 : 0;
}

std::string cpu_model() {
  std::ifstream in("/proc/cpuinfo");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("model name", 0) == 0) {
      const auto colon = line.find(':');
      if (colon != std::string::npos) return line.substr(line.find_first_not_of(" \t", colon + 1));
    }
  }
  return "unknown CPU";
}

template <typename T>
std::vector<T> allocate(std::int64_t count, const char* what) {
  if (count < 0) throw UsageError(std::string("negative element count for ") + what);
  try {
    return std::vector<T>(static_cast<std::size_t>(count));
  } catch (const std::length_error&) {
    throw UsageError(std::string(what) + " of " + std::to_string(count) + " elements is larger than host memory can address");
  } catch (const std::bad_alloc&) {
    throw OutOfMemory(std::string("host memory exhausted allocating ") + what + " (" +
                      std::to_string(count * static_cast<std::int64_t>(sizeof(T))) + " bytes)");
  }
}

void fill_uniform(std::vector<float>& v, std::uint64_t seed) {
#pragma omp parallel for schedule(static)
  for (std::size_t i = 0; i < v.size(); ++i) v[i] = static_cast<float>(uniform(seed, i, -1.0, 1.0));
}

void fill_uniform(std::vector<double>& v, std::uint64_t seed) {
#pragma omp parallel for schedule(static)
  for (std::size_t i = 0; i < v.size(); ++i) v[i] = uniform(seed, i, -1.0, 1.0);
}

class CpuGemm final : public GemmPlan {
 public:
  explicit CpuGemm(const GemmDesc& d)
      : desc_(d), a_(allocate<float>(d.m * d.k, "A")), b_(allocate<float>(d.k * d.n, "B")),
        c_(allocate<float>(d.m * d.n, "C")) {
    const std::uint64_t seed = fresh_seed();
    fill_uniform(a_, seed);
    fill_uniform(b_, seed + 1);
  }
  void run() override {
    const auto lda = static_cast<blasint>(desc_.trans_a ? desc_.k : desc_.m);
    const auto ldb = static_cast<blasint>(desc_.trans_b ? desc_.n : desc_.k);
    cblas_sgemm(CblasColMajor, desc_.trans_a ? CblasTrans : CblasNoTrans, desc_.trans_b ? CblasTrans : CblasNoTrans,
                static_cast<blasint>(desc_.m), static_cast<blasint>(desc_.n), static_cast<blasint>(desc_.k), 1.0f,
                a_.data(), lda, b_.data(), ldb, 0.0f, c_.data(), static_cast<blasint>(desc_.m));
  }
  std::string algorithm() const override { return "OpenBLAS cblas_sgemm"; }
  std::vector<double> a_values() override { return {a_.begin(), a_.end()}; }
  std::vector<double> b_values() override { return {b_.begin(), b_.end()}; }
  std::vector<double> c_values() override { return {c_.begin(), c_.end()}; }
  std::vector<double> values_at(GemmOperand which, const std::vector<std::int64_t>& indices) override {
    const std::vector<float>& v = which == GemmOperand::a ? a_ : which == GemmOperand::b ? b_ : c_;
    std::vector<double> out;
    out.reserve(indices.size());
    for (const std::int64_t i : indices) {
      if (i < 0 || static_cast<std::size_t>(i) >= v.size()) throw Error("gemm operand index " + std::to_string(i) + " out of range");
      out.push_back(v[static_cast<std::size_t>(i)]);
    }
    return out;
  }

 private:
  GemmDesc desc_;
  std::vector<float> a_, b_, c_;
};

constexpr double kStreamScalar = 3.0;

class CpuStream final : public StreamPlan {
 public:
  CpuStream(StreamOp op, std::int64_t n)
      : op_(op), a_(allocate<double>(n, "a")), b_(allocate<double>(n, "b")), c_(allocate<double>(n, "c")) {
    randomise();
  }
  void run() override {
    const auto n = static_cast<std::int64_t>(a_.size());
    double* a = a_.data();
    double* b = b_.data();
    double* c = c_.data();
    switch (op_) {
      case StreamOp::copy:
#pragma omp parallel for simd schedule(static)
        for (std::int64_t i = 0; i < n; ++i) c[i] = a[i];
        break;
      case StreamOp::scale:
#pragma omp parallel for simd schedule(static)
        for (std::int64_t i = 0; i < n; ++i) b[i] = kStreamScalar * c[i];
        break;
      case StreamOp::add:
#pragma omp parallel for simd schedule(static)
        for (std::int64_t i = 0; i < n; ++i) c[i] = a[i] + b[i];
        break;
      case StreamOp::triad:
#pragma omp parallel for simd schedule(static)
        for (std::int64_t i = 0; i < n; ++i) a[i] = b[i] + kStreamScalar * c[i];
        break;
    }
  }
  double check() override {
    randomise();
    const std::vector<double> a0 = a_, b0 = b_, c0 = c_;
    run();
    double worst = 0;
    for (std::size_t i = 0; i < a_.size(); ++i) {
      double got = 0, want = 0;
      switch (op_) {
        case StreamOp::copy: got = c_[i]; want = a0[i]; break;
        case StreamOp::scale: got = b_[i]; want = kStreamScalar * c0[i]; break;
        case StreamOp::add: got = c_[i]; want = a0[i] + b0[i]; break;
        case StreamOp::triad: got = a_[i]; want = b0[i] + kStreamScalar * c0[i]; break;
      }
      const double err = std::fabs(got - want) / std::max(std::fabs(want), 1e-300);
      if (!(err <= worst)) worst = std::isnan(err) ? INFINITY : err;
    }
    return worst;
  }

 private:
  void randomise() {
    const std::uint64_t seed = fresh_seed();
    fill_uniform(a_, seed);
    fill_uniform(b_, seed + 1);
    fill_uniform(c_, seed + 2);
  }
  StreamOp op_;
  std::vector<double> a_, b_, c_;
};

class CpuBackend final : public Backend {
 public:
  CpuBackend() : info_(device_info()) {}
  const DeviceInfo& info() const override { return info_; }
  std::unique_ptr<measure::IterationTimer> make_timer() override {
    return std::make_unique<measure::SteadyClockTimer>();
  }
  void synchronize() override {}
  std::unique_ptr<GemmPlan> make_gemm(const GemmDesc& desc) override {
    if (desc.precision != Precision::fp32)
      throw Unsupported("precision " + std::string(to_string(desc.precision)) +
                        " has no CPU implementation; the CPU path runs fp32 through OpenBLAS");
    return std::make_unique<CpuGemm>(desc);
  }
  std::unique_ptr<StreamPlan> make_stream(StreamOp op, std::int64_t elements) override {
    return std::make_unique<CpuStream>(op, elements);
  }
  std::unique_ptr<CopyPlan> make_copy(CopyKind, HostMemory, std::int64_t) override {
    throw Unsupported("copy measures host-device transfers; the cpu device has no separate memory");
  }

 private:
  DeviceInfo info_;
};

}  // namespace

DeviceInfo device_info() {
  DeviceInfo d;
  d.id = "cpu";
  d.kind = "cpu";
  d.name = cpu_model();
  d.memory_bytes = static_cast<std::int64_t>(sysconf(_SC_PHYS_PAGES)) * sysconf(_SC_PAGE_SIZE);
  d.compute_units = static_cast<int>(std::thread::hardware_concurrency());
  d.l2_bytes = last_level_cache_bytes();
  d.versions["openblas"] = openblas_get_config();
  d.versions["openmp_threads"] = std::to_string(omp_get_max_threads());
  return d;
}

std::unique_ptr<Backend> make_backend() { return std::make_unique<CpuBackend>(); }

}  // namespace ab::backend::cpu
