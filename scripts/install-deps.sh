#!/usr/bin/env bash
# Installs what accelbench needs to build and test on Debian 12 / Ubuntu 24.04, from the
# distribution's packages. The CUDA toolkit (nvcc, cuBLASLt) is expected from NVIDIA's install
# under /usr/local/cuda; without it only the cpu preset builds.
set -euo pipefail
packages=(cmake ninja-build g++ pkg-config git nlohmann-json3-dev libcli11-dev libyaml-cpp-dev libsqlite3-dev
          libopenblas-dev libgtest-dev)
missing=()
for p in "${packages[@]}"; do
  dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p")
done
if ((${#missing[@]})); then
  echo "installing: ${missing[*]}"
  SUDO=""
  [[ $(id -u) -ne 0 ]] && SUDO=sudo
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${missing[@]}" >/dev/null
fi
