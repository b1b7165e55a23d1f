// The data path's GPU side behind a CUDA-free header: the DeviceFeeder's copy stream and JPEG
// decoding with nvJPEG followed by the crop, flip and normalise on the GPU. Built in every build;
// without CUDA (or, for decoding, without nvJPEG) the factories say so (docs/METHODOLOGY.md,
// "Input pipeline").
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "data/pipeline.h"

namespace ab::data {

// Copies on a stream of their own beside `backend`'s (which `kernels` run on), ordered by events,
// on a CUDA backend; same_stream_copies(kernels) on any other.
std::unique_ptr<CopyQueue> make_copy_queue(backend::Backend& backend, nn::Kernels& kernels);

// Queues a device-to-device copy of `src` into `dst` (the same byte size) on `backend`'s stream,
// where `kernels` run: a captured step reads fixed input tensors, so each fed batch is copied into
// them, ordered after the feeder's wait and before the step. Elsewhere through the host (download,
// upload). Error where the sizes differ.
void copy_into(backend::Backend& backend, nn::Kernels& kernels, const Tensor& dst, const Tensor& src);

// Whether this build decodes JPEG with nvJPEG (CMake found the toolkit's nvJPEG: ACCELBENCH_NVJPEG).
bool nvjpeg_in_build();
inline constexpr const char* kNoNvjpeg =
    "this build has no nvJPEG (a CUDA build where CMake finds CUDA::nvjpeg has it)";

// Batches decoded and augmented on the GPU, in the host pipeline's order (epoch_order) with its
// boxes (choose_crop on the decoded size): nvJPEG's batched decode of each batch's files into
// device memory, then one kernel crops, resizes, flips and normalises into NHWC batches of
// config.augment.dtype, everything on `backend`'s stream. The calling thread reads the files.
class GpuDecoder {
 public:
  virtual ~GpuDecoder() = default;
  // Batch k, ready for work queued on the backend's stream after this call; valid until the
  // call after next (two batches alternate).
  virtual const DeviceFeeder::DeviceBatch& next() = 0;
  virtual std::string backend_name() const = 0;  // nvJPEG's: "hardware" (the GPU's JPEG engines) or "hybrid"
  virtual double host_cpu_s() const = 0;         // the calling thread's CPU time spent in next()
  // The compute stream's time waiting for decoded batches so far (decode_ahead's: timed by events
  // around each wait); 0 where the decode runs on the compute stream itself.
  virtual double device_wait_s() { return 0.0; }
};
// A decoder one batch ahead on a stream of its own: `make` builds it on a second backend of
// compute's GPU, and next() returns batch k (the compute stream waits, on the device, for its
// decode) after queueing batch k+1's decode behind compute's work so far, so it runs beside the
// step that reads batch k. A batch is valid for work queued on compute's stream before the next
// call. On a backend that is no GPU: make(compute), as it is.
std::unique_ptr<GpuDecoder> decode_ahead(backend::Backend& compute,
                                         const std::function<std::unique_ptr<GpuDecoder>(backend::Backend&)>& make);
// `engine`: "hardware" (nvJPEG's hardware backend, refused where the GPU has none), "gpu" (its
// GPU-assisted hybrid backend) or "auto" (hardware where there is one). Unsupported without
// nvJPEG in the build or on a backend that is no GPU; Error naming the sample for a file nvJPEG
// cannot decode (a PNG, a progressive JPEG on the hardware engines).
std::unique_ptr<GpuDecoder> make_nvjpeg_decoder(std::shared_ptr<const SampleSource> source, PipelineConfig config,
                                                backend::Backend& backend, nn::Kernels& kernels,
                                                const std::string& engine);

// The GPU's crop/resize/flip/normalise alone, on decoded images the host uploads: the batch it
// writes, as bytes of augment.dtype. For the tests that hold it to augment_into. Unsupported
// where the backend is no GPU.
std::vector<std::uint8_t> augment_on_gpu(backend::Backend& backend, const std::vector<Image>& images,
                                         const std::vector<CropBox>& boxes, const Augment& augment);

}  // namespace ab::data
