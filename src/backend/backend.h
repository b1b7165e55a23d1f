// The device abstraction: memory, timing and the kernels the workloads call. `cpu` (OpenBLAS,
// threads) is always built; `cuda` (cuBLASLt and the project's .cu kernels) with ACCELBENCH_CUDA.
// Every plan fills its operands with fresh random data and can hand its inputs and outputs back as
// doubles, so the workload checks it against backend/ref before timing.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "measure/timer.h"

namespace ab::backend {

struct DeviceInfo {
  std::string id;    // "cpu", "cuda:0"
  std::string kind;  // "cpu" or "cuda"
  std::string name;  // "NVIDIA H200", or the CPU model
  std::int64_t memory_bytes = 0;
  int compute_units = 0;  // multiprocessors, or logical CPU cores
  std::int64_t l2_bytes = 0;
  std::string compute_capability;  // "9.0"; empty on CPU
  std::string pci_bus_id;
  std::map<std::string, std::string> versions;  // driver, cuda_runtime, cublaslt, cudnn, nccl, openblas
};

// A GEMM in the BLAS column-major convention: C[m,n] = op(A) op(B), op(A) is m x k.
struct GemmDesc {
  Precision precision = Precision::fp32;
  std::int64_t m = 0, n = 0, k = 0;
  bool trans_a = false, trans_b = false;
};

enum class GemmOperand { a, b, c };

class GemmPlan {
 public:
  virtual ~GemmPlan() = default;
  virtual void run() = 0;  // enqueue one C = op(A) op(B) on the backend's stream
  virtual std::string algorithm() const = 0;  // what was chosen, for the record
  // Operands as stored (column-major, op not applied), decoded to doubles; output after the last run().
  virtual std::vector<double> a_values() = 0;
  virtual std::vector<double> b_values() = 0;
  virtual std::vector<double> c_values() = 0;
  // Stored values of one operand at column-major element `indices` (op not applied), decoded to
  // doubles: a sample of the timed operands without copying them whole. Throws Error for an index
  // outside the operand.
  virtual std::vector<double> values_at(GemmOperand which, const std::vector<std::int64_t>& indices) = 0;
};

// STREAM kernels on double arrays of n elements: copy c=a, scale b=s*c, add c=a+b, triad a=b+s*c.
enum class StreamOp { copy, scale, add, triad };
std::string stream_op_name(StreamOp op);
StreamOp parse_stream_op(const std::string& name);  // throws UsageError
int stream_arrays_touched(StreamOp op);            // 2 for copy/scale, 3 for add/triad

class StreamPlan {
 public:
  virtual ~StreamPlan() = default;
  virtual void run() = 0;
  // Runs the op once on fresh random arrays and returns the largest relative error
  // against the same op computed on the host.
  virtual double check() = 0;
};

enum class CopyKind { host_to_device, device_to_host, device_to_device };
enum class HostMemory { pageable, pinned };
std::string copy_kind_name(CopyKind k);
CopyKind parse_copy_kind(const std::string& name);  // throws UsageError: h2d, d2h, d2d

class CopyPlan {
 public:
  virtual ~CopyPlan() = default;
  virtual void run() = 0;
  // Copies once and returns the number of bytes that differ from the source.
  virtual std::int64_t check() = 0;
};

class Backend {
 public:
  virtual ~Backend() = default;
  virtual const DeviceInfo& info() const = 0;
  virtual std::unique_ptr<measure::IterationTimer> make_timer() = 0;
  virtual void synchronize() = 0;
  // Plans allocate their operands; they throw OutOfMemory when the device is full and
  // Unsupported when the device or build cannot run the request (the reason in what()).
  virtual std::unique_ptr<GemmPlan> make_gemm(const GemmDesc& desc) = 0;
  virtual std::unique_ptr<StreamPlan> make_stream(StreamOp op, std::int64_t elements) = 0;
  virtual std::unique_ptr<CopyPlan> make_copy(CopyKind kind, HostMemory host, std::int64_t bytes) = 0;
};

// "cpu" or "cuda:N"; throws UsageError for a malformed id and Error when the device is absent.
std::unique_ptr<Backend> make_backend(const std::string& device_id);
// The best device present: cuda:0 where the build has CUDA and a GPU answers, else cpu.
std::string best_device();
// Every device this build can see, for sysinfo.
std::vector<DeviceInfo> list_devices();
bool cuda_built();

}  // namespace ab::backend
