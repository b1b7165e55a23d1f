#!/usr/bin/env bash
# Installs what is missing, builds the cpu, cuda and sanitize (ASan+UBSan) presets, and runs every
# test in each. GPU tests skip themselves, with the reason, where no GPU answers.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/common.sh
scripts/install-deps.sh
presets=(cpu sanitize)
if have_nvcc; then
  presets=(cpu cuda sanitize)
else
  echo "NOTE: nvcc not found: the cuda preset is not built on this machine"
fi
status=0
for p in "${presets[@]}"; do
  echo "=== preset $p: build"
  cmake --preset "$p" >/dev/null
  cmake --build --preset "$p"
  echo "=== preset $p: test"
  ctest --preset "$p" -j2 || status=1
done
exit $status
