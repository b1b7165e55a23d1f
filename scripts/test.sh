#!/usr/bin/env bash
# Installs what is missing, builds the sanitize, cpu and cuda presets (warnings are errors in each)
# and runs every test once, in the build that can show what it checks (labels: tests/CMakeLists.txt):
#   sanitize  Debug, ASan + UBSan: every test of the CPU build. The strictest build, so the one
#             that runs the full set.
#   cpu       Release: built for its own warnings (-O3 finds others); runs the tests labelled
#             `release`, which show what only an optimised build can (a time bound compiled in
#             with NDEBUG, an allocation AddressSanitizer refuses).
#   cuda      Release with nvcc: runs the tests labelled `cuda`: the CUDA-only test binaries (GPU
#             tests skip, with the reason, where no GPU answers) and the tests that reach code
#             compiled differently with CUDA on. Skipped where nvcc is missing.
# Environment: AB_REQUIRE=mpi,browser,charts (CI sets it, .ci/run) turns a skip for that missing
# tool into a failure; AB_TEST_SEED=<n> replays a failed test's random inputs (the failure prints n).
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/common.sh
scripts/install-deps.sh
# A step of its own: the format of the C++/CUDA lines the last commit changed (scripts/format-check.sh).
format_status=0
if git rev-parse --verify --quiet HEAD~1 >/dev/null 2>&1; then
  scripts/format-check.sh || format_status=1
else
  echo "NOTE: no parent commit (a shallow clone or no git): format check skipped"
fi
jobs=$(nproc)
declare -A run_labels=([sanitize]="" [cpu]="^release$" [cuda]="^cuda$")
presets=(sanitize cpu)
if have_nvcc; then
  presets+=(cuda)
else
  echo "NOTE: nvcc not found: the cuda preset is not built on this machine"
fi
export AB_REQUIRE="${AB_REQUIRE:-}"
[[ -n $AB_REQUIRE ]] && echo "AB_REQUIRE=$AB_REQUIRE: skips for these are failures"
status=0
for p in "${presets[@]}"; do
  start=$SECONDS
  echo "=== preset $p: build"
  cmake --preset "$p" >/dev/null
  cmake --build --preset "$p"
  built=$SECONDS
  selection=()
  [[ -n ${run_labels[$p]} ]] && selection=(-L "${run_labels[$p]}")
  echo "=== preset $p: test ${selection[*]:-(every test)}"
  ctest --preset "$p" -j"$jobs" --no-tests=error "${selection[@]}" || status=1
  echo "=== preset $p: build $((built - start)) s, test $((SECONDS - built)) s"
  if [[ $p == cpu ]]; then
    # The Release build as a user installs it: the .deb, unpacked and run from a scratch folder.
    start=$SECONDS
    echo "=== preset cpu: package"
    scripts/package-test.sh cpu || status=1
    echo "=== preset cpu: package $((SECONDS - start)) s"
  fi
done
exit $((status | format_status))
