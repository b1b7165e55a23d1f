// Internal to src/data/cuda: the GPU's crop, resize, flip and normalise of decoded 8-bit images,
// the same arithmetic as the host's augment_into (11-bit fixed-point bilinear taps from the same
// double-precision positions, the same per-level table), so a batch matches the host's bit for bit
// on the same decoded pixels. Free of CUDA headers: the stream travels as void*.
#pragma once

#include <cstdint>
#include <vector>

#include "backend/backend.h"
#include "data/pipeline.h"

namespace ab::data::cuda {

// One sample: its decoded image in device memory (HWC rows `pitch` bytes apart) and its box in
// the (virtually padded by `pad` black pixels a side) image.
struct GpuCrop {
  const std::uint8_t* pixels = nullptr;
  std::int64_t pitch = 0;
  std::int32_t height = 0, width = 0, channels = 0;  // of the decoded image, 1 or 3 channels
  std::int32_t y = 0, x = 0, box_height = 0, box_width = 0, flip = 0;
};

struct GpuAugmentShape {
  std::int32_t height = 0, width = 0, channels = 0;  // the output's
  std::int32_t pad = 0;
  std::int32_t element_bytes = 0;  // 4 (f32) or 2 (f16, bf16): the table holds each level's bits
};

// `crops`: device array of `batch` entries; `table`: device array of 3 x 256 output-element bits
// (the normalised value of each level per channel, as uint32); `out`: batch x H x W x C elements.
// Queued on `stream`; returns the launch error code (0 = cudaSuccess).
int launch_gpu_augment(const GpuCrop* crops, int batch, const GpuAugmentShape& shape, const std::uint32_t* table,
                       void* out, void* stream);

// Host side (device_data.cpp): the output's shape and the per-level table for `a` (Error for an
// output type other than f16, bf16, f32), and the sample's GpuCrop for its box (Error for a box
// outside the image padded by `pad`, as augment_into refuses one).
GpuAugmentShape augment_shape(const Augment& a);
// Makes `backend`'s GPU the calling thread's current device (streams and nvJPEG handles are made
// on it); Error where `backend` is no CUDA backend.
void use_device_of(const backend::Backend& backend);
std::vector<std::uint32_t> level_table(const Augment& a);
GpuCrop gpu_crop(const std::uint8_t* pixels, std::int64_t pitch, std::int64_t height, std::int64_t width,
                 std::int64_t channels, const CropBox& box, std::int64_t pad);

}  // namespace ab::data::cuda
