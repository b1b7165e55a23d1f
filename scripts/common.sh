# Shared by the scripts: find nvcc where NVIDIA installs it.
if ! command -v nvcc >/dev/null 2>&1 && [[ -x /usr/local/cuda/bin/nvcc ]]; then
  export PATH=/usr/local/cuda/bin:$PATH
fi
have_nvcc() { command -v nvcc >/dev/null 2>&1; }
