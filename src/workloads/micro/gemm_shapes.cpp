// GEMM problem sizes as data (DeepBench's habit): rows "MxNxKxTRANS" in the BLAS column-major
// convention. The DeepBench sets are the problem sizes of Baidu's DeepBench (code/kernels/
// gemm_problems.h, Apache-2.0), restated as rows; a_t/b_t became TRANS ("TN" = A transposed).
#include "workloads/micro/gemm_shapes.h"

#include <iterator>
#include <sstream>

namespace ab::workloads::micro {
namespace {

const char* const kDeepBenchTrain[] = {
    "1760x16x1760xNN", "1760x32x1760xNN", "1760x64x1760xNN", "1760x128x1760xNN", "1760x7000x1760xNN",
    "2048x16x2048xNN", "2048x32x2048xNN", "2048x64x2048xNN", "2048x128x2048xNN", "2048x7000x2048xNN",
    "2560x16x2560xNN", "2560x32x2560xNN", "2560x64x2560xNN", "2560x128x2560xNN", "2560x7000x2560xNN",
    "4096x16x4096xNN", "4096x32x4096xNN", "4096x64x4096xNN", "4096x128x4096xNN", "4096x7000x4096xNN",
    "1760x16x1760xTN", "1760x32x1760xTN", "1760x64x1760xTN", "1760x128x1760xTN", "1760x7000x1760xTN",
    "2048x16x2048xTN", "2048x32x2048xTN", "2048x64x2048xTN", "2048x128x2048xTN", "2048x7000x2048xTN",
    "2560x16x2560xTN", "2560x32x2560xTN", "2560x64x2560xTN", "2560x128x2560xTN", "2560x7000x2560xTN",
    "4096x16x4096xTN", "4096x32x4096xTN", "4096x64x4096xTN", "4096x128x4096xTN", "4096x7000x4096xTN",
    "1760x7133x1760xNT", "2048x7133x2048xNT", "2560x7133x2560xNT", "4096x7133x4096xNT", "5124x9124x1760xNN",
    "35x8457x1760xNN", "5124x9124x2048xNN", "35x8457x2048xNN", "5124x9124x2560xNN", "35x8457x2560xNN",
    "5124x9124x4096xNN", "35x8457x4096xNN", "5124x9124x1760xTN", "35x8457x1760xTN", "5124x9124x2048xTN",
    "35x8457x2048xTN", "5124x9124x2560xTN", "35x8457x2560xTN", "5124x9124x4096xTN", "35x8457x4096xTN",
    "7680x16x2560xNN", "7680x32x2560xNN", "7680x64x2560xNN", "7680x128x2560xNN", "7680x16x2560xTN",
    "7680x32x2560xTN", "7680x64x2560xTN", "7680x128x2560xTN", "3072x16x1024xNN", "3072x32x1024xNN",
    "3072x64x1024xNN", "3072x128x1024xNN", "3072x16x1024xTN", "3072x32x1024xTN", "3072x64x1024xTN",
    "3072x128x1024xTN", "3072x7435x1024xNT", "7680x5481x2560xNT", "512x8x500000xNN", "1024x8x500000xNN",
    "512x16x500000xNN", "1024x16x500000xNN", "512x8x500000xTN", "1024x8x500000xTN", "512x16x500000xTN",
    "1024x16x500000xTN", "1024x700x512xNN", "1024x700x512xTN", "7680x24000x2560xNN", "6144x24000x2048xNN",
    "4608x24000x1536xNN", "8448x24000x2816xNN", "3072x24000x1024xNN", "7680x48000x2560xNN",
    "6144x48000x2048xNN", "4608x48000x1536xNN", "8448x48000x2816xNN", "3072x48000x1024xNN",
    "7680x24000x2560xTN", "6144x24000x2048xTN", "4608x24000x1536xTN", "8448x24000x2816xTN",
    "3072x24000x1024xTN", "7680x48000x2560xTN", "6144x48000x2048xTN", "4608x48000x1536xTN",
    "8448x48000x2816xTN", "3072x48000x1024xTN", "6144x16x2048xNN", "4608x16x1536xNN", "8448x16x2816xNN",
    "6144x32x2048xNN", "4608x32x1536xNN", "8448x32x2816xNN", "6144x16x2048xTN", "4608x16x1536xTN",
    "8448x16x2816xTN", "6144x32x2048xTN", "4608x32x1536xTN", "8448x32x2816xTN", "512x24000x2816xNN",
    "512x24000x2048xNN", "512x24000x2560xNN", "512x24000x1536xNN", "1024x24000x2816xNN",
    "1024x24000x2048xNN", "1024x24000x2560xNN", "1024x24000x1536xNN", "512x16x512xNN", "1024x16x512xNN",
    "512x24000x2816xTN", "512x24000x2048xTN", "512x24000x2560xTN", "512x24000x1536xTN", "1024x24000x2816xTN",
    "1024x24000x2048xTN", "1024x24000x2560xTN", "1024x24000x1536xTN", "512x16x512xNT", "1024x16x512xNT",
    "512x48000x2816xNN", "512x48000x2048xNN", "512x48000x2560xNN", "512x48000x1536xNN", "1024x48000x2816xNN",
    "1024x48000x2048xNN", "1024x48000x2560xNN", "1024x48000x1536xNN", "512x32x512xNN", "1024x32x512xNN",
    "512x48000x2816xTN", "512x48000x2048xTN", "512x48000x2560xTN", "512x48000x1536xTN", "1024x48000x2816xTN",
    "1024x48000x2048xTN", "1024x48000x2560xTN", "1024x48000x1536xTN", "512x32x512xNT", "1024x32x512xNT",
};

const char* const kDeepBenchInferServer[] = {
    "5124x700x2048xNN", "35x700x2048xNN", "5124x700x2560xNN", "35x700x2560xNN", "5124x1500x2048xNN",
    "35x1500x2048xNN", "5124x1500x2560xNN", "35x1500x2560xNN", "7680x1x2560xNN", "3072x1x1024xNN",
    "7680x2x2560xNN", "3072x2x1024xNN", "7680x4x2560xNN", "3072x4x1024xNN", "512x1x500000xNN",
    "1024x1x500000xNN", "512x2x500000xNN", "1024x2x500000xNN", "512x4x500000xNN", "1024x4x500000xNN",
    "1024x700x512xNN", "7680x1500x2560xNN", "6144x1500x2048xNN", "4608x1500x1536xNN", "8448x1500x2816xNN",
    "3072x1500x1024xNN", "7680x3000x2560xNN", "6144x3000x2048xNN", "4608x3000x1536xNN", "8448x3000x2816xNN",
    "3072x3000x1024xNN", "7680x6000x2560xNN", "6144x6000x2048xNN", "4608x6000x1536xNN", "8448x6000x2816xNN",
    "3072x6000x1024xNN", "6144x1x2048xNN", "4608x1x1536xNN", "8448x1x2816xNN", "6144x2x2048xNN",
    "4608x2x1536xNN", "8448x2x2816xNN", "6144x4x2048xNN", "4608x4x1536xNN", "8448x4x2816xNN",
    "512x1500x2816xNN", "512x1500x2048xNN", "512x1500x2560xNN", "512x1500x1536xNN", "1024x1500x2816xNN",
    "1024x1500x2048xNN", "1024x1500x2560xNN", "1024x1500x1536xNN", "512x1x512xNN", "1024x1x512xNN",
    "512x3000x2816xNN", "512x3000x2048xNN", "512x3000x2560xNN", "512x3000x1536xNN", "1024x3000x2816xNN",
    "1024x3000x2048xNN", "1024x3000x2560xNN", "1024x3000x1536xNN", "512x2x512xNN", "1024x2x512xNN",
    "512x6000x2816xNN", "512x6000x2048xNN", "512x6000x2560xNN", "512x6000x1536xNN", "1024x6000x2816xNN",
    "1024x6000x2048xNN", "1024x6000x2560xNN", "1024x6000x1536xNN", "512x4x512xNN", "1024x4x512xNN",
};

const char* const kDeepBenchInferDevice[] = {
    "5124x700x2048xNN", "35x700x2048xNN", "3072x1x1024xNN", "64x1x1216xNN", "3072x1500x1024xNN",
    "128x1500x1280xNN", "3072x1500x128xNN", "128x1x1024xNN", "3072x1x128xNN", "176x1500x1408xNN",
    "4224x1500x176xNN", "128x1x1408xNN", "4224x1x128xNN",
};

template <std::size_t N>
std::vector<std::vector<std::string>> rows(const char* const (&table)[N]) {
  std::vector<std::vector<std::string>> out;
  for (const char* row : table) {
    std::vector<std::string> fields;
    std::istringstream in(row);
    for (std::string f; std::getline(in, f, 'x');) fields.push_back(f);
    out.push_back(fields);
  }
  return out;
}

std::vector<std::vector<std::string>> square(std::initializer_list<int> sizes) {
  std::vector<std::vector<std::string>> out;
  for (int s : sizes) out.push_back({std::to_string(s), std::to_string(s), std::to_string(s), "auto"});
  return out;
}

}  // namespace

std::map<std::string, std::vector<std::vector<std::string>>> gemm_tables() {
  return {{"square", square({256, 512, 1024, 2048, 4096, 8192, 16384})},
          {"deepbench-train", rows(kDeepBenchTrain)},
          {"deepbench-infer-server", rows(kDeepBenchInferServer)},
          {"deepbench-infer-device", rows(kDeepBenchInferDevice)}};
}

}  // namespace ab::workloads::micro
