#!/usr/bin/env bash
# GPT-2 124M training on one GPU, accelbench beside its peers in one call, each in turn:
#   llmc     llm.c with cuDNN flash attention (.anchors/llmc/run.sh B T STEPS: bench/fetch-anchors.sh
#            copies it from shared/anchors on the dev machine, and the device call carries .anchors);
#            its figure: B*T tokens over the mean step time after --llmc-warmup steps
#   eager    PyTorch + Hugging Face transformers, eager (bench/peers/gpt2_train.py)
#   compile  the same under torch.compile, the whole forward and loss
#   compile-blocks  torch.compile of each block and of the classifier's loss (gpt2_train.py --help)
#   accelbench  `accelbench run train --axis model=gpt2_124m --axis batch=B --axis seq=T --axis precision=bf16`
# then the table of accelbench / each peer in tokens/s (bench/peers/table.py; above 1: accelbench
# is faster), also written to OUT/gpt2.md and OUT/gpt2.json. Each step has its own time limit and
# log OUT/STEP.log; one that fails is reported, the others still run, and the exit status is 1.
# OUT: --out, else $AB_LOGS/gpt2, else $OUT/gpt2, else ./device-out/gpt2. About 5 minutes (llm.c's
# build ~70 s, torch.compile's compilations ~1 min each).
#   usage: bench/gpt2.sh [--accelbench PATH] [--out DIR] [--batch 16] [--seq 1024] [--precision bf16]
#                        [--llmc-steps 60] [--llmc-warmup 10]
#                        [--skip llmc,eager,compile,compile-blocks,accelbench]
#                        [--dry-run]
#   on the GPU machine: scripts/device.sh bench gpt2 [ARGS]
set -uo pipefail
cd "$(dirname "$0")/.." || exit 2
usage() { sed -n '2,/^set -uo/p' "$0" | sed '$d; s/^# \{0,1\}//' >&2; exit 2; }

ab=./build/cuda/src/cli/accelbench
out=${AB_LOGS:+$AB_LOGS/gpt2}
out=${out:-${OUT:-./device-out}/gpt2}
batch=16 seq=1024 precision=bf16 llmc_steps=60 llmc_warmup=10 skip="" dry_run=0
while [[ $# -gt 0 ]]; do
  case $1 in
    --accelbench) ab=${2:?}; shift ;;
    --out) out=${2:?}; shift ;;
    --batch) batch=${2:?}; shift ;;
    --seq) seq=${2:?}; shift ;;
    --precision) precision=${2:?}; shift ;;
    --llmc-steps) llmc_steps=${2:?}; shift ;;
    --llmc-warmup) llmc_warmup=${2:?}; shift ;;
    --skip) skip=${2:?}; shift ;;
    --dry-run) dry_run=1 ;;
    -h | --help) usage ;;
    *) echo "gpt2.sh: unknown argument '$1'" >&2; usage ;;
  esac
  shift
done
for n in "$batch" "$seq" "$llmc_steps" "$llmc_warmup"; do
  [[ $n =~ ^[0-9]+$ ]] || { echo "gpt2.sh: '$n' is not a count" >&2; exit 2; }
done
[[ $llmc_steps -gt $llmc_warmup ]] || { echo "gpt2.sh: --llmc-steps must exceed --llmc-warmup" >&2; exit 2; }
source bench/peers/steps.sh
[[ $dry_run == 1 ]] || mkdir -p "$out"
gpu=$(gpu_name) || exit 1
echo "GPT-2 124M training, batch $batch x $seq tokens, $precision, on $gpu; logs in $out"

if ! skipped llmc; then
  if [[ $precision != bf16 ]]; then
    refuse llmc "llm.c trains in bf16 only, not $precision"
  elif [[ ! -f .anchors/llmc/run.sh && $dry_run != 1 ]]; then
    refuse llmc "no .anchors/llmc/run.sh: run bench/fetch-anchors.sh on the dev machine before the device call" \
      "and carry .anchors"
  else
    quiet=1 step llmc 300 bash .anchors/llmc/run.sh "$batch" "$seq" "$llmc_steps" &&
      step llmc-result 30 python3 bench/peers/table.py llmc "$out/llmc.log" --batch "$batch" --seq "$seq" \
        --warmup-steps "$llmc_warmup"
    [[ $dry_run != 1 && -f /tmp/llmc-build.log ]] && cp /tmp/llmc-build.log "$out/"  # run.sh's build log
  fi
fi
for mode in eager compile compile-blocks; do
  skipped "$mode" && continue
  limit=$([[ $mode == eager ]] && echo 180 || echo 300)
  step "pytorch-$mode" "$limit" python3 -u bench/peers/gpt2_train.py --model gpt2_124m --batch "$batch" --seq "$seq" \
    --precision "$precision" --modes "$mode"
done
skipped accelbench || accelbench_step accelbench 300 "$ab" train --axis model=gpt2_124m --axis batch="$batch" \
  --axis seq="$seq" --axis precision="$precision"

[[ $dry_run == 1 ]] && exit 0
title="GPT-2 124M training, batch $batch x $seq tokens, $precision, $gpu (accelbench / this above 1: accelbench faster)"
python3 bench/peers/table.py compare --title "$title" \
  --peers "$out/llmc-result.log" "$out/pytorch-eager.log" "$out/pytorch-compile.log" "$out/pytorch-compile-blocks.log" \
  --accelbench "$out/accelbench" --accelbench-log "$out/accelbench.log" --md "$out/gpt2.md" --json "$out/gpt2.json" ||
  failed+=(table)
finish
