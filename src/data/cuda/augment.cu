// The GPU's augmentation kernel (augment_kernel.h): one thread per output pixel.
#include <cuda_runtime.h>

#include "data/cuda/augment_kernel.h"

namespace ab::data::cuda {
namespace {

constexpr int kWeightBits = 11;
constexpr int kOne = 1 << kWeightBits;

struct Taps {
  int lo, hi, w;
};

// As augment.cpp's taps(); __dmul_rn/__dadd_rn keep nvcc from fusing into an FMA, whose single
// rounding would move a weight by one step from the host's.
__device__ Taps taps(int o, int n, int start, int length) {
  const double scale = static_cast<double>(length) / static_cast<double>(n);
  double f = __dadd_rn(__dmul_rn(static_cast<double>(o) + 0.5, scale), -0.5);
  f = fmin(fmax(f, 0.0), static_cast<double>(length - 1));
  const int lo = static_cast<int>(f);
  return {start + lo, start + min(lo + 1, length - 1), static_cast<int>(llround((f - lo) * kOne))};
}

// A pixel of the padded image: black outside the decoded one.
__device__ int level(const GpuCrop& c, int pad, int y, int x, int channel) {
  y -= pad;
  x -= pad;
  if (y < 0 || x < 0 || y >= c.height || x >= c.width) return 0;
  return c.pixels[static_cast<long long>(y) * c.pitch + static_cast<long long>(x) * c.channels +
                  (c.channels == 1 ? 0 : channel)];
}

__global__ void augment_kernel(const GpuCrop* crops, GpuAugmentShape s, const std::uint32_t* table, void* out) {
  __shared__ std::uint32_t lut[3 * 256];
  for (int i = static_cast<int>(threadIdx.x); i < 3 * 256; i += static_cast<int>(blockDim.x)) lut[i] = table[i];
  __syncthreads();
  const int pixel = static_cast<int>(blockIdx.x * blockDim.x + threadIdx.x);
  if (pixel >= s.height * s.width) return;
  const GpuCrop c = crops[blockIdx.y];
  const int oy = pixel / s.width, ox = pixel % s.width;
  const Taps row = taps(oy, s.height, c.y, c.box_height);
  const Taps col = taps(c.flip ? s.width - 1 - ox : ox, s.width, c.x, c.box_width);
  const long long at = (static_cast<long long>(blockIdx.y) * s.height * s.width + pixel) * s.channels;
  for (int ch = 0; ch < s.channels; ++ch) {
    const int top = level(c, s.pad, row.lo, col.lo, ch) * (kOne - col.w) + level(c, s.pad, row.lo, col.hi, ch) * col.w;
    const int bottom =
        level(c, s.pad, row.hi, col.lo, ch) * (kOne - col.w) + level(c, s.pad, row.hi, col.hi, ch) * col.w;
    const int v = (top * (kOne - row.w) + bottom * row.w + (1 << (2 * kWeightBits - 1))) >> (2 * kWeightBits);
    const std::uint32_t bits = lut[ch * 256 + v];
    if (s.element_bytes == 4) static_cast<std::uint32_t*>(out)[at + ch] = bits;
    else static_cast<std::uint16_t*>(out)[at + ch] = static_cast<std::uint16_t>(bits);
  }
}

}  // namespace

int launch_gpu_augment(const GpuCrop* crops, int batch, const GpuAugmentShape& shape, const std::uint32_t* table,
                       void* out, void* stream) {
  constexpr int kThreads = 256;
  const dim3 grid(static_cast<unsigned>((shape.height * shape.width + kThreads - 1) / kThreads),
                  static_cast<unsigned>(batch));
  augment_kernel<<<grid, kThreads, 0, static_cast<cudaStream_t>(stream)>>>(crops, shape, table, out);
  return static_cast<int>(cudaGetLastError());
}

}  // namespace ab::data::cuda
