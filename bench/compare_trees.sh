#!/usr/bin/env bash
# Measures the same accelbench runs with two builds in one call, alternating, so that a change
# that should move no figure (a refactoring) is checked against its base on the same GPU and the
# same clocks: ResNet-50 bf16 training (batch 256) and ResNeXt-101 32x4d fp16 inference.
#   usage: bench/compare_trees.sh BASE_SRC [ROUNDS]
# BASE_SRC: the base tree's sources (e.g. `git archive BASE src tests bench cmake CMakeLists.txt
# CMakePresets.json suites scripts | tar -x -C .base`); it is built next to them (accelbench only).
# The current tree must be built already (scripts/device.sh build). Records and the printed fields
# go to $AB_LOGS (default ./device-out/compare-trees).
set -uo pipefail
cd "$(dirname "$0")/.."
base=${1:?usage: bench/compare_trees.sh BASE_SRC [ROUNDS]}
rounds=${2:-1}
logs=${AB_LOGS:-$PWD/device-out}/compare-trees
mkdir -p "$logs"
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
new=./build/cuda/src/cli/accelbench
old=$base/build/cuda/src/cli/accelbench
[[ -x $new ]] || { echo "no $new: build the current tree first" >&2; exit 2; }
[[ -x $old ]] || { echo "no $old: build the base tree first (its accelbench target)" >&2; exit 2; }
fields=workload,params.model,params.batch,params.precision,status,time.median_s,rates.samples_per_s,telemetry.gpus.0.mean_sm_clock_mhz
runs=("train --axis model=resnet50 --axis precision=bf16 --axis batch=256"
      "infer --axis model=resnext101_32x4d --axis precision=fp16 --axis batch=1,10,64,256")
for ((r = 1; r <= rounds; r++)); do
  for side in new old; do  # alternating: neither build always runs on the warmer GPU
    bin=$new
    [[ $side == old ]] && bin=$old
    for i in "${!runs[@]}"; do
      out=$logs/$side-r$r-$i
      # shellcheck disable=SC2086  # the run's arguments are words
      $bin run ${runs[$i]} --out "$out" -q > "$out.txt" 2>&1 || echo "$side round $r run $i: exit $?"
      echo "== $side round $r: ${runs[$i]}"
      $new results --out "$out" --fields "$fields"
    done
  done
done
