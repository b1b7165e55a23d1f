#!/usr/bin/env bash
# Installs what is missing, builds, and runs the quick suite on the best device present:
# prints sysinfo and a summary table; records go to ./runs/<run_id>/ and ./runs/accelbench.db.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/common.sh
scripts/install-deps.sh
preset=cpu
have_nvcc && preset=cuda
cmake --preset "$preset" >/dev/null
cmake --build --preset "$preset"
./build/$preset/src/cli/accelbench sysinfo
./build/$preset/src/cli/accelbench run suites/quick.yaml "$@"
