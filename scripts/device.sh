#!/usr/bin/env bash
# On a GPU machine (Ubuntu 24.04 + CUDA 13 image): builds the cuda preset, then
#   build                 only that (and `accelbench sysinfo` into the logs)
#   test [REGEX]          every test (the GPU and MPI tests run there), or those ctest -R REGEX picks
#   bench [NAME [ARGS]]   the comparisons with peers (bench/): NAME one of torch, timing, energy, counters,
#                         resnet50-train, resnext101-infer, ddp, nccl, gpt2, bert, pipeline, feed, tta, onnx; ARGS go to its script
#                         (e.g. `bench ddp --rounds 3 --warmup-s 25`, `bench bert --part infer`). No NAME:
#                         every one the machine fits (ddp and nccl need two GPUs) but gpt2, bert, feed, tta and onnx (several
#                         minutes each; gpt2 needs .anchors, see bench/fetch-anchors.sh), which run by name.
#   suite FILE            a suite file (suites/*.yaml, suites/experiments/*.yaml) with the built
#                         binary, under mpirun with one rank per GPU when it asks for several GPUs
#                         (a `gpus` value above 1, or a collectives step), then its records' chosen
#                         fields (FIELDS: `accelbench results --fields` paths, default
#                         workload,status,params,time.median_s,rates; e.g. add
#                         telemetry.gpus.0.mean_sm_clock_mhz, metrics.scaling_efficiency).
# Logs go to $AB_LOGS (default a fresh temporary folder) as they are written, and are packed into
# $OUT/device-logs-MODE.tgz (OUT default ./device-out) at exit. A caller whose time limit may kill
# this script (bash runs no exit trap while a foreground command holds it) sets AB_LOGS and packs
# that folder itself:
#   AB_LOGS=/tmp/ab-logs timeout -k 5 500 bash scripts/device.sh bench ddp; tar czf $OUT/logs.tgz -C /tmp ab-logs
# NVLink multicast (NVLS) stays off in every mode, for NCCL, PyTorch and NVSHMEM alike.
# The image lacks sqlite3.h: carry Debian's libsqlite3-dev .deb in .deps/ (apt-get download
# libsqlite3-dev); it is unpacked into a private prefix, never into /. Where it has no mpirun,
# carry Debian's OpenMPI in .deps/openmpi/ (on the dev machine: mkdir -p .deps/openmpi && cd
# .deps/openmpi && apt-get download openmpi-bin openmpi-common libopenmpi3 libopenmpi-dev libpmix2
# libhwloc15 libevent-core-2.1-7 libevent-pthreads-2.1-7 libfabric1 libucx0 libibverbs1
# ibverbs-providers librdmacm1 libpsm2-2 libpsm-infinipath1 libnl-3-200 libnl-route-3-200 libnuma1
# libmunge2 libatomic1); it is unpacked the same way and found through OPAL_PREFIX.
# src/data needs jpeglib.h, png.h and zlib.h: where the image lacks them, carry Debian's
# libjpeg62-turbo-dev, libpng-dev and zlib1g-dev .debs in .deps/ (apt-get download ...); their static
# libraries are linked, so nothing of them is needed at run time. Fashion-MNIST: carry Debian's
# dataset-fashion-mnist .deb in .deps/ too; it is unpacked and named by ACCELBENCH_FASHION_MNIST.
# ONNX import (src/onnx) needs Debian's libonnx-dev, libonnx1, libprotobuf-dev and libprotobuf32
# .debs in .deps/ where the image lacks libonnx-dev; unpacked the same way, named to CMake, and
# their shared libraries found through LD_LIBRARY_PATH.
set -uo pipefail
cd "$(dirname "$0")/.."
mode=${1:-}
shift || true
case $mode in
  build | test | bench | suite) ;;
  *) echo "usage: scripts/device.sh build | test [REGEX] | bench [NAME [ARGS...]] | suite FILE" >&2; exit 2 ;;
esac
out=${OUT:-$PWD/device-out}
logs=${AB_LOGS:-$(mktemp -d)/logs}
mkdir -p "$out" "$logs"
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export PATH=/usr/local/cuda/bin:$PATH
trap 'tar czf "$out/device-logs-$mode.tgz" -C "$(dirname "$logs")" "$(basename "$logs")"' EXIT
ab=./build/cuda/src/cli/accelbench

cmake_extra=()
unpack_sqlite() {
  [[ -f /usr/include/sqlite3.h ]] && return
  local prefix=/tmp/ab-sqlite lib
  for deb in .deps/libsqlite3-dev_*.deb; do dpkg -x "$deb" "$prefix"; done
  lib=$(ls /usr/lib/x86_64-linux-gnu/libsqlite3.so.0 2>/dev/null || ls $prefix/usr/lib/x86_64-linux-gnu/libsqlite3.a)
  cmake_extra+=(-DSQLite3_INCLUDE_DIR=$prefix/usr/include -DSQLite3_LIBRARY=$lib)
}

unpack_data_deps() {
  local prefix=/tmp/ab-data-deps deb
  local lib=$prefix/usr/lib/x86_64-linux-gnu
  for deb in .deps/libjpeg62-turbo-dev_*.deb .deps/libpng-dev_*.deb .deps/zlib1g-dev_*.deb \
             .deps/dataset-fashion-mnist_*.deb; do
    [[ -f $deb ]] && dpkg -x "$deb" "$prefix"
  done
  # jpeglib.h includes jconfig.h, which Debian keeps in the multiarch folder the compiler searches.
  [[ -f $prefix/usr/include/x86_64-linux-gnu/jconfig.h ]] && cp "$prefix/usr/include/x86_64-linux-gnu/jconfig.h" "$prefix/usr/include/"
  [[ -f /usr/include/jpeglib.h ]] || cmake_extra+=(-DJPEG_INCLUDE_DIR=$prefix/usr/include -DJPEG_LIBRARY=$lib/libjpeg.a)
  [[ -f /usr/include/png.h ]] || cmake_extra+=(-DPNG_PNG_INCLUDE_DIR=$prefix/usr/include -DPNG_LIBRARY=$lib/libpng16.a)
  [[ -f /usr/include/zlib.h ]] || cmake_extra+=(-DZLIB_INCLUDE_DIR=$prefix/usr/include -DZLIB_LIBRARY=$lib/libz.a)
  if [[ -z ${ACCELBENCH_FASHION_MNIST:-} && ! -d /usr/share/datasets/fashion-mnist &&
        -d $prefix/usr/share/datasets/fashion-mnist ]]; then
    export ACCELBENCH_FASHION_MNIST=$prefix/usr/share/datasets/fashion-mnist
  fi
}

# ONNX's schema library with the protobuf it was built against (3.21, whose generated headers it
# ships), both from the private prefix, so the image's own protobuf (if any) never mixes in.
unpack_onnx() {
  [[ -f /usr/lib/x86_64-linux-gnu/cmake/ONNX/ONNXConfig.cmake ]] && return
  local prefix=/tmp/ab-onnx deb
  local lib=$prefix/usr/lib/x86_64-linux-gnu
  for deb in .deps/libonnx-dev_*.deb .deps/libonnx1_*.deb .deps/libonnxifi_*.deb .deps/libprotobuf-dev_*.deb .deps/libprotobuf32_*.deb; do
    [[ -f $deb ]] && dpkg -x "$deb" "$prefix"
  done
  if [[ ! -f $lib/cmake/ONNX/ONNXConfig.cmake ]]; then
    echo "note: no libonnx-dev .deb in .deps/ (see this script's header): ONNX import is off"
    return
  fi
  cmake_extra+=(-DONNX_DIR=$lib/cmake/ONNX -DProtobuf_INCLUDE_DIR=$prefix/usr/include -DProtobuf_LIBRARY=$lib/libprotobuf.so)
  export LD_LIBRARY_PATH=$lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
}

# mpirun from the image or from .deps/openmpi; on one node MPI's own messages (bootstrap only) stay
# in shared memory and mpirun starts the ranks itself (the isolated launcher), so no ssh is needed.
setup_mpi() {
  if ! command -v mpirun >/dev/null 2>&1; then
    local mpi=/tmp/ab-openmpi
    if ! ls .deps/openmpi/*.deb >/dev/null 2>&1; then
      echo "note: no mpirun and no .deps/openmpi/*.deb (see this script's header): one process only"
      return
    fi
    for deb in .deps/openmpi/*.deb; do dpkg -x "$deb" "$mpi"; done
    mkdir -p "$mpi/bin"
    ln -sf "$mpi/usr/bin/orterun" "$mpi/bin/mpirun"
    ln -sf "$mpi/usr/bin/opal_wrapper" "$mpi/bin/mpicxx"
    # OPAL_PREFIX relocates OpenMPI; PMIx's few plugins are found through its component path.
    export OPAL_PREFIX=$mpi/usr PATH=$mpi/bin:$mpi/usr/bin:$PATH
    export PMIX_MCA_mca_base_component_path=$mpi/usr/lib/x86_64-linux-gnu/pmix2/lib/pmix
    export LD_LIBRARY_PATH=$mpi/usr/lib/x86_64-linux-gnu:$mpi/usr/lib/x86_64-linux-gnu/openmpi/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
    cmake_extra+=(-DMPI_CXX_COMPILER=$mpi/bin/mpicxx)
  fi
  export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_pml=ob1 OMPI_MCA_btl=self,vader \
    OMPI_MCA_btl_vader_single_copy_mechanism=none OMPI_MCA_plm=isolated
}

build() {
  unpack_sqlite
  unpack_data_deps
  unpack_onnx
  setup_mpi  # every mode may launch ranks: the MPI tests, the multi-GPU suites, compare_ddp
  {
    nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.max.sm,power.limit --format=csv
    nvidia-smi topo -m || true
    cmake --preset cuda "${cmake_extra[@]}" && cmake --build --preset cuda -j "$(nproc)"
  } > "$logs/build.log" 2>&1 || { tail -n 40 "$logs/build.log"; echo "BUILD FAILED"; exit 1; }
  grep -E "MPI|ONNX import" "$logs/build.log" | head -3
  $ab sysinfo > "$logs/sysinfo.txt" 2>&1
  echo "build ok"
}

gpu_count() { nvidia-smi -L | wc -l; }

# One rank per GPU, unbound (a rank confined to one CPU reads no GPU counters), with the multicast
# switches and any NCCL_* or kernel-trace variable the caller set forwarded to every rank.
mpi_launch() {
  local ranks=$1 forward=()
  shift
  for v in $(compgen -e | grep -E '^(NCCL_|TORCH_SYMM_MEM_|NVSHMEM_|AB_TRACE_DIR$|CUDA_INJECTION64_PATH$)'); do
    forward+=(-x "$v")
  done
  mpirun -np "$ranks" --allow-run-as-root --bind-to none "${forward[@]}" "$@"
}

run_tests() {
  ctest --preset cuda -j 8 --output-on-failure ${1:+-R "$1"} > "$logs/ctest.log" 2>&1
  local rc=$?
  grep -E "tests passed|tests failed|\(Failed\)|\(Skipped\)|Timeout|SEGFAULT" "$logs/ctest.log" | head -40
  return $rc
}

# One comparison with its peer; each figure is printed as measured (unbuffered, no tail), so a time
# limit keeps what was measured.
run_bench() {
  local name=$1
  shift
  case $name in
    torch) python3 -u bench/compare_torch.py --accelbench $ab --out "$logs" "$@" ;;
    timing) ./build/cuda/bench/ab_timing_check "$@" ;;
    energy) python3 -u bench/energy_check.py --accelbench $ab --out "$logs" "$@" ;;
    counters) python3 -u bench/check_counters.py --accelbench $ab --out "$logs/counters" "$@" ;;
    resnet50-train)
      python3 -u bench/compare_resnet.py --accelbench $ab --out "$logs/resnet50-train" --train-precisions bf16 \
        --infer-precisions "" --torch-compile --torch-once "$@" ;;
    resnext101-infer)
      python3 -u bench/compare_resnet.py --accelbench $ab --out "$logs/rx4" --model resnext101_32x4d \
        --train-precisions "" --infer-precisions fp16 --infer-batches 1,2,4,8,10,12,16,32,64,128,256 \
        --energy-batches 10 --torch-once "$@" &&
        python3 -u bench/compare_resnet.py --accelbench $ab --out "$logs/rx8" --model resnext101_32x8d \
          --train-precisions "" --infer-precisions fp16 --infer-batches 1 --torch-once "$@" ;;
    ddp) python3 -u bench/compare_ddp.py --accelbench $ab --out "$logs/ddp" "$@" ;;
    nccl) python3 -u bench/compare_nccl.py --accelbench $ab --out "$logs/nccl" "$@" ;;
    gpt2) bash bench/gpt2.sh --accelbench $ab --out "$logs/gpt2" "$@" ;;
    bert) bash bench/bert.sh --accelbench $ab --out "$logs/bert" "$@" ;;
    pipeline) python3 -u bench/compare_pipeline.py --accelbench $ab --out "$logs/pipeline" "$@" ;;
    feed) python3 -u bench/compare_feed.py --accelbench $ab --out "$logs/feed" "$@" ;;
    tta) python3 -u bench/compare_tta.py --accelbench $ab --out "$logs/tta" "$@" ;;
    onnx) python3 -u bench/compare_onnx.py --accelbench $ab --out "$logs/onnx" "$@" ;;
    *) echo "unknown comparison '$name': torch, timing, energy, counters, resnet50-train, resnext101-infer, ddp, nccl, gpt2, bert, pipeline, feed, tta, onnx" >&2; return 2 ;;
  esac 2>&1 | tee "$logs/bench-$name.txt"
}

# The ranks a suite needs: the machine's GPUs when a step names a `gpus` value above 1 or runs
# collectives (whose world is the launch), else one process.
suite_ranks() {
  local most
  most=$(grep -E '^\s*gpus\s*:' "$1" | grep -oE '[0-9]+' | sort -n | tail -n 1)
  if [[ ${most:-1} -gt 1 ]] || grep -qE '^\s*-?\s*workload\s*:\s*collectives\b' "$1"; then gpu_count; else echo 1; fi
}

run_suite() {
  local file=$1 name ranks
  [[ -f $file ]] || { echo "no suite file '$file'" >&2; return 2; }
  name=$(basename "$file" .yaml)
  ranks=$(suite_ranks "$file")
  echo "suite $file: $ranks process(es)"
  if [[ $ranks -gt 1 ]]; then
    mpi_launch "$ranks" $ab run "$file" --out "$logs/$name" > "$logs/$name.txt" 2>&1
  else
    $ab run "$file" --out "$logs/$name" > "$logs/$name.txt" 2>&1
  fi
  local rc=$?
  echo "suite $name: exit $rc"
  grep -iE "error|refus" "$logs/$name.txt" | head -5
  $ab results --out "$logs/$name" --fields "${FIELDS:-workload,status,params,time.median_s,rates}" |
    tee "$logs/$name-fields.txt" | cut -c1-400
  return $rc
}

build
case $mode in
  build) ;;
  test) run_tests "${1:-}" ;;
  bench)
    if [[ $# -gt 0 ]]; then
      run_bench "$@"
    else
      for name in torch timing energy counters resnet50-train resnext101-infer pipeline; do run_bench $name; done
      if [[ $(gpu_count) -gt 1 ]]; then for name in nccl ddp; do run_bench $name; done; fi
    fi
    ;;
  suite) run_suite "${1:?suite FILE}" ;;
esac
