// The attention kernels' variants, switched at run time for the lab's bench
// (bench/attention_bench.cu) and the tests that cover each: not part of nn::Kernels' contract.
// Process-wide, read at each call; the defaults are the best guess of the fastest.
#pragma once

namespace ab::nn::cuda_attention {

// Which implementation runs a shape: the faster of the project's kernels and cuDNN's fused
// attention where cuDNN takes the shape (timed at the shape's first eager call), or one of them.
enum class Implementation { fastest, own, cudnn };

struct Variants {
  Implementation implementation = Implementation::fastest;
  // Outside deterministic mode, dQ added by atomics in the key-block pass (where the engine's
  // accumulator holds it) rather than by a second pass over query blocks. Off: on an H200 at
  // B16 H12 T1024 D64 causal the second pass was faster (0.533 ms against 0.554 at 64 keys a
  // block and 0.583 at 128: bench/attention_bench.cu).
  bool atomic_dq = false;
  // Keys a block of that key-block pass: 64 (4 warps) or 128 (8 warps: Q and dO loaded, and dQ
  // added, once per 128 keys).
  int backward_keys_per_block = 128;
  // Forward blocks of 8 warps of 16 query rows (128 rows) rather than 4 warps of 32 rows at D 64
  // (16 at D 128).
  bool forward_eight_warps = false;
};
Variants& variants();

}  // namespace ab::nn::cuda_attention
