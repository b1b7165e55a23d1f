#!/usr/bin/env bash
# Installs what accelbench needs to build and test on Debian 12 / Ubuntu 24.04, from the
# distribution's packages (OpenMPI for multi-process runs and their mpirun test). The CUDA toolkit
# (nvcc, cuBLASLt) is expected from NVIDIA's install under /usr/local/cuda; without it only the cpu
# preset builds.
set -euo pipefail
cd "$(dirname "$0")/.."
packages=(cmake ninja-build g++ pkg-config git nlohmann-json3-dev libcli11-dev libyaml-cpp-dev libsqlite3-dev
          libopenblas-dev libgtest-dev openmpi-bin libopenmpi-dev clang-format ccache
          libjpeg-dev libpng-dev zlib1g-dev libonnx-dev libprotobuf-dev protobuf-compiler)
# The HTML report's charting scripts come from npm (package-lock.json, below).
command -v node >/dev/null 2>&1 && command -v npm >/dev/null 2>&1 || packages+=(nodejs npm)
missing=()
for p in "${packages[@]}"; do
  dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p")
done
SUDO=""
[[ $(id -u) -ne 0 ]] && SUDO=sudo
updated=0
if ((${#missing[@]})); then
  echo "installing: ${missing[*]}"
  $SUDO apt-get update -qq
  updated=1
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${missing[@]}" >/dev/null
fi

# Headless Chromium opens a report in the report's end-to-end test. Debian packages it as
# `chromium`; where the distribution has no such package (Ubuntu ships a snap) the test skips.
if ! command -v chromium >/dev/null 2>&1 && ! dpkg -s chromium >/dev/null 2>&1; then
  ((updated)) || $SUDO apt-get update -qq
  echo "installing: chromium"
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq chromium >/dev/null ||
    echo "NOTE: no chromium package here; the report's browser test will be skipped"
fi

# Fashion-MNIST, the default real data set (src/data reads it from /usr/share/datasets/fashion-mnist,
# or from ACCELBENCH_FASHION_MNIST). Debian packages it; where the distribution does not, the data
# workloads skip and a folder of the IDX files can be named instead.
if ! dpkg -s dataset-fashion-mnist >/dev/null 2>&1; then
  ((updated)) || $SUDO apt-get update -qq
  updated=1
  echo "installing: dataset-fashion-mnist"
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq dataset-fashion-mnist >/dev/null ||
    echo "NOTE: no dataset-fashion-mnist package here; set ACCELBENCH_FASHION_MNIST to a folder of its IDX files"
fi

# Vega, Vega-Lite and vega-embed, pinned in package-lock.json, are inlined into HTML reports at
# build time. `npm ci` installs exactly the locked versions; it runs when node_modules is missing
# or older than the lock file.
if [[ -f package-lock.json ]] && { [[ ! -f node_modules/.package-lock.json ]] || [[ package-lock.json -nt node_modules/.package-lock.json ]]; }; then
  echo "installing the report's charting scripts: npm ci"
  npm ci --no-audit --no-fund --loglevel=error
fi
