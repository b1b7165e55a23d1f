#!/usr/bin/env bash
# On the GPU machine (Ubuntu 24.04 + CUDA 13 image): builds the cuda preset, runs every test (the
# GPU tests run there), then the GPU benchmarks and the PyTorch comparison. Logs go to $OUT when
# set (else ./device-out), packed into one archive. That image lacks sqlite3.h: carry Debian's
# libsqlite3-dev .deb in .deps/ (apt-get download libsqlite3-dev); it is unpacked into a private
# prefix, never into /.
#   usage: scripts/device.sh [test|bench|all|heap|asan|multi|ddp|overlap|timeline|verify|coop|copy|alone|sweep|engine|train|resnext|fp8][,more modes] (default all)
# asan (nvidia-h200-x2): the cuda-sanitize build's DataParallel tests under mpirun (a heap-corruption hunt).
# engine: the engine's GPU tests (nn_cuda*, workloads_models, nn, models) with their output, then
# ResNet-50 training with train fuse=off/on in bf16 and fp16 (accelbench alone; ~5 min).
# train: ResNet-50 bf16 training beside PyTorch torch.compile (compare_resnet.py, fuse=$FUSE,
# default on; ~4 min).
# resnext: the folded paths' GPU tests, infer fold=off/on/fused side by side, then ResNeXt-101 32x4d
# fp16 inference beside PyTorch + CUDA graphs at the batch-size study's batches (fold=$FOLD, default
# fused), samples/J at batch 10, and 32x8d at batch 1 (issue 5's targets, ~6 min).
# heap (nvidia-h200-x2): the heap-corruption check (2-GPU training under mpirun, bound to a core per
# rank and unbound, 3 runs each) and dist_test's DataParallel tests, ~3 min; `heap,ddp` is one call.
# multi (the nvidia-h200-x2 machine): the multi-GPU checks only — dist_test (MPI bootstrap and the
# GPU collectives/p2p tests), accelbench collectives under mpirun and in one process, p2p, sysinfo's
# topology, and bench/compare_nccl.py against torch.distributed. Where the image has no mpirun,
# carry Debian's OpenMPI in .deps/openmpi/ (on the dev machine: mkdir -p .deps/openmpi && cd
# .deps/openmpi && apt-get download openmpi-bin openmpi-common libopenmpi3 libopenmpi-dev libpmix2
# libhwloc15 libevent-core-2.1-7 libevent-pthreads-2.1-7 libfabric1 libucx0 libibverbs1
# ibverbs-providers librdmacm1 libpsm2-2 libpsm-infinipath1 libnl-3-200 libnl-route-3-200 libnuma1
# libmunge2 libatomic1); it is unpacked into a private prefix and found through OPAL_PREFIX.
# ddp (the nvidia-h200-x2/x4 machines): MPI set up as for multi, then bench/compare_ddp.py
# (ResNet-50 training on 1..N GPUs, accelbench under mpirun beside PyTorch DDP; needs mpirun as multi),
# with DDP_ROUNDS=R, R rounds and bench/ddp_rounds.py's medians; DDP_ARGS: more compare_ddp.py arguments
# (e.g. "--warmup-s 25 --torch-compile": every point warmed up to sustained-load clocks first, PyTorch
# compiled); with KNOBS=1, then NCCL's overlap
# knobs (comm_ctas, comm_priority) at 1 and N GPUs.
# overlap (x2): 2-GPU training over the tail bucket, bucket delay and wire dtype (~6 min, see below).
# coop (x2): the batch-norm and fp8 GPU tests (cooperative kernels on and off; the linear layer's
# 1x1-pixel fp8 case), then ResNet-50 bf16 training at 1 and N GPUs with cooperative_kernels=on,off
# (the one-GPU cost of the project's batch norm against the scaling it may gain; ~5 min).
# copy (x2): the copy-engine averager (train comm_engine=copy): its 2-GPU test beside NCCL's, then
# ResNet-50 bf16 training at 1 and N GPUs with comm_engine=nccl,copy, then PyTorch DDP alone
# (bench/compare_ddp.py --skip-accelbench) for the same run's DDP scaling, and a 2-GPU run whose ranks
# each see only their own GPU (it must end, with copy engines or NCCL's fallback named; ~4 min).
# alone (x2): the floor of data-parallel scaling without communication: ResNet-50 bf16 one-GPU
# training on each GPU by itself, then on every GPU at once (one process each, nothing exchanged;
# SM clocks and power sampled meanwhile), then 2-GPU training with comm_engine=$ALONE_ENGINES (default
# nccl,copy; ~5 min); ALONE_ARGS: more `run` arguments for every point (e.g. "--warmup 15"), each
# point printed with its GPU's clock, power, power-capped share and temperature.
# sweep (x2): ResNet-50 bf16 training at 1 and N GPUs over $SWEEP_AXES (e.g. "--axis steps_per_sample=1,5,20"),
# summarized with the record fields $SWEEP_FIELDS (e.g. params.steps_per_sample).
# verify (x2): the GPU tests of the collectives, data-parallel code and SGD kernels only (~1 min after the build);
# with NTHREADS set, then 2-GPU training with NCCL_NTHREADS=$NTHREADS and comm_ctas 0,8.
# timeline (x2): kernel timelines (bench/kernel_trace.cpp through CUPTI) of accelbench's ResNet-50
# bf16 training at 1 and N GPUs and of PyTorch DDP's, cut into steps by bench/trace_steps.py: how
# long the all-reduces run alone, how much the compute slows beside them (~5 min). TRACE_COMM: the
# regex of communication kernels (default nccl; "nccl|wire_cast_cu.*mean_kernel" with comm_engine=copy
# and comm_mean=kernel: plain "mean_kernel" also matches the loss's; steps with a peer copy count as
# data-parallel whatever the regex).
set -uo pipefail
cd "$(dirname "$0")/.."
what=${1:-all}
# Several modes in one call, comma-separated (e.g. engine,train): one build, one machine start.
want() { [[ ",$what," == *",$1,"* ]]; }
out=${OUT:-$PWD/device-out}
# AB_LOGS: where the logs are written as they come (default a fresh temporary folder). The archive
# is packed at exit; a caller that may kill this script at a time limit (bash runs no exit trap
# while a foreground command holds it) sets AB_LOGS and packs that folder itself afterwards:
#   AB_LOGS=/tmp/ab-logs timeout -k 5 500 bash scripts/device.sh ddp; tar czf $OUT/logs.tgz -C /tmp ab-logs
logs=${AB_LOGS:-$(mktemp -d)/logs}
mkdir -p "$out" "$logs"
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export PATH=/usr/local/cuda/bin:$PATH
trap 'tar czf "$out/device-logs.tgz" -C "$(dirname "$logs")" "$(basename "$logs")"' EXIT

extra=()
if [[ ! -f /usr/include/sqlite3.h ]]; then
  prefix=/tmp/ab-sqlite
  for deb in .deps/libsqlite3-dev_*.deb; do dpkg -x "$deb" "$prefix"; done
  lib=$(ls /usr/lib/x86_64-linux-gnu/libsqlite3.so.0 2>/dev/null || ls $prefix/usr/lib/x86_64-linux-gnu/libsqlite3.a)
  extra=(-DSQLite3_INCLUDE_DIR=$prefix/usr/include -DSQLite3_LIBRARY=$lib)
fi

# The modes that launch ranks under mpirun.
wants_mpi() {
  want multi || want heap || want ddp || want overlap || want timeline || want verify || want coop || want copy ||
    want alone || want sweep || want asan
}
if wants_mpi && ! command -v mpirun >/dev/null 2>&1; then
  mpi=/tmp/ab-openmpi
  ls .deps/openmpi/*.deb >/dev/null 2>&1 || { echo "no mpirun and no .deps/openmpi/*.deb: see this script's header"; exit 1; }
  for deb in .deps/openmpi/*.deb; do dpkg -x "$deb" "$mpi"; done
  mkdir -p "$mpi/bin"
  ln -sf "$mpi/usr/bin/orterun" "$mpi/bin/mpirun"
  ln -sf "$mpi/usr/bin/opal_wrapper" "$mpi/bin/mpicxx"
  # OPAL_PREFIX relocates OpenMPI; PMIx's few plugins are found through its component path.
  export OPAL_PREFIX=$mpi/usr PATH=$mpi/bin:$mpi/usr/bin:$PATH
  export PMIX_MCA_mca_base_component_path=$mpi/usr/lib/x86_64-linux-gnu/pmix2/lib/pmix
  export LD_LIBRARY_PATH=$mpi/usr/lib/x86_64-linux-gnu:$mpi/usr/lib/x86_64-linux-gnu/openmpi/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
  extra+=(-DMPI_CXX_COMPILER=$mpi/bin/mpicxx)
fi
# One node: MPI's own messages (bootstrap only) stay in shared memory, and mpirun starts the ranks
# itself (the isolated launcher), so the image needs no ssh.
wants_mpi && export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_pml=ob1 \
  OMPI_MCA_btl=self,vader OMPI_MCA_btl_vader_single_copy_mechanism=none OMPI_MCA_plm=isolated

{
  nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.max.sm,power.limit --format=csv
  nvidia-smi topo -m || true
  cmake --preset cuda "${extra[@]}" && cmake --build --preset cuda -j 16
} > "$logs/build.log" 2>&1 || { tail -n 40 "$logs/build.log"; echo "BUILD FAILED"; exit 1; }
echo "build ok"
ab=./build/cuda/src/cli/accelbench

if want test || want all; then
  ctest --preset cuda -j 8 > "$logs/ctest.log" 2>&1
  grep -E "tests passed|tests failed|\(Failed\)|\(Skipped\)|Timeout" "$logs/ctest.log" | head -20
fi
if want multi || want heap; then
  grep -E "MPI" "$logs/build.log" | head -3
  # The heap corruption under mpirun (bench/RESULTS.md, issue 8): dist_test's 2-GPU training command
  # (gpus=1,2), three runs each launched as dist_test launches it (OpenMPI's default binding: a core
  # per rank; since the fix rank 0 then reads no GPU counters), with --bind-to none (counters on), and
  # bound without GPU telemetry. All must exit 0. HEAP_VARIANTS picks others.
  for variant in ${HEAP_VARIANTS:-bind-core unbound bind-core-no-gpu-telemetry}; do
    for i in 1 2 3; do
      flags=()
      bind="--bind-to none"
      [[ $variant == *no-gpu-telemetry ]] && flags=(--no-gpu-telemetry)
      [[ $variant == bind-core* ]] && bind=""
      mpirun -np 2 --allow-run-as-root $bind -x NCCL_NVLS_ENABLE $ab run train --axis model=tiny_resnet \
        --axis precision=fp32 --axis batch=8 --axis image_size=16 --option trajectory_steps=4 --axis gpus=1,2 \
        --axis graph=off,on --axis bucket_mib=0.0001 --min-time 0.05 --max-noise 100 --timeout 20 "${flags[@]}" \
        --out "$logs/heap" > "$logs/heap-$variant-$i.txt" 2>&1
      echo "mpirun train gpus=1,2, $variant, try $i: exit $? $(grep -m1 -E 'free\(\)|munmap|corrupt|Segmentation fault|GPU counters off' "$logs/heap-$variant-$i.txt" | cut -c1-90)"
    done
  done
  if ! want multi && [[ -z ${HEAP_VARIANTS:-} ]]; then  # multi runs all of dist_test below
    ./build/cuda/tests/dist_test --gtest_filter='DataParallel*' > "$logs/dist_test_dp.log" 2>&1
    grep -E "^\[  (PASSED|FAILED|SKIPPED) |tests ran" "$logs/dist_test_dp.log"
  fi
fi
if want multi; then
  ./build/cuda/tests/dist_test > "$logs/dist_test.log" 2>&1
  grep -E "^\[  (PASSED|FAILED|SKIPPED) |tests ran" "$logs/dist_test.log"
  $ab sysinfo | tee "$logs/sysinfo.txt"
  # The targets first (unbuffered, so a time limit keeps what was printed), the long sweeps after.
  python3 -u bench/compare_nccl.py --accelbench $ab --out "$logs" 2>&1 | tee "$logs/compare_nccl.txt" | tail -n 14
  $ab run collectives --axis op=all_reduce --axis bytes=1048576,1073741824 --out "$logs/one" \
    > "$logs/collectives-one.txt" 2>&1; echo "collectives in one process: exit $?"; tail -n 8 "$logs/collectives-one.txt"
  $ab run p2p --axis direction=uni,bi --out "$logs/p2p" > "$logs/p2p.txt" 2>&1; echo "p2p: exit $?"
  tail -n 22 "$logs/p2p.txt"
  mpirun -np 2 --allow-run-as-root --bind-to none -x NCCL_NVLS_ENABLE -x TORCH_SYMM_MEM_DISABLE_MULTICAST \
    -x NVSHMEM_DISABLE_NVLS $ab run collectives --axis bytes=8:8589934592:x32 --axis in_place=0 --min-time 0.2 \
    --out "$logs/mpi" > "$logs/collectives-mpi.txt" 2>&1; echo "collectives under mpirun: exit $?"
  tail -n 8 "$logs/collectives-mpi.txt"
fi
if want engine; then
  ctest --preset cuda -j 6 -R 'nn_cuda|workloads_models|nn_test|models_test' --output-on-failure \
    > "$logs/ctest-engine.log" 2>&1
  grep -E "tests passed|tests failed|\(Failed\)|SEGFAULT|Timeout" "$logs/ctest-engine.log" | head -20
  # Which batch-norm shapes cuDNN's fused BN + ReLU kernels took (train fuse=on).
  ./build/cuda/tests/nn_cuda_test --gtest_filter='*FusedBatchNormRelu*' 2>&1 | grep -E "fused|unfused|OK \]|FAILED"
  # ResNet-50 training with fuse off and on, accelbench alone (one step per sample, 3-step trajectory).
  $ab run train --axis model=resnet50 --axis batch=256 --axis precision=bf16,fp16 --axis layout=nhwc \
    --axis fuse=off,on --option trajectory_steps=3 --out "$logs/fuse" > "$logs/fuse.txt" 2>&1; echo "fuse sweep: exit $?"
  python3 bench/summarize_points.py "$logs/fuse" params.precision params.fuse rates.samples_per_s time.median_s \
    metrics.model.ops metrics.fusion.fused_shapes metrics.fusion.unfused_shapes
fi
if want train; then
  # ResNet-50 bf16 training beside torch.compile (issue 5's training target), fuse=$FUSE (default
  # on). No tail: each figure is printed as measured, and a tail would hold them back until the end.
  python3 -u bench/compare_resnet.py --accelbench $ab --out "$logs/resnet-compile" --train-precisions bf16 \
    --infer-precisions "" --torch-compile --torch-once --train-axes "fuse=${FUSE:-on}" 2>&1 |
    tee "$logs/compare_resnet_compile.txt"
  # fuse on TF32 (the project's fused forward, no cuDNN fused kernels) in both layouts: the default
  # (auto = on) must not be slower where cuDNN does not fuse.
  $ab run train --axis model=resnet50 --axis batch=256 --axis precision=tf32 --axis layout=nhwc,nchw \
    --axis fuse=off,on --option trajectory_steps=3 --out "$logs/fuse-tf32" > "$logs/fuse-tf32.txt" 2>&1
  echo "tf32 fuse sweep: exit $?"
  python3 bench/summarize_points.py "$logs/fuse-tf32" params.layout params.fuse rates.samples_per_s time.median_s \
    metrics.fusion.fused_shapes
fi
if want resnext; then
  # The folded paths' GPU checks first (bias_act, the fused conv epilogue, the folded tiny ResNet),
  # with which configurations cuDNN's fused call won.
  ./build/cuda/tests/nn_cuda_test --gtest_filter='*BiasActivation*:*FoldedTinyResnet*' > "$logs/fold-tests.txt" 2>&1
  echo "fold GPU tests: exit $?"; grep -E "^\[  (PASSED|FAILED) |FAILED  \]|configurations fused" "$logs/fold-tests.txt"
  # fold off / on / fused side by side, accelbench alone (latency and img/s per batch).
  $ab run infer --axis model=resnext101_32x4d --axis precision=fp16 --axis layout=nhwc --axis batch=1,2,10,12 \
    --axis fold=off,on,fused --out "$logs/fold" > "$logs/fold.txt" 2>&1; echo "fold sweep: exit $?"
  python3 bench/summarize_points.py "$logs/fold" params.fold params.batch metrics.latency_s.p50 rates.samples_per_s \
    metrics.model.ops metrics.fusion.fused_shapes metrics.fusion.unfused_shapes
  # Beside PyTorch + CUDA graphs with the fold FOLD picks (default fused; off = the unfolded network).
  fold=${FOLD:-fused}
  python3 -u bench/compare_resnet.py --accelbench $ab --out "$logs/rx4" --model resnext101_32x4d --train-precisions "" \
    --infer-precisions fp16 --infer-batches 1,2,4,8,10,12,16,32,64,128,256 --energy-batches 10 --torch-once \
    --infer-axes "fold=$fold" 2>&1 | tee "$logs/compare_resnext_32x4d.txt"
  python3 -u bench/compare_resnet.py --accelbench $ab --out "$logs/rx8" --model resnext101_32x8d --train-precisions "" \
    --infer-precisions fp16 --infer-batches 1 --torch-once --infer-axes "fold=$fold" 2>&1 |
    tee "$logs/compare_resnext_32x8d.txt"
fi
if want fp8; then
  # fp8 (e4m3) inference (issue 5): the quantization kernels bit for bit, cuDNN's fp8 graph per shape,
  # Kernels::conv2d_fp8_forward against the reference kernels (direct, captured, after new weights),
  # the folded 16-bit paths unchanged, then infer fp16 vs fp8 with the logits' error against float64.
  ./build/cuda/tests/nn_cuda_fp8_test > "$logs/fp8-tests.txt" 2>&1
  echo "fp8 GPU tests: exit $?"; grep -E "^\[  (PASSED|FAILED) |FAILED  \]|refused|aligned shapes|fp8 layer|chosen|Failure|error" "$logs/fp8-tests.txt" | cut -c1-300 | head -40
  ./build/cuda/tests/nn_cuda_test --gtest_filter='*BiasActivation*:*FoldedTinyResnet*' > "$logs/fold-tests.txt" 2>&1
  echo "fold GPU tests: exit $?"; grep -E "^\[  (PASSED|FAILED) |FAILED  \]" "$logs/fold-tests.txt"
  for model in resnet50 resnext101_32x4d; do
    $ab run infer --axis model=$model --axis precision=fp16,fp8 --axis batch=${FP8_BATCHES:-1,8,64,256} \
      --out "$logs/fp8-$model" > "$logs/fp8-$model.txt" 2>&1; echo "infer $model fp16/fp8: exit $?"
    grep -E "error|skipped|failed" "$logs/fp8-$model.txt" | head -5
    python3 bench/summarize_points.py "$logs/fp8-$model" params.precision params.batch rates.samples_per_s \
      metrics.latency_s.p50 metrics.accuracy.logits_rel_error_vs_f64 metrics.accuracy.top1_agrees_f64 metrics.fp8.layers \
      metrics.fp8.fallback_layers metrics.fp8.fallback_slower_layers
  done
  # Every layer cuDNN takes in fp8 (the fp8 kernels themselves, quantize passes included), batch 256.
  $ab run infer --axis model=resnet50 --axis precision=fp8 --axis fp8_layers=all --axis batch=256 \
    --out "$logs/fp8-all" > "$logs/fp8-all.txt" 2>&1; echo "infer resnet50 fp8_layers=all: exit $?"
  python3 bench/summarize_points.py "$logs/fp8-all" params.fp8_layers rates.samples_per_s metrics.fp8.layers
  # Where fp8's time goes: per-op-kind times of one profiled forward, fp16 beside fp8 (batch 256).
  $ab run infer --axis model=resnet50 --axis precision=fp16,fp8 --axis fp8_layers=${PROFILE_FP8_LAYERS:-faster,all} --axis batch=256 --axis profile=on \
    --out "$logs/fp8-profile" > "$logs/fp8-profile.txt" 2>&1; echo "profiled infer: exit $?"
  python3 bench/summarize_points.py "$logs/fp8-profile" params.precision params.fp8_layers metrics.profile | cut -c1-1500
fi
if want asan; then
  # The cuda-sanitize build (ASan + UBSan) under mpirun: the DataParallel tests and the 2 ms telemetry
  # run, to name the first bad heap write (bench/RESULTS.md, issue 8). CUDA needs the shadow gap open.
  { cmake --preset cuda-sanitize "${extra[@]}" && cmake --build --preset cuda-sanitize -j 24 --target accelbench dist_test; } \
    > "$logs/build-asan.log" 2>&1 || { tail -n 30 "$logs/build-asan.log"; echo "ASAN BUILD FAILED"; }
  export ASAN_OPTIONS=protect_shadow_gap=0:detect_leaks=0:halt_on_error=1
  ./build/cuda-sanitize/tests/dist_test --gtest_filter='DataParallel*' > "$logs/dist_test_asan.log" 2>&1
  echo "dist_test DataParallel under ASan: exit $?"
  grep -E "^\[  (PASSED|FAILED) |ERROR: AddressSanitizer|runtime error" "$logs/dist_test_asan.log" | head -20
  grep -m1 -A40 "ERROR: AddressSanitizer" "$logs/dist_test_asan.log" | grep -E "^ +#|ERROR|WRITE|READ|located|allocated|freed|thread" | head -60
  unset ASAN_OPTIONS
fi
if want ddp; then
  grep -E "MPI" "$logs/build.log" | head -3
  # Each figure is printed as measured (unbuffered), so a time limit keeps what was measured.
  # DDP_ROUNDS > 1: that many rounds of PyTorch then accelbench (~1.5 min each on 2 GPUs), and
  # bench/ddp_rounds.py's table of every round's scaling and the medians (the spread between calls
  # is as large as the difference; bench/RESULTS.md, tenth session).
  rounds=${DDP_ROUNDS:-1}
  if [[ $rounds == 1 ]]; then
    python3 -u bench/compare_ddp.py --accelbench $ab --out "$logs/ddp" ${DDP_ARGS:-} 2>&1 | tee "$logs/compare_ddp.txt"
  else
    for r in $(seq 1 $rounds); do
      python3 -u bench/compare_ddp.py --accelbench $ab --out "$logs/ddp/round-$r" ${DDP_ARGS:-} > "$logs/compare_ddp-$r.txt" 2>&1
      echo "round $r: exit $?"
    done
    python3 bench/ddp_rounds.py "$logs"/ddp/round-* | tee "$logs/ddp_rounds.txt"
  fi
  # The overlap knobs of NCCL (KNOBS=1): fewer SMs for NCCL, a top-priority all-reduce stream.
  n=$(nvidia-smi -L | wc -l)
  [[ ${KNOBS:-0} == 1 ]] && mpirun -np $n --allow-run-as-root --bind-to none -x NCCL_NVLS_ENABLE $ab run train --axis model=resnet50 \
    --axis precision=bf16 --axis batch=256 --axis gpus=1,$n --axis comm_ctas=0,16 --axis comm_priority=normal,high \
    --option trajectory_steps=3 --out "$logs/knobs" 2>&1 | tee "$logs/ddp-knobs.txt" | grep -E "ok |median|skipped|error"
  [[ ${KNOBS:-0} == 1 ]] && python3 bench/summarize_points.py "$logs/knobs" params.gpus params.comm_ctas params.comm_priority \
    rates.samples_per_s metrics.scaling_efficiency
fi
if want overlap; then
  # Issue 8's scaling gap. The kernel timeline (timeline mode, bench/RESULTS.md) showed an all-reduce
  # enqueued just before a batch norm holding back cuDNN's cooperative kernel, and the last bucket's
  # all-reduce exposed after backward. Here, at 1 and N GPUs: the tail bucket (TAILS), the delay
  # (DELAYS ops after a bucket completes) and the wire dtype (COMM), then their GPU tests, then
  # PyTorch DDP with its bf16 compress hook (accelbench's side is the comm_dtype=bf16 rows above).
  n=$(nvidia-smi -L | wc -l)
  mpirun -np $n --allow-run-as-root --bind-to none -x NCCL_NVLS_ENABLE $ab run train --axis model=resnet50 \
    --axis precision=bf16 --axis batch=256 --axis gpus=1,$n --axis tail_bucket_mib=${TAILS:-0,1} \
    --axis bucket_delay_ops=${DELAYS:-0,1} --axis comm_dtype=${COMM:-grad,bf16} ${OVERLAP_AXES:-} \
    --option trajectory_steps=3 --out "$logs/overlap" 2>&1 | tee "$logs/overlap.txt" | grep -E "error" | head -5
  python3 bench/summarize_points.py "$logs/overlap" params.gpus params.bucket_mib params.tail_bucket_mib params.bucket_delay_ops \
    params.comm_dtype rates.samples_per_s time.median_s metrics.scaling_efficiency metrics.data_parallel.buckets
  [[ ${OVERLAP_TESTS:-1} == 1 ]] && ./build/cuda/tests/dist_test --gtest_filter='DataParallel.TrainOnTwoGpus*' > "$logs/dist_test_dp2.log" 2>&1
  grep -E "^\[  (PASSED|FAILED|SKIPPED) |Failure" "$logs/dist_test_dp2.log" | head
  [[ ${OVERLAP_TESTS:-1} == 1 ]] && ./build/cuda/tests/backend_cuda_test --gtest_filter='*Averager*:*Wire*' > "$logs/backend_wire.log" 2>&1
  grep -E "^\[  (PASSED|FAILED|SKIPPED) |Failure" "$logs/backend_wire.log" | head
  [[ ${DDP_BF16:-1} == 1 ]] && python3 -u bench/compare_ddp.py --accelbench $ab --out "$logs/ddp-bf16" --gpus $n \
    --skip-accelbench --comm-dtype bf16 2>&1 | tail -n 5
fi
if want coop; then
  ./build/cuda/tests/nn_cuda_test --gtest_filter='*BatchNormActivation*:*BatchNormMatches*' > "$logs/coop-bn.log" 2>&1
  echo "batch-norm GPU tests: exit $?"; grep -E "^\[  (PASSED|FAILED) |Failure" "$logs/coop-bn.log" | head
  ./build/cuda/tests/nn_cuda_fp8_test > "$logs/coop-fp8.log" 2>&1
  echo "fp8 GPU tests: exit $?"; grep -E "^\[  (PASSED|FAILED) |Failure|chosen" "$logs/coop-fp8.log" | cut -c1-200 | head
  n=$(nvidia-smi -L | wc -l)
  mpirun -np $n --allow-run-as-root --bind-to none -x NCCL_NVLS_ENABLE $ab run train --axis model=resnet50 \
    --axis precision=bf16 --axis batch=256 --axis gpus=1,$n --axis cooperative_kernels=on,off \
    --option trajectory_steps=3 --out "$logs/coop" > "$logs/coop.txt" 2>&1
  echo "cooperative_kernels sweep: exit $?"
  python3 bench/summarize_points.py "$logs/coop" params.gpus params.cooperative_kernels rates.samples_per_s \
    metrics.scaling_efficiency metrics.fusion.fused_shapes
fi
if want copy; then
  timeout 240 ./build/cuda/tests/dist_test --gtest_filter='DataParallel.TrainOnTwoGpusAveragesOver*' > "$logs/copy-test.log" 2>&1
  echo "dist_test copy engines + NCCL: exit $?"; grep -E "^\[  (PASSED|FAILED|SKIPPED) |Failure|rror" "$logs/copy-test.log" | head
  n=$(nvidia-smi -L | wc -l)
  timeout 300 mpirun -np $n --allow-run-as-root --bind-to none -x NCCL_NVLS_ENABLE $ab run train --axis model=resnet50 \
    --axis precision=bf16 --axis batch=256 --axis gpus=1,$n --axis comm_engine=nccl,copy ${COPY_AXES:-} \
    --option trajectory_steps=3 --out "$logs/copy" > "$logs/copy.txt" 2>&1
  echo "comm_engine sweep: exit $?"; grep -iE "error|refus" "$logs/copy.txt" | head -5
  python3 bench/summarize_points.py "$logs/copy" params.gpus params.comm_engine rates.samples_per_s time.median_s metrics.fusion.fused_shapes \
    metrics.scaling_efficiency metrics.data_parallel.averaging
  # Each rank seeing only its own GPU: CUDA IPC still maps the peer's memory on this machine (copy
  # engines, measured 2026-11-30); where it cannot, comm_engine=auto must fall back to NCCL on both
  # ranks, saying why. Either way the run must end, with the averaging it used in its record.
  timeout 120 mpirun -np 2 --allow-run-as-root --bind-to none -x NCCL_NVLS_ENABLE bash -c \
    'CUDA_VISIBLE_DEVICES=$OMPI_COMM_WORLD_LOCAL_RANK exec "$0" "$@"' $ab run train --axis model=tiny_resnet \
    --axis batch=8 --axis image_size=16 --axis gpus=2 --option trajectory_steps=2 --out "$logs/copy-own-gpu" \
    > "$logs/copy-own-gpu.txt" 2>&1
  echo "one GPU per process, comm_engine=auto: exit $?"
  python3 bench/summarize_points.py "$logs/copy-own-gpu" params.gpus metrics.data_parallel.averaging \
    metrics.data_parallel.averaging_fallback | cut -c1-400
  [[ ${COPY_DDP:-1} == 1 ]] && timeout 200 python3 -u bench/compare_ddp.py --accelbench $ab --out "$logs/copy-ddp" --gpus $n \
    --skip-accelbench 2>&1 | tail -n 6
fi
if want alone; then
  n=$(nvidia-smi -L | wc -l)
  one=(run train --axis model=resnet50 --axis precision=bf16 --axis batch=256 --axis gpus=1 --option trajectory_steps=3
       --min-time ${ALONE_MIN_TIME:-4} ${ALONE_ARGS:-})
  # Each point's GPU as its telemetry saw it: clocks, power, the share of readings power-capped, temperature.
  t=telemetry.gpus.0
  gpu_fields="$t.mean_sm_clock_mhz $t.mean_power_from_energy_w $t.throttle_fraction.sw_power_cap $t.max_temperature_c"
  for d in $(seq 0 $((n - 1))); do
    CUDA_VISIBLE_DEVICES=$d $ab "${one[@]}" --out "$logs/alone-$d" > "$logs/alone-$d.txt" 2>&1
    echo "cuda:$d alone: $(python3 bench/summarize_points.py "$logs/alone-$d" rates.samples_per_s time.median_s $gpu_fields)"
  done
  nvidia-smi --query-gpu=index,clocks.sm,power.draw,temperature.gpu --format=csv,noheader -lms 500 > "$logs/together-smi.csv" &
  smi=$!
  for d in $(seq 0 $((n - 1))); do
    CUDA_VISIBLE_DEVICES=$d $ab "${one[@]}" --out "$logs/together-$d" > "$logs/together-$d.txt" 2>&1 &
  done
  wait $(jobs -p | grep -v "^$smi$")
  kill $smi 2>/dev/null
  for d in $(seq 0 $((n - 1))); do
    echo "cuda:$d beside the others: $(python3 bench/summarize_points.py "$logs/together-$d" rates.samples_per_s time.median_s $gpu_fields)"
    awk -F', ' -v d=$d '$1 == d && $3 + 0 > 300 { c += $2; p += $3; k++ } END { if (k) printf "  busy samples %d: SM %.0f MHz, %.0f W\n", k, c / k, p / k }' "$logs/together-smi.csv"
  done
  mpirun -np $n --allow-run-as-root --bind-to none -x NCCL_NVLS_ENABLE $ab run train --axis model=resnet50 \
    --axis precision=bf16 --axis batch=256 --axis gpus=1,$n --axis comm_engine=${ALONE_ENGINES:-nccl,copy} ${ALONE_AXES:-} \
    --option trajectory_steps=3 --min-time ${ALONE_MIN_TIME:-4} ${ALONE_ARGS:-} --out "$logs/alone-dp" > "$logs/alone-dp.txt" 2>&1
  echo "data parallel: exit $?"
  python3 bench/summarize_points.py "$logs/alone-dp" params.gpus params.comm_engine params.comm_priority rates.samples_per_s \
    time.median_s metrics.scaling_efficiency $gpu_fields
fi
if want sweep; then
  n=$(nvidia-smi -L | wc -l)
  nvidia-smi --query-gpu=timestamp,index,clocks.sm,power.draw,clocks_throttle_reasons.active --format=csv,noheader \
    -lms 250 > "$logs/sweep-smi.csv" &
  smi=$!
  mpirun -np $n --allow-run-as-root --bind-to none -x NCCL_NVLS_ENABLE $ab run train --axis model=resnet50 \
    --axis precision=bf16 --axis batch=256 --axis gpus=1,$n --option trajectory_steps=3 ${SWEEP_AXES:-} \
    --out "$logs/sweep" > "$logs/sweep.txt" 2>&1
  echo "train sweep ${SWEEP_AXES:-}: exit $?"; grep -iE "error|refus" "$logs/sweep.txt" | head -5
  kill $smi 2>/dev/null
  python3 bench/summarize_points.py "$logs/sweep" params.gpus ${SWEEP_FIELDS:-} rates.samples_per_s time.median_s \
    time.iterations_per_sample metrics.scaling_efficiency metrics.data_parallel.averaging
fi
if want verify; then
  ./build/cuda/tests/backend_cuda_test --gtest_filter='*Averager*:*Wire*:*Pairwise*' > "$logs/verify-backend.log" 2>&1
  echo "backend_cuda_test averager: exit $?"; grep -E "^\[  (PASSED|FAILED|SKIPPED) |Failure" "$logs/verify-backend.log" | head
  ./build/cuda/tests/nn_cuda_pointwise_test --gtest_filter='*Sgd*' > "$logs/verify-sgd.log" 2>&1
  echo "nn_cuda_pointwise_test sgd: exit $?"; grep -E "^\[  (PASSED|FAILED|SKIPPED) |Failure|differs" "$logs/verify-sgd.log" | head
  ./build/cuda/tests/dist_test --gtest_filter='CollectivesGpu.EveryOpDtypeAndInPlaceIsExact:DataParallel.TrainOnTwoGpus*' \
    > "$logs/verify-dist.log" 2>&1
  echo "dist_test collectives + 2-GPU training: exit $?"; grep -E "^\[  (PASSED|FAILED|SKIPPED) |Failure" "$logs/verify-dist.log" | head
  if [[ -n ${NTHREADS:-} ]]; then
    n=$(nvidia-smi -L | wc -l)
    mpirun -np $n --allow-run-as-root --bind-to none -x NCCL_NVLS_ENABLE -x NCCL_NTHREADS=$NTHREADS $ab run train \
      --axis model=resnet50 --axis precision=bf16 --axis batch=256 --axis gpus=1,$n --axis comm_ctas=0,8 \
      --option trajectory_steps=3 --out "$logs/nthreads" > "$logs/nthreads.txt" 2>&1
    python3 bench/summarize_points.py "$logs/nthreads" params.gpus params.comm_ctas rates.samples_per_s metrics.scaling_efficiency
  fi
fi
if want timeline; then
  n=$(nvidia-smi -L | wc -l)
  tracer=$PWD/build/cuda/src/backend/cuda/libab_kernel_trace.so
  mkdir -p "$logs/trace-ab" "$logs/trace-ddp"
  mpirun -np $n --allow-run-as-root --bind-to none -x NCCL_NVLS_ENABLE -x CUDA_INJECTION64_PATH=$tracer \
    -x AB_TRACE_DIR="$logs/trace-ab" $ab run train --axis model=resnet50 --axis precision=bf16 --axis batch=256 \
    --axis gpus=1,$n --option trajectory_steps=3 ${TRACE_AXES:-} --out "$logs/timeline" > "$logs/timeline.txt" 2>&1
  echo "traced train: exit $?"; grep -E "kernel_trace|skipped|error" "$logs/timeline.txt" | head
  python3 bench/summarize_points.py "$logs/timeline" params.gpus rates.samples_per_s time.median_s metrics.scaling_efficiency
  python3 bench/trace_steps.py "$logs/trace-ab" --comm "${TRACE_COMM:-nccl}" --json "$logs/trace-ab.json" 2>&1 | tee "$logs/trace-ab.txt"
  # PyTorch DDP under the same tracer (its steps cut at the NLL loss's forward kernel).
  [[ ${TRACE_DDP:-1} == 1 ]] && CUDA_INJECTION64_PATH=$tracer AB_TRACE_DIR="$logs/trace-ddp" python3 -u bench/compare_ddp.py --accelbench $ab \
    --out "$logs/ddp-traced" --gpus $n --skip-accelbench ${DDP_ARGS:-} 2>&1 | tail -n 6
  [[ ${TRACE_DDP:-1} == 1 ]] && python3 bench/trace_steps.py "$logs/trace-ddp" --marker nll_loss_forward --json "$logs/trace-ddp.json" 2>&1 |
    tee "$logs/trace-ddp.txt"
  gzip -f "$logs"/trace-ab/*.csv "$logs"/trace-ddp/*.csv 2>/dev/null
fi
if want bench || want all; then
  $ab sysinfo | tee "$logs/sysinfo.txt"
  ./build/cuda/src/backend/cuda/ab_timing_check 2>&1 | tee "$logs/timing-check.txt"
  python3 bench/compare_torch.py --accelbench $ab --out "$logs" 2>&1 | tee "$logs/compare.txt" | tail -n 12
  python3 bench/energy_check.py --accelbench $ab --out "$logs" 2>&1 | tail -n 16
  ( time $ab run suites/quick.yaml --out "$logs/quick" ) > "$logs/quick.txt" 2>&1; tail -n 40 "$logs/quick.txt"
fi
