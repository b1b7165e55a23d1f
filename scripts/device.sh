#!/usr/bin/env bash
# On the GPU machine (Ubuntu 24.04 + CUDA 13 image): builds the cuda preset, runs every test (the
# GPU tests run there), then the GPU benchmarks and the PyTorch comparison. Logs go to $OUT when
# set (else ./device-out), packed into one archive. That image lacks sqlite3.h: carry Debian's
# libsqlite3-dev .deb in .deps/ (apt-get download libsqlite3-dev); it is unpacked into a private
# prefix, never into /.
#   usage: scripts/device.sh [test|bench|all] (default all)
set -uo pipefail
cd "$(dirname "$0")/.."
what=${1:-all}
out=${OUT:-$PWD/device-out}
logs=$(mktemp -d)/logs
mkdir -p "$out" "$logs"
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export PATH=/usr/local/cuda/bin:$PATH
trap 'tar czf "$out/device-logs.tgz" -C "$(dirname "$logs")" logs' EXIT

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
} > "$logs/build.log" 2>&1 || { tail -n 40 "$logs/build.log"; echo "BUILD FAILED"; exit 1; }
echo "build ok"
ab=./build/cuda/src/cli/accelbench

if [[ $what == test || $what == all ]]; then
  ctest --preset cuda -j 8 > "$logs/ctest.log" 2>&1
  grep -E "tests passed|tests failed|\(Failed\)|\(Skipped\)|Timeout" "$logs/ctest.log" | head -20
fi
if [[ $what == bench || $what == all ]]; then
  $ab sysinfo | tee "$logs/sysinfo.txt"
  ./build/cuda/src/backend/cuda/ab_timing_check 2>&1 | tee "$logs/timing-check.txt"
  python3 bench/compare_torch.py --accelbench $ab --out "$logs" 2>&1 | tee "$logs/compare.txt" | tail -n 12
  python3 bench/energy_check.py --accelbench $ab --out "$logs" 2>&1 | tail -n 16
  ( time $ab run suites/quick.yaml --out "$logs/quick" ) > "$logs/quick.txt" 2>&1; tail -n 40 "$logs/quick.txt"
fi
