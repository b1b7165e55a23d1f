#!/bin/sh
# accelbench's launcher (CUDA build): the binary links the CUDA runtime, cuBLASLt, cuDNN and NCCL,
# and without one the dynamic loader stops it before main() naming only the first file. This
# names every missing library and what provides it, then runs the binary.
here=$(dirname "$(readlink -f "$0")")
bin="$here/../libexec/accelbench/accelbench"
if command -v ldd >/dev/null 2>&1; then
  missing=$(ldd "$bin" 2>/dev/null | awk '/not found/ {print $1}')
  if [ -n "$missing" ]; then
    echo "accelbench: shared libraries not found: $(echo $missing)" >&2
    for lib in $missing; do
      case $lib in
        libcudnn*) echo "  $lib: cuDNN 9 for CUDA 13 (NVIDIA's cudnn9-cuda-13 package, or its tarball's lib folder)" >&2 ;;
        libnccl*) echo "  $lib: NCCL 2 (NVIDIA's libnccl2 package)" >&2 ;;
        libcu*) echo "  $lib: the CUDA 13 runtime libraries (cuda-libraries-13-x, or /usr/local/cuda/lib64)" >&2 ;;
        *) echo "  $lib: a distribution package (the .deb's Depends name them)" >&2 ;;
      esac
    done
    echo "Install them, or add their folders to LD_LIBRARY_PATH. A machine without a GPU runs the CPU-only build." >&2
    exit 127
  fi
fi
exec "$bin" "$@"
