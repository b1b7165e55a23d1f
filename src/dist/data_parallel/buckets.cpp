#include "dist/data_parallel/buckets.h"

#include <algorithm>

#include "core/error.h"

namespace ab::dist {

BucketedGradientSync::BucketedGradientSync(const std::vector<nn::Parameter>& parameters, GradientAverager& averager,
                                           std::int64_t bucket_bytes, std::int64_t tail_bytes)
    : averager_(averager), bucket_of_(parameters.size(), -1) {
  if (bucket_bytes < 1) throw UsageError("gradient bucket size must be positive, got " + std::to_string(bucket_bytes));
  if (tail_bytes < 0) throw UsageError("the tail bucket size must be 0 or positive, got " + std::to_string(tail_bytes));
  // The tail: parameters 0..tail_end (in forward order) until they hold tail_bytes.
  std::size_t tail_end = 0;
  bool has_tail = false;
  for (std::int64_t held = 0; tail_bytes > 0 && tail_end < parameters.size() && held < tail_bytes; ++tail_end) {
    if (!parameters[tail_end].grad.defined()) continue;
    held += parameters[tail_end].grad.size_bytes();
    has_tail = true;
  }
  std::int64_t filled = bucket_bytes;
  bool in_tail = false;
  for (std::size_t i = parameters.size(); i-- > 0;) {
    const Tensor& g = parameters[i].grad;
    if (!g.defined()) continue;
    const bool tail_starts = has_tail && i < tail_end && !in_tail;
    in_tail = in_tail || tail_starts;
    if (tail_starts || (!in_tail && filled >= bucket_bytes)) {
      buckets_.emplace_back();
      filled = 0;
    }
    buckets_.back().parameters.push_back(i);
    bucket_of_[i] = static_cast<int>(buckets_.size() - 1);
    filled += g.size_bytes();
  }
  for (Bucket& b : buckets_) {
    const Tensor& first = parameters[b.parameters.front()].grad;
    const auto* lo = static_cast<const unsigned char*>(first.data);
    const unsigned char* hi = lo;
    for (std::size_t i : b.parameters) {
      const Tensor& g = parameters[i].grad;
      if (g.dtype != first.dtype || g.device != first.device)
        throw Error("data parallelism: gradients of '" + parameters[i].name + "' and '" +
                    parameters[b.parameters.front()].name + "' differ in dtype or device");
      const auto* p = static_cast<const unsigned char*>(g.data);
      lo = std::min(lo, p);
      hi = std::max(hi, p + g.size_bytes());
    }
    const auto span = static_cast<std::int64_t>(hi - lo);
    const auto elem = static_cast<std::int64_t>(size_bytes(first.dtype));
    // The block includes the alignment padding between gradients: averaged too, and never read.
    if (span % elem != 0) throw Error("data parallelism: a gradient bucket is not a whole number of elements");
    std::int64_t inside = 0;
    for (std::size_t i : b.parameters) inside += parameters[i].grad.size_bytes();
    if (span > inside + static_cast<std::int64_t>(b.parameters.size()) * kAllocAlignment)
      throw Error("data parallelism: a bucket's gradients are not one contiguous block");
    b.flat = Tensor::describe(first.dtype, Shape{span / elem}).with_data(const_cast<unsigned char*>(lo));
    b.flat.device = first.device;
  }
  pending_.assign(buckets_.size(), 0);
  started_.assign(buckets_.size(), false);
  reported_.assign(parameters.size(), false);
}

void BucketedGradientSync::begin() {
  for (std::size_t b = 0; b < buckets_.size(); ++b) {
    pending_[b] = buckets_[b].parameters.size();
    started_[b] = false;
  }
  std::fill(reported_.begin(), reported_.end(), false);
}

void BucketedGradientSync::start(std::size_t bucket) {
  started_[bucket] = true;
  averager_.average(buckets_[bucket].flat);
}

void BucketedGradientSync::ready(std::size_t parameter_index) {
  if (parameter_index >= bucket_of_.size() || bucket_of_[parameter_index] < 0)
    throw Error("data parallelism: parameter " + std::to_string(parameter_index) + " has no gradient bucket");
  const auto b = static_cast<std::size_t>(bucket_of_[parameter_index]);
  if (reported_[parameter_index] || pending_[b] == 0)
    throw Error("data parallelism: parameter " + std::to_string(parameter_index) + " reported ready twice in one backward");
  reported_[parameter_index] = true;
  if (--pending_[b] == 0) start(b);
}

void BucketedGradientSync::finish() {
  for (std::size_t b = 0; b < buckets_.size(); ++b)
    if (!started_[b]) start(b);
  averager_.join();
}

}  // namespace ab::dist
