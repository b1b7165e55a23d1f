// Optimizer steps (SGD, LARS) and mixed precision (casts, unscale-and-check, the loss-scale rule)
// (pointwise.h). The shared engine: pointwise_common.cuh.
#include <limits>

#include "backend/cuda/pair_mean.cuh"
#include "nn/cuda/pointwise_common.cuh"

namespace ab::nn::cuda_pointwise {
namespace {

// PyTorch's SGD; the step flag is read once per thread.
template <typename T>
struct SgdOp : OpBase {
  static constexpr int kVec = vec_of<T>();
  T* w;
  const T* g;
  T* v;
  Math<T> lr, momentum, weight_decay;
  const int32_t* skip_if;
  bool skip = false;
  __device__ void begin() { skip = skip_if != nullptr && *skip_if != 0; }
  __device__ bool skipped() const { return skip; }
  template <int W>
  __device__ void apply(int64_t i) const {
    auto vw = load<W>(w, i);
    const auto vg = load<W>(g, i);
    auto vv = load<W>(v, i);
#pragma unroll
    for (int j = 0; j < W; ++j) {
      const Math<T> wj = to_math(vw.v[j]);
      const Math<T> vel = momentum * to_math(vv.v[j]) + (to_math(vg.v[j]) + weight_decay * wj);
      vv.v[j] = from_math<T>(vel);
      vw.v[j] = from_math<T>(wj - lr * vel);
    }
    store<W>(v, i, vv);
    store<W>(w, i, vw);
  }
};

// LARS pass 1: each block writes its sums of w^2 and g^2 (f64) to partials[2b], partials[2b + 1].
template <typename T>
struct NormsOp : OpBase {
  static constexpr int kVec = vec_of<T>();
  const T* w;
  const T* g;
  double* partials;
  double w2 = 0.0, g2 = 0.0;
  template <int W>
  __device__ void apply(int64_t i) {
    const auto vw = load<W>(w, i);
    const auto vg = load<W>(g, i);
#pragma unroll
    for (int j = 0; j < W; ++j) {
      const double a = to_math(vw.v[j]), b = to_math(vg.v[j]);
      w2 += a * a;
      g2 += b * b;
    }
  }
  __device__ void end() {
    const double bw = block_sum(w2);
    const double bg = block_sum(g2);
    if (threadIdx.x == 0) {
      partials[2 * blockIdx.x] = bw;
      partials[2 * blockIdx.x + 1] = bg;
    }
  }
};

// LARS pass 2: every block sums the partials in the same order (so all agree on the trust ratio
// bit for bit), then applies the momentum step with the layer's learning rate.
template <typename T>
struct LarsOp : OpBase {
  static constexpr int kVec = vec_of<T>();
  T* w;
  const T* g;
  T* v;
  Math<T> momentum, weight_decay;
  double lr, trust_coefficient, weight_decay_f64, epsilon;
  const double* partials;  // null: adapt off, trust 1
  int partial_blocks;
  const int32_t* skip_if;
  bool skip = false;
  Math<T> rate = 0;
  __device__ void begin() {
    skip = skip_if != nullptr && *skip_if != 0;
    if (skip) return;  // every thread of the grid reads the same flag, so none reaches block_sum
    double trust = 1.0;
    if (partials != nullptr) {
      double w2 = 0.0, g2 = 0.0;
      for (int b = threadIdx.x; b < partial_blocks; b += blockDim.x) {
        w2 += partials[2 * b];
        g2 += partials[2 * b + 1];
      }
      w2 = block_sum(w2);
      g2 = block_sum(g2);
      const double wn = sqrt(w2), gn = sqrt(g2);
      if (wn > 0.0 && gn > 0.0) trust = trust_coefficient * wn / (gn + weight_decay_f64 * wn + epsilon);
    }
    rate = static_cast<Math<T>>(lr * trust);
  }
  __device__ bool skipped() const { return skip; }
  template <int W>
  __device__ void apply(int64_t i) const {
    auto vw = load<W>(w, i);
    const auto vg = load<W>(g, i);
    auto vv = load<W>(v, i);
#pragma unroll
    for (int j = 0; j < W; ++j) {
      const Math<T> wj = to_math(vw.v[j]);
      const Math<T> vel = momentum * to_math(vv.v[j]) + rate * (to_math(vg.v[j]) + weight_decay * wj);
      vv.v[j] = from_math<T>(vel);
      vw.v[j] = from_math<T>(wj - vel);
    }
    store<W>(v, i, vv);
    store<W>(w, i, vw);
  }
};

template <typename S, typename D>
struct CastOp : OpBase {
  static constexpr int kVec = static_cast<int>(16 / std::max(sizeof(S), sizeof(D)));
  const S* src;
  D* dst;
  template <int W>
  __device__ void apply(int64_t i) const {
    const auto a = load<W>(src, i);
    Chunk<D, W> o;
#pragma unroll
    for (int j = 0; j < W; ++j) o.v[j] = convert<D>(a.v[j]);
    store<W>(dst, i, o);
  }
};

// PyTorch's _amp_foreach_non_finite_check_and_unscale_ (the scaled input is checked), and as the
// reference, the unscaled value too.
template <typename T>
struct UnscaleOp : OpBase {
  static constexpr int kVec = vec_of<T>();
  T* g;
  const float* scale;
  int32_t* found;
  Math<T> inv = 1;
  bool bad = false;
  __device__ void begin() { inv = static_cast<Math<T>>(1.0f / *scale); }
  template <int W>
  __device__ void apply(int64_t i) {
    auto vg = load<W>(g, i);
#pragma unroll
    for (int j = 0; j < W; ++j) {
      const Math<T> x = to_math(vg.v[j]);
      const Math<T> y = x * inv;
      bad |= !is_finite_value(x) || !is_finite_value(y);
      vg.v[j] = from_math<T>(y);
    }
    store<W>(g, i, vg);
  }
  // One store per block that saw a non-finite value; every writer stores 1, so order is moot.
  __device__ void end() {
    if (__syncthreads_or(bad) && threadIdx.x == 0) *found = 1;
  }
};

// ---- loss scale

// Products in f64 then rounded, as the reference forms them.
__global__ void update_loss_scale_kernel(float* scale, int32_t* good_steps, int32_t* found, double growth,
                                         double backoff, int64_t growth_interval) {
  if (*found != 0) {
    *scale = __double2float_rn(*scale * backoff);
    *good_steps = 0;
  } else {
    const int64_t good = int64_t{*good_steps} + 1;
    if (good >= growth_interval) {
      const float grown = __double2float_rn(*scale * growth);
      if (isfinite(grown)) *scale = grown;  // as GradScaler: never grow into Inf
      *good_steps = 0;
    } else {
      *good_steps = static_cast<int32_t>(good);
    }
  }
  *found = 0;
}

// sgd_update_many: one launch for up to kSegmentsPerLaunch f32 parameters. Each parameter gets
// ceil(n / kElementsPerBlock) blocks; a block finds its parameter among the launch's by its index.
constexpr int kManyThreads = 256;
constexpr int kSegmentsPerLaunch = 40;  // 40 x 64 bytes of pointers: under the 4 KB of kernel parameters
constexpr std::int64_t kElementsPerBlock = 8192;

struct ManySegment {
  float* w;
  const float* g;
  const float* g_partner;
  float* v;
  void* copy;
  std::int64_t n;
  float weight_decay;
  int first_block;
  int vector;  // w, g, v 16-byte aligned and copy 8-byte aligned: four elements per access
};
struct ManyArgs {
  ManySegment seg[kSegmentsPerLaunch];
  int count;
  float lr, momentum;
  const int32_t* skip_if;
};

template <typename C>
struct alignas(4 * sizeof(C)) Quad {
  C v[4];
};

// SgdOp<float>'s arithmetic, element by element.
__device__ __forceinline__ void sgd_element(float& w, float g, float& v, float lr, float momentum, float decay) {
  const float vel = momentum * v + (g + decay * w);
  v = vel;
  w = w - lr * vel;
}

using backend::cuda::pair_mean;  // the copy-engine mean kernel's arithmetic, bit for bit

// C: the copies' dtype; float = no copies. Partner: average each g with g_partner first.
template <typename C, bool Partner>
__global__ void __launch_bounds__(kManyThreads) sgd_many_kernel(const __grid_constant__ ManyArgs a) {
  if (a.skip_if != nullptr && *a.skip_if != 0) return;
  int s = 0;
  while (s + 1 < a.count && a.seg[s + 1].first_block <= static_cast<int>(blockIdx.x)) ++s;
  const ManySegment& p = a.seg[s];
  const int64_t begin = int64_t{static_cast<int>(blockIdx.x) - p.first_block} * kElementsPerBlock;
  const int64_t end = begin + kElementsPerBlock < p.n ? begin + kElementsPerBlock : p.n;
  C* copy = static_cast<C*>(p.copy);
  int64_t rest = begin;
  if (p.vector) {
    rest = begin + (end - begin) / 4 * 4;
    for (int64_t i = begin + 4 * int64_t{threadIdx.x}; i < rest; i += 4 * kManyThreads) {
      float4 w = *reinterpret_cast<const float4*>(p.w + i);
      float4 g = *reinterpret_cast<const float4*>(p.g + i);
      if constexpr (Partner) {
        const float4 h = *reinterpret_cast<const float4*>(p.g_partner + i);
        g = make_float4(pair_mean(g.x, h.x), pair_mean(g.y, h.y), pair_mean(g.z, h.z), pair_mean(g.w, h.w));
      }
      float4 v = *reinterpret_cast<const float4*>(p.v + i);
      sgd_element(w.x, g.x, v.x, a.lr, a.momentum, p.weight_decay);
      sgd_element(w.y, g.y, v.y, a.lr, a.momentum, p.weight_decay);
      sgd_element(w.z, g.z, v.z, a.lr, a.momentum, p.weight_decay);
      sgd_element(w.w, g.w, v.w, a.lr, a.momentum, p.weight_decay);
      *reinterpret_cast<float4*>(p.v + i) = v;
      *reinterpret_cast<float4*>(p.w + i) = w;
      if constexpr (!std::is_same_v<C, float>) {
        Quad<C> c;
        c.v[0] = from_float<C>(w.x);
        c.v[1] = from_float<C>(w.y);
        c.v[2] = from_float<C>(w.z);
        c.v[3] = from_float<C>(w.w);
        *reinterpret_cast<Quad<C>*>(copy + i) = c;
      }
    }
  }
  for (int64_t i = rest + threadIdx.x; i < end; i += kManyThreads) {
    float w = p.w[i], v = p.v[i];
    const float g = Partner ? pair_mean(p.g[i], p.g_partner[i]) : p.g[i];
    sgd_element(w, g, v, a.lr, a.momentum, p.weight_decay);
    p.v[i] = v;
    p.w[i] = w;
    if constexpr (!std::is_same_v<C, float>) copy[i] = from_float<C>(w);
  }
}

template <typename C>
void launch_sgd_many(cudaStream_t stream, const ManyArgs& a, int blocks, bool partner) {
  if (partner) sgd_many_kernel<C, true><<<blocks, kManyThreads, 0, stream>>>(a);
  else sgd_many_kernel<C, false><<<blocks, kManyThreads, 0, stream>>>(a);
  check_launch("sgd_update_many");
}

bool aligned_to(const void* p, std::uintptr_t bytes) { return reinterpret_cast<std::uintptr_t>(p) % bytes == 0; }

}  // namespace

// ---- optimizers

void sgd_update(cudaStream_t stream, DType t, void* w, const void* g, void* v, int64_t n, const SgdStep& s,
                const int32_t* skip_if) {
  dispatch_float(t, "sgd_update", [&](auto tag) {
    using T = typename decltype(tag)::type;
    SgdOp<T> op;
    op.w = static_cast<T*>(w);
    op.g = static_cast<const T*>(g);
    op.v = static_cast<T*>(v);
    op.lr = static_cast<Math<T>>(s.learning_rate);
    op.momentum = static_cast<Math<T>>(s.momentum);
    op.weight_decay = static_cast<Math<T>>(s.weight_decay);
    op.skip_if = skip_if;
    launch_elementwise(stream, op, n, all_aligned16(w, g, v), "sgd_update");
  });
}

void sgd_update_many(cudaStream_t stream, const std::vector<SgdSegment>& segments, DType copy_t, const SgdStep& s,
                     const int32_t* skip_if) {
  if (copy_t != DType::f32 && copy_t != DType::f16 && copy_t != DType::bf16)
    throw Unsupported("cuda_pointwise sgd_update_many: copies are f16 or bf16, not " + std::string(to_string(copy_t)));
  ManyArgs a{};
  a.lr = static_cast<float>(s.learning_rate);
  a.momentum = static_cast<float>(s.momentum);
  a.skip_if = skip_if;
  int blocks = 0;
  const bool partner = !segments.empty() && segments.front().g_partner != nullptr;
  const auto flush = [&] {
    if (a.count == 0) return;
    if (copy_t == DType::f16) launch_sgd_many<__half>(stream, a, blocks, partner);
    else if (copy_t == DType::bf16) launch_sgd_many<__nv_bfloat16>(stream, a, blocks, partner);
    else launch_sgd_many<float>(stream, a, blocks, partner);
    a.count = 0;
    blocks = 0;
  };
  for (const SgdSegment& p : segments) {
    if ((copy_t == DType::f32) != (p.copy == nullptr))
      throw Error("cuda_pointwise sgd_update_many: a " + std::string(to_string(copy_t)) +
                  " launch takes segments " + (copy_t == DType::f32 ? "without" : "with") + " copies");
    if ((p.g_partner != nullptr) != partner)
      throw Error("cuda_pointwise sgd_update_many: either every segment has a partner gradient or none");
    if (p.n <= 0) continue;
    const std::int64_t need = (p.n + kElementsPerBlock - 1) / kElementsPerBlock;
    if (need > std::numeric_limits<int>::max() / 2)
      throw Unsupported("cuda_pointwise sgd_update_many: a parameter of " + std::to_string(p.n) + " elements");
    if (a.count == kSegmentsPerLaunch || blocks + need > std::numeric_limits<int>::max() / 2) flush();
    const bool vector = aligned_to(p.w, 16) && aligned_to(p.g, 16) && aligned_to(p.g_partner, 16) &&
                        aligned_to(p.v, 16) && aligned_to(p.copy, 8);
    a.seg[a.count++] = {p.w, p.g, p.g_partner, p.v, p.copy, p.n, static_cast<float>(p.weight_decay), blocks, vector ? 1 : 0};
    blocks += static_cast<int>(need);
  }
  flush();
}

std::int64_t lars_scratch_floats() { return 4 * kMaxNormBlocks; }  // two f64 per block

void lars_update(cudaStream_t stream, DType t, void* w, const void* g, void* v, int64_t n, const LarsStep& s,
                 const int32_t* skip_if, float* scratch) {
  dispatch_float(t, "lars_update", [&](auto tag) {
    using T = typename decltype(tag)::type;
    if (n <= 0) return;
    const bool aligned = all_aligned16(w, g, v);
    double* partials = nullptr;
    int partial_blocks = 0;
    if (s.adapt) {
      if (scratch == nullptr || reinterpret_cast<std::uintptr_t>(scratch) % alignof(double) != 0)
        throw Error("cuda_pointwise lars_update: scratch must be 8-byte aligned device memory of "
                    "lars_scratch_floats() floats");
      NormsOp<T> norms;
      norms.w = static_cast<const T*>(w);
      norms.g = static_cast<const T*>(g);
      norms.partials = partials = reinterpret_cast<double*>(scratch);
      const int64_t items = aligned && n >= NormsOp<T>::kVec ? n / NormsOp<T>::kVec + n % NormsOp<T>::kVec : n;
      partial_blocks = grid_for(items, std::min<int64_t>(kMaxNormBlocks, int64_t{sm_count()} * kNormBlocksPerSm));
      launch_elementwise(stream, norms, n, aligned, "lars_update (norms)", partial_blocks);
    }
    LarsOp<T> op;
    op.w = static_cast<T*>(w);
    op.g = static_cast<const T*>(g);
    op.v = static_cast<T*>(v);
    op.momentum = static_cast<Math<T>>(s.momentum);
    op.weight_decay = static_cast<Math<T>>(s.weight_decay);
    op.lr = s.learning_rate;
    op.trust_coefficient = s.trust_coefficient;
    op.weight_decay_f64 = s.weight_decay;
    op.epsilon = s.epsilon;
    op.partials = partials;
    op.partial_blocks = partial_blocks;
    op.skip_if = skip_if;
    launch_elementwise(stream, op, n, aligned, "lars_update");
  });
}

// ---- mixed precision

void cast(cudaStream_t stream, DType src_t, const void* src, DType dst_t, void* dst, int64_t n) {
  dispatch_float(src_t, "cast (source)", [&](auto stag) {
    using S = typename decltype(stag)::type;
    dispatch_float(dst_t, "cast (destination)", [&](auto dtag) {
      using D = typename decltype(dtag)::type;
      CastOp<S, D> op;
      op.src = static_cast<const S*>(src);
      op.dst = static_cast<D*>(dst);
      launch_elementwise(stream, op, n, all_aligned16(src, dst), "cast");
    });
  });
}

void unscale_and_check(cudaStream_t stream, DType t, void* g, int64_t n, const float* scale,
                       int32_t* found_nonfinite) {
  dispatch_float(t, "unscale_and_check", [&](auto tag) {
    using T = typename decltype(tag)::type;
    UnscaleOp<T> op;
    op.g = static_cast<T*>(g);
    op.scale = scale;
    op.found = found_nonfinite;
    launch_elementwise(stream, op, n, aligned16(g), "unscale_and_check");
  });
}

void update_loss_scale(cudaStream_t stream, const LossScaleRule& rule, float* scale, int32_t* good_steps,
                       int32_t* found_nonfinite) {
  if (rule.growth_interval < 1)
    throw Error("cuda_pointwise update_loss_scale: growth_interval must be at least 1, not " +
                std::to_string(rule.growth_interval));
  update_loss_scale_kernel<<<1, 1, 0, stream>>>(scale, good_steps, found_nonfinite, rule.growth, rule.backoff,
                                                rule.growth_interval);
  check_launch("update_loss_scale");
}

}  // namespace ab::nn::cuda_pointwise
