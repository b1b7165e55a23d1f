#!/usr/bin/env bash
# On the GPU machine (Ubuntu 24.04 + CUDA 13 image): builds the cuda preset, runs every test (the
# GPU tests run there), then the GPU benchmarks and the PyTorch comparison. Logs go to $OUT when
# set (else ./device-out). That image lacks sqlite3.h: carry Debian's libsqlite3-dev .deb in .deps/
# (apt-get download libsqlite3-dev) and it is unpacked into a private prefix, never into /.
#   usage: scripts/device.sh [test|bench|all] (default all)
set -uo pipefail
cd "$(dirname "$0")/.."
what=${1:-all}
out=${OUT:-$PWD/device-out}
mkdir -p "$out"
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export PATH=/usr/local/cuda/bin:$PATH

extra=()
if [[ ! -f /usr/include/sqlite3.h ]]; then
  prefix=/tmp/ab-sqlite
  for deb in .deps/libsqlite3-dev_*.deb; do dpkg -x "$deb" "$prefix"; done
  lib=$(ls /usr/lib/x86_64-linux-gnu/libsqlite3.so.0 2>/dev/null || ls $prefix/usr/lib/x86_64-linux-gnu/libsqlite3.a)
  extra=(-DSQLite3_INCLUDE_DIR=$prefix/usr/include -DSQLite3_LIBRARY=$lib)
fi

{
  nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.max.sm,power.limit --format=csv
  cmake --preset cuda "${extra[@]}" && cmake --build --preset cuda -j 16
} 2>&1 | tee "$out/build.log" | tail -n 30
[[ ${PIPESTATUS[0]} -eq 0 ]] || { echo "BUILD FAILED"; exit 1; }
ab=./build/cuda/src/cli/accelbench

if [[ $what == test || $what == all ]]; then
  ctest --preset cuda -j 8 2>&1 | tee "$out/ctest.log" | tail -n 25
  ./build/cuda/tests/backend_cuda_test 2>&1 | tail -n 40 > "$out/gpu-tests.log"
  grep -E "SKIPPED|FAILED|PASSED" "$out/gpu-tests.log" | head -20
fi
if [[ $what == bench || $what == all ]]; then
  $ab sysinfo | tee "$out/sysinfo.txt"
  ./build/cuda/src/backend/cuda/ab_timing_check 2>&1 | tee "$out/timing-check.txt"
  python3 bench/compare_torch.py --accelbench $ab --out "$out" 2>&1 | tee "$out/compare.txt" | tail -n 40
fi
