#include "core/tensor.h"

#include <cmath>
#include <cstring>
#include <new>
#include <utility>

#include "core/error.h"

namespace ab {

Shape::Shape(std::initializer_list<std::int64_t> dims) {
  for (std::int64_t d : dims) push_back(d);
}

void Shape::push_back(std::int64_t dim) {
  if (rank_ == kMaxRank) throw Error("shape rank above " + std::to_string(kMaxRank));
  if (dim < 0) throw Error("negative dimension " + std::to_string(dim));
  dims_[static_cast<std::size_t>(rank_++)] = dim;
}

std::int64_t Shape::numel() const {
  std::int64_t n = 1;
  for (int i = 0; i < rank_; ++i) n *= (*this)[i];
  return n;
}

std::string Shape::to_string() const {
  std::string out = "[";
  for (int i = 0; i < rank_; ++i) {
    if (i) out += ", ";
    out += std::to_string((*this)[i]);
  }
  return out + "]";
}

bool operator==(const Shape& a, const Shape& b) {
  if (a.rank_ != b.rank_) return false;
  for (int i = 0; i < a.rank_; ++i)
    if (a[i] != b[i]) return false;
  return true;
}

std::string_view to_string(Layout l) { return l == Layout::nchw ? "nchw" : "nhwc"; }

Layout parse_layout(std::string_view name) {
  if (name == "nchw") return Layout::nchw;
  if (name == "nhwc") return Layout::nhwc;
  throw UsageError("unknown layout '" + std::string(name) + "'; valid: nchw, nhwc");
}

std::string_view to_string(DeviceKind d) { return d == DeviceKind::host ? "host" : "cuda"; }

Strides contiguous_strides(const Shape& shape, Layout layout) {
  Strides s = shape;
  const int r = shape.rank();
  if (r == 4 && layout == Layout::nhwc) {
    // Logical [N, C, H, W] stored N, H, W, C.
    s[1] = 1;
    s[3] = shape[1];
    s[2] = shape[3] * shape[1];
    s[0] = shape[2] * s[2];
    return s;
  }
  std::int64_t stride = 1;
  for (int i = r - 1; i >= 0; --i) {
    s[i] = stride;
    stride *= shape[i];
  }
  return s;
}

bool same_order(const Shape& shape, const Strides& a, const Strides& b) {
  if (a.rank() != shape.rank() || b.rank() != shape.rank()) return false;
  for (int i = 0; i < shape.rank(); ++i)
    if (shape[i] > 1 && a[i] != b[i]) return false;
  return true;
}

Tensor Tensor::describe(DType dtype, const Shape& shape, Layout layout, DeviceKind device) {
  Tensor t;
  t.dtype = dtype;
  t.shape = shape;
  t.layout = layout;
  t.strides = contiguous_strides(shape, layout);
  t.device = device;
  return t;
}

std::int64_t Tensor::size_bytes() const {
  if (shape.numel() == 0) return 0;
  // The extent is the offset of the last element plus one, for any non-negative strides.
  std::int64_t last = 0;
  for (int i = 0; i < shape.rank(); ++i) last += (shape[i] - 1) * strides[i];
  return (last + 1) * static_cast<std::int64_t>(ab::size_bytes(dtype));
}

Tensor Tensor::with_data(void* p) const {
  Tensor t = *this;
  t.data = p;
  return t;
}

std::string Tensor::to_string() const {
  std::string out = std::string(ab::to_string(dtype)) + shape.to_string();
  if (shape.rank() == 4) out += " " + std::string(ab::to_string(layout));
  return out;
}

namespace {

// Calls f(logical_index, element_offset) for every element in logical row-major order.
template <typename F>
void for_each_offset(const Tensor& t, F&& f) {
  const int r = t.shape.rank();
  const std::int64_t n = t.numel();
  std::array<std::int64_t, Shape::kMaxRank> idx{};
  std::int64_t offset = 0;
  for (std::int64_t i = 0; i < n; ++i) {
    f(i, offset);
    for (int d = r - 1; d >= 0; --d) {
      const auto du = static_cast<std::size_t>(d);
      offset += t.strides[d];
      if (++idx[du] < t.shape[d]) break;
      offset -= t.strides[d] * t.shape[d];
      idx[du] = 0;
    }
  }
}

void require_host(const Tensor& t, const char* what) {
  if (t.device != DeviceKind::host) throw Error(std::string(what) + ": tensor is on the device, not the host");
  if (t.data == nullptr && t.numel() > 0) throw Error(std::string(what) + ": tensor has no storage");
}

}  // namespace

std::vector<double> read_host(const Tensor& t) {
  require_host(t, "read_host");
  std::vector<double> out(static_cast<std::size_t>(t.numel()));
  const auto* base = static_cast<const unsigned char*>(t.data);
  const auto esize = static_cast<std::int64_t>(size_bytes(t.dtype));
  for_each_offset(t, [&](std::int64_t i, std::int64_t off) {
    const unsigned char* p = base + off * esize;
    double& v = out[static_cast<std::size_t>(i)];
    // The two storage types of the reference path are decoded inline; others go through dtype.h.
    if (t.dtype == DType::f32) {
      float f;
      std::memcpy(&f, p, 4);
      v = f;
    } else if (t.dtype == DType::f64) {
      std::memcpy(&v, p, 8);
    } else {
      v = to_doubles(t.dtype, p, 1)[0];
    }
  });
  return out;
}

void write_host(const Tensor& t, const std::vector<double>& values) {
  require_host(t, "write_host");
  if (static_cast<std::int64_t>(values.size()) != t.numel())
    throw Error("write_host: " + std::to_string(values.size()) + " values for " + t.to_string());
  auto* base = static_cast<unsigned char*>(t.data);
  const auto esize = static_cast<std::int64_t>(size_bytes(t.dtype));
  for_each_offset(t, [&](std::int64_t i, std::int64_t off) {
    const double v = values[static_cast<std::size_t>(i)];
    void* p = base + off * esize;
    switch (t.dtype) {
      case DType::f64: std::memcpy(p, &v, 8); break;
      case DType::f32: { const auto f = static_cast<float>(v); std::memcpy(p, &f, 4); break; }
      case DType::f16: { const auto h = float_to_half_bits(static_cast<float>(v)); std::memcpy(p, &h, 2); break; }
      case DType::bf16: { const auto b = float_to_bf16_bits(static_cast<float>(v)); std::memcpy(p, &b, 2); break; }
      case DType::f8e4m3: *static_cast<std::uint8_t*>(p) = float_to_e4m3_bits(static_cast<float>(v)); break;
      case DType::i8: *static_cast<std::int8_t*>(p) = static_cast<std::int8_t>(std::lround(v)); break;
      case DType::i32: { const auto x = static_cast<std::int32_t>(std::llround(v)); std::memcpy(p, &x, 4); break; }
      case DType::i64: { const auto x = static_cast<std::int64_t>(std::llround(v)); std::memcpy(p, &x, 8); break; }
      case DType::f8e5m2: throw Unsupported("write_host: no host encoder for f8e5m2");
    }
  });
}

std::int64_t align_up(std::int64_t bytes, std::int64_t alignment) {
  return (bytes + alignment - 1) / alignment * alignment;
}

void Allocator::note_allocate(std::int64_t bytes) {
  in_use_bytes_ += bytes;
  if (in_use_bytes_ > peak_bytes_) peak_bytes_ = in_use_bytes_;
}

void* HostAllocator::allocate(std::int64_t bytes) {
  if (bytes <= 0) return nullptr;
  try {
    void* p = ::operator new(static_cast<std::size_t>(align_up(bytes)), std::align_val_t{kAllocAlignment});
    note_allocate(bytes);
    return p;
  } catch (const std::bad_alloc&) {
    throw OutOfMemory("host memory exhausted allocating " + std::to_string(bytes) + " bytes");
  }
}

void HostAllocator::deallocate(void* p, std::int64_t bytes) noexcept {
  if (p == nullptr) return;
  ::operator delete(p, std::align_val_t{kAllocAlignment});
  note_deallocate(bytes);
}

Buffer::Buffer(Allocator& allocator, std::int64_t bytes)
    : allocator_(&allocator), data_(allocator.allocate(bytes)), bytes_(bytes > 0 ? bytes : 0) {}

Buffer::~Buffer() { release(); }

Buffer::Buffer(Buffer&& other) noexcept
    : allocator_(std::exchange(other.allocator_, nullptr)), data_(std::exchange(other.data_, nullptr)),
      bytes_(std::exchange(other.bytes_, 0)) {}

Buffer& Buffer::operator=(Buffer&& other) noexcept {
  if (this != &other) {
    release();
    allocator_ = std::exchange(other.allocator_, nullptr);
    data_ = std::exchange(other.data_, nullptr);
    bytes_ = std::exchange(other.bytes_, 0);
  }
  return *this;
}

void Buffer::release() noexcept {
  if (allocator_ != nullptr && data_ != nullptr) allocator_->deallocate(data_, bytes_);
  data_ = nullptr;
  bytes_ = 0;
}

DeviceKind Buffer::device() const { return allocator_ ? allocator_->device() : DeviceKind::host; }

Tensor Buffer::view(const Tensor& desc, std::int64_t offset_bytes) const {
  if (offset_bytes < 0 || offset_bytes + desc.size_bytes() > bytes_)
    throw Error("view of " + desc.to_string() + " at byte " + std::to_string(offset_bytes) + " overruns a buffer of " +
                std::to_string(bytes_) + " bytes");
  Tensor t = desc;
  t.data = static_cast<unsigned char*>(data_) + offset_bytes;
  t.device = device();
  return t;
}

}  // namespace ab
