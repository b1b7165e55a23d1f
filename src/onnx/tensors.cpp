// Host tensors: TensorProto values (inline, raw or in an external-data file) and node attributes.
#include <climits>
#include <cmath>
#include <cstring>
#include <fstream>

#include "core/checked.h"
#include "core/dtype.h"
#include "onnx/internal.h"

namespace ab::onnx {
namespace {

using DT = pb::TensorProto_DataType;

// Bytes per element of the types read; 0 for those refused.
std::size_t element_bytes(std::int32_t t) {
  switch (t) {
    case DT::TensorProto_DataType_FLOAT:
    case DT::TensorProto_DataType_INT32:
    case DT::TensorProto_DataType_UINT32: return 4;
    case DT::TensorProto_DataType_DOUBLE:
    case DT::TensorProto_DataType_INT64:
    case DT::TensorProto_DataType_UINT64: return 8;
    case DT::TensorProto_DataType_FLOAT16:
    case DT::TensorProto_DataType_BFLOAT16:
    case DT::TensorProto_DataType_INT16:
    case DT::TensorProto_DataType_UINT16: return 2;
    case DT::TensorProto_DataType_INT8:
    case DT::TensorProto_DataType_UINT8:
    case DT::TensorProto_DataType_BOOL: return 1;
    default: return 0;
  }
}

bool is_real(std::int32_t t) {
  return t == DT::TensorProto_DataType_FLOAT || t == DT::TensorProto_DataType_DOUBLE ||
         t == DT::TensorProto_DataType_FLOAT16 || t == DT::TensorProto_DataType_BFLOAT16;
}

template <typename T>
T load_le(const unsigned char* p) {
  T v;
  std::memcpy(&v, p, sizeof(T));
  return v;
}

// One element of raw little-endian bytes, as double (real types) or int64.
void decode_raw(std::int32_t t, const unsigned char* p, double& real, std::int64_t& integer) {
  switch (t) {
    case DT::TensorProto_DataType_FLOAT: real = load_le<float>(p); return;
    case DT::TensorProto_DataType_DOUBLE: real = load_le<double>(p); return;
    case DT::TensorProto_DataType_FLOAT16: real = half_bits_to_float(load_le<std::uint16_t>(p)); return;
    case DT::TensorProto_DataType_BFLOAT16: real = bf16_bits_to_float(load_le<std::uint16_t>(p)); return;
    case DT::TensorProto_DataType_INT64: integer = load_le<std::int64_t>(p); return;
    case DT::TensorProto_DataType_INT32: integer = load_le<std::int32_t>(p); return;
    case DT::TensorProto_DataType_INT16: integer = load_le<std::int16_t>(p); return;
    case DT::TensorProto_DataType_INT8: integer = load_le<std::int8_t>(p); return;
    case DT::TensorProto_DataType_UINT32: integer = load_le<std::uint32_t>(p); return;
    case DT::TensorProto_DataType_UINT16: integer = load_le<std::uint16_t>(p); return;
    case DT::TensorProto_DataType_UINT64: integer = static_cast<std::int64_t>(load_le<std::uint64_t>(p)); return;
    default: integer = p[0] != 0 ? 1 : 0; return;  // UINT8 and BOOL share a byte; UINT8 below
  }
}

// The bytes of an external-data tensor: `location` relative to the model's folder (no absolute
// path, no "..": a model names data beside it), from `offset`, `length` bytes (default: the rest).
std::string external_bytes(const pb::TensorProto& t, const std::filesystem::path& dir, std::size_t want) {
  std::string location;
  std::int64_t offset = 0, length = -1;
  for (const auto& kv : t.external_data()) {
    try {
      if (kv.key() == "location") location = kv.value();
      if (kv.key() == "offset") offset = std::stoll(kv.value());
      if (kv.key() == "length") length = std::stoll(kv.value());
    } catch (const std::exception&) {
      throw UsageError("tensor '" + t.name() + "': external-data " + kv.key() + " '" + kv.value() +
                       "' is not a number");
    }
  }
  const std::filesystem::path rel(location);
  bool escapes = location.empty() || rel.is_absolute();
  for (const auto& part : rel) escapes = escapes || part == "..";
  if (escapes)
    throw UsageError("tensor '" + t.name() + "': external-data location '" + location +
                     "' must name a file beside the model");
  const std::filesystem::path file = dir / rel;
  std::ifstream in(file, std::ios::binary);
  if (!in)
    throw UsageError("tensor '" + t.name() + "': its external-data file " + file.string() +
                     " is missing or unreadable");
  in.seekg(0, std::ios::end);
  const auto size = static_cast<std::int64_t>(in.tellg());
  if (length < 0) length = size - offset;
  if (offset < 0 || length < 0 || offset > size || length > size - offset || static_cast<std::size_t>(length) != want)
    throw UsageError("tensor '" + t.name() + "': external data (offset " + std::to_string(offset) + ", length " +
                     std::to_string(length) + ") does not hold its " + std::to_string(want) + " bytes in " +
                     file.string() + " (" + std::to_string(size) + " bytes)");
  std::string bytes(static_cast<std::size_t>(length), '\0');
  in.seekg(offset);
  in.read(bytes.data(), length);
  if (!in) throw UsageError("tensor '" + t.name() + "': cannot read " + file.string());
  return bytes;
}

// The typed repeated fields, for tensors without raw data.
void read_typed(const pb::TensorProto& t, HostTensor& h, std::size_t n) {
  const auto mismatch = [&](std::size_t got) {
    if (got != n)
      throw UsageError("tensor '" + t.name() + "' holds " + std::to_string(got) + " values for dims " +
                       dims_text(h.dims) + " (a truncated or corrupt file?)");
  };
  switch (t.data_type()) {
    case DT::TensorProto_DataType_FLOAT:
      mismatch(static_cast<std::size_t>(t.float_data_size()));
      h.real.assign(t.float_data().begin(), t.float_data().end());
      return;
    case DT::TensorProto_DataType_DOUBLE:
      mismatch(static_cast<std::size_t>(t.double_data_size()));
      h.real.assign(t.double_data().begin(), t.double_data().end());
      return;
    case DT::TensorProto_DataType_INT64:
      mismatch(static_cast<std::size_t>(t.int64_data_size()));
      h.ints.assign(t.int64_data().begin(), t.int64_data().end());
      return;
    case DT::TensorProto_DataType_UINT32:
    case DT::TensorProto_DataType_UINT64:
      mismatch(static_cast<std::size_t>(t.uint64_data_size()));
      for (auto v : t.uint64_data()) h.ints.push_back(static_cast<std::int64_t>(v));
      return;
    default:
      mismatch(static_cast<std::size_t>(t.int32_data_size()));  // 16-bit floats as bits, small ints, bool
      for (auto v : t.int32_data()) {
        if (t.data_type() == DT::TensorProto_DataType_FLOAT16)
          h.real.push_back(half_bits_to_float(static_cast<std::uint16_t>(v)));
        else if (t.data_type() == DT::TensorProto_DataType_BFLOAT16)
          h.real.push_back(bf16_bits_to_float(static_cast<std::uint16_t>(v)));
        else h.ints.push_back(v);
      }
  }
}

}  // namespace

std::int64_t HostTensor::int_value(std::size_t i) const {
  if (integer) return ints[i];
  const double v = real[i];
  if (!std::isfinite(v) || std::abs(v) > 9.0e15 || v != std::floor(v))
    throw UsageError("constant value " + std::to_string(v) + " is used as an integer");
  return static_cast<std::int64_t>(v);
}

HostTensor make_ints(std::vector<std::int64_t> dims, std::vector<std::int64_t> values) {
  HostTensor t;
  t.integer = true;
  t.dtype = DT::TensorProto_DataType_INT64;
  t.dims = std::move(dims);
  t.ints = std::move(values);
  return t;
}

std::vector<double> HostTensor::values() const {
  std::vector<double> v(static_cast<std::size_t>(numel()));
  for (std::size_t i = 0; i < v.size(); ++i) v[i] = value(i);
  return v;
}

HostTensor make_reals(std::vector<std::int64_t> dims, std::vector<double> values) {
  HostTensor t;
  t.dims = std::move(dims);
  t.real = std::move(values);
  return t;
}

std::int64_t element_count(const std::vector<std::int64_t>& dims, const std::string& what) {
  std::int64_t n = 1;
  for (auto d : dims) {
    if (d < 0) throw UsageError(what + ": negative dimension in " + dims_text(dims));
    n = checked_mul(n, d, what);
    if (n > kMaxConstantElements) throw UsageError(what + ": " + dims_text(dims) + " is too large for a constant");
  }
  return n;
}

std::string dims_text(const std::vector<std::int64_t>& dims) {
  std::string s = "[";
  for (std::size_t i = 0; i < dims.size(); ++i) s += (i ? ", " : "") + std::to_string(dims[i]);
  return s + "]";
}

HostTensor read_tensor(const pb::TensorProto& t, const std::filesystem::path& dir) {
  HostTensor h;
  h.dtype = t.data_type();
  const std::size_t width = element_bytes(h.dtype);
  if (width == 0)
    throw UsageError("tensor '" + t.name() + "' has data type " + pb::TensorProto_DataType_Name(t.data_type()) + " (" +
                     std::to_string(t.data_type()) + "), which the importer does not read");
  h.integer = !is_real(h.dtype);
  h.dims.assign(t.dims().begin(), t.dims().end());
  const auto n = static_cast<std::size_t>(element_count(h.dims, "tensor '" + t.name() + "'"));
  const bool external = t.data_location() == pb::TensorProto_DataLocation_EXTERNAL;
  if (!external && !t.has_raw_data()) {
    read_typed(t, h, n);
    return h;
  }
  const std::string bytes = external ? external_bytes(t, dir, n * width) : t.raw_data();
  if (bytes.size() != n * width)
    throw UsageError("tensor '" + t.name() + "' holds " + std::to_string(bytes.size()) + " bytes for dims " +
                     dims_text(h.dims) + " of " + std::to_string(width) +
                     "-byte elements (a truncated or corrupt file?)");
  if (h.integer) h.ints.resize(n);
  else h.real.resize(n);
  const auto* p = reinterpret_cast<const unsigned char*>(bytes.data());
  for (std::size_t i = 0; i < n; ++i) {
    double r = 0;
    std::int64_t k = 0;
    if (h.dtype == DT::TensorProto_DataType_UINT8) k = p[i];
    else decode_raw(h.dtype, p + i * width, r, k);
    if (h.integer) h.ints[i] = k;
    else h.real[i] = r;
  }
  return h;
}

namespace {
const pb::AttributeProto* find_attr(const Node& n, const std::string& name) {
  for (const auto& a : n.proto->attribute())
    if (a.name() == name) return &a;
  return nullptr;
}
}  // namespace

bool has_attr(const Node& n, const std::string& name) { return find_attr(n, name) != nullptr; }

std::int64_t attr_int(const Node& n, const std::string& name, std::int64_t fallback) {
  const auto* a = find_attr(n, name);
  return a == nullptr ? fallback : a->i();
}

double attr_float(const Node& n, const std::string& name, double fallback) {
  const auto* a = find_attr(n, name);
  return a == nullptr ? fallback : static_cast<double>(a->f());
}

std::string attr_string(const Node& n, const std::string& name, const std::string& fallback) {
  const auto* a = find_attr(n, name);
  return a == nullptr ? fallback : a->s();
}

std::vector<std::int64_t> attr_ints(const Node& n, const std::string& name) {
  const auto* a = find_attr(n, name);
  if (a == nullptr) return {};
  return {a->ints().begin(), a->ints().end()};
}

}  // namespace ab::onnx
