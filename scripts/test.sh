#!/usr/bin/env bash
# Installs what is missing, builds the cpu, cuda and sanitize (ASan+UBSan) presets, and runs every
# test in each. GPU tests skip themselves, with the reason, where no GPU answers.
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
exit $((status | format_status))
