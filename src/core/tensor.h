// Shapes, strides, layouts and Tensor: a non-owning view on host or device memory. Storage comes
// from an Allocator so that a device (pooling) allocator plugs in behind the same interface.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <memory>
#include <string>
#include <vector>

#include "core/dtype.h"

namespace ab {

// Dims of a tensor, outermost first. Rank-4 activations are always given in logical NCHW order
// (filters in KCRS), whatever their memory layout: the layout lives in the strides, as in cuDNN.
class Shape {
 public:
  static constexpr int kMaxRank = 6;

  Shape() = default;
  Shape(std::initializer_list<std::int64_t> dims);  // throws Error past kMaxRank or on a negative dim

  int rank() const { return rank_; }
  std::int64_t operator[](int i) const { return dims_[static_cast<std::size_t>(i)]; }
  std::int64_t& operator[](int i) { return dims_[static_cast<std::size_t>(i)]; }
  std::int64_t numel() const;  // 1 for rank 0
  void push_back(std::int64_t dim);
  std::string to_string() const;  // "[2, 3, 8, 8]"

  friend bool operator==(const Shape& a, const Shape& b);

 private:
  std::array<std::int64_t, kMaxRank> dims_{};
  int rank_ = 0;
};

// Element strides (not bytes), one per dim of the matching Shape.
using Strides = Shape;

// Memory order of rank-4 tensors. Other ranks are always row-major (contiguous, last dim fastest).
enum class Layout { nchw, nhwc };
std::string_view to_string(Layout l);
Layout parse_layout(std::string_view name);  // throws UsageError

// Contiguous strides of `shape` in `layout` (NHWC: C fastest, then W, H, N; filters KRSC).
Strides contiguous_strides(const Shape& shape, Layout layout);
// Whether strides a and b of `shape` place every element at one offset (they may differ only in
// dims of size 1, which no offset reads).
bool same_order(const Shape& shape, const Strides& a, const Strides& b);

enum class DeviceKind { host, cuda };
std::string_view to_string(DeviceKind d);

// A view: pointer + element type + logical shape + element strides + device. It owns nothing;
// `data` may be null for a descriptor (shape inference, planning, algorithm search).
struct Tensor {
  void* data = nullptr;
  DType dtype = DType::f32;
  Shape shape;
  Strides strides;
  Layout layout = Layout::nchw;
  DeviceKind device = DeviceKind::host;

  // A descriptor with contiguous strides for `layout`.
  static Tensor describe(DType dtype, const Shape& shape, Layout layout = Layout::nchw,
                         DeviceKind device = DeviceKind::host);

  std::int64_t numel() const { return shape.numel(); }
  // Bytes covered by the view (its contiguous extent when strides are contiguous).
  std::int64_t size_bytes() const;
  bool is_contiguous() const { return strides == contiguous_strides(shape, layout); }
  bool defined() const { return data != nullptr; }
  // The same view pointing at `p`.
  Tensor with_data(void* p) const;
  // "f32[2, 3, 8, 8] nhwc"
  std::string to_string() const;

  template <typename T>
  T* as() const {
    return static_cast<T*>(data);
  }
};

// Host tensors only (throw Error otherwise): element values in logical row-major order, whatever
// the strides, converted to/from double. For tests and for initialising parameters on the host.
std::vector<double> read_host(const Tensor& t);
void write_host(const Tensor& t, const std::vector<double>& values);  // throws Error on size mismatch

// Device memory is handed out aligned to this many bytes: what cuDNN and vectorised kernels want,
// and what the memory planner rounds every buffer to.
inline constexpr std::int64_t kAllocAlignment = 256;
std::int64_t align_up(std::int64_t bytes, std::int64_t alignment = kAllocAlignment);

// Where a backend's memory comes from. The host allocator below is plain aligned new; the engine's
// CUDA kernels (nn/cuda) provide a pooling allocator (cached blocks by size, freed at teardown)
// that graphs and optimizers use through this same interface.
class Allocator {
 public:
  virtual ~Allocator() = default;
  virtual DeviceKind device() const = 0;
  // At least `bytes` bytes aligned to kAllocAlignment; throws OutOfMemory naming the size.
  virtual void* allocate(std::int64_t bytes) = 0;
  virtual void deallocate(void* p, std::int64_t bytes) noexcept = 0;
  // Bookkeeping for reports: bytes handed out now, and the most at any time.
  std::int64_t bytes_in_use() const { return in_use_bytes_; }
  std::int64_t peak_bytes() const { return peak_bytes_; }

 protected:
  void note_allocate(std::int64_t bytes);
  void note_deallocate(std::int64_t bytes) noexcept { in_use_bytes_ -= bytes; }

 private:
  std::int64_t in_use_bytes_ = 0;
  std::int64_t peak_bytes_ = 0;
};

class HostAllocator final : public Allocator {
 public:
  DeviceKind device() const override { return DeviceKind::host; }
  void* allocate(std::int64_t bytes) override;
  void deallocate(void* p, std::int64_t bytes) noexcept override;
};

// Owning storage from an Allocator; move-only, released on destruction. Zero bytes holds nothing.
class Buffer {
 public:
  Buffer() = default;
  Buffer(Allocator& allocator, std::int64_t bytes);
  ~Buffer();
  Buffer(Buffer&& other) noexcept;
  Buffer& operator=(Buffer&& other) noexcept;
  Buffer(const Buffer&) = delete;
  Buffer& operator=(const Buffer&) = delete;

  void* data() const { return data_; }
  std::int64_t size_bytes() const { return bytes_; }
  DeviceKind device() const;
  // A view of `desc`'s shape placed `offset_bytes` into this buffer; throws Error if it overruns.
  Tensor view(const Tensor& desc, std::int64_t offset_bytes = 0) const;

 private:
  void release() noexcept;
  Allocator* allocator_ = nullptr;
  void* data_ = nullptr;
  std::int64_t bytes_ = 0;
};

}  // namespace ab
