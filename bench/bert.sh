#!/usr/bin/env bash
# BERT on one GPU, accelbench beside PyTorch + Hugging Face transformers in one call, each in turn:
#   train  masked-LM training of each --train-models at --train-batch x --train-seq (bert_base and
#          bert_large, 32 x 512): PyTorch eager, torch.compile of the whole forward and loss, and
#          of each layer and the head's loss (compile-blocks; bench/peers/bert_train.py), then
#          `accelbench run train --axis model=bert_base,bert_large --axis batch=32 --axis seq=512
#          --axis precision=bf16`; compared in tokens/s
#   infer  inference of --infer-model at --infer-batch x --infer-seq (bert_large, 1 and 256 x 384):
#          PyTorch eager, CUDA graph and torch.compile (bench/peers/bert_infer.py, --infer-head qa:
#          the SQuAD head), then `accelbench run infer --axis model=bert_large --axis batch=1,256
#          --axis seq=384 --axis precision=bf16`; compared in sequences/s and p50 latency
# then the table of accelbench / each peer (bench/peers/table.py; above 1: accelbench is faster),
# also written to OUT/bert.md and OUT/bert.json. Each step has its own time limit and log
# OUT/STEP.log; one that fails is reported, the others still run, and the exit status is 1.
# OUT: --out, else $AB_LOGS/bert, else $OUT/bert, else ./device-out/bert. torch.compile's
# compilations take most of the time: about 3 minutes for bert_base's training, 4 for bert_large's,
# 4 for inference; where one call's time is short, run the parts in separate calls (`--part train
# --train-models bert_base`, `... bert_large`, `--part infer`).
#   usage: bench/bert.sh [--accelbench PATH] [--out DIR] [--part all|train|infer] [--precision bf16]
#                        [--train-models bert_base,bert_large] [--train-batch 32] [--train-seq 512]
#                        [--infer-model bert_large] [--infer-batch 1,256] [--infer-seq 384]
#                        [--infer-head qa|mlm|encoder]
#                        [--skip eager,compile,compile-blocks,cudagraph,accelbench]
#                        [--dry-run]
#   on the GPU machine: scripts/device.sh bench bert [ARGS]
set -uo pipefail
cd "$(dirname "$0")/.." || exit 2
usage() { sed -n '2,/^set -uo/p' "$0" | sed '$d; s/^# \{0,1\}//' >&2; exit 2; }

ab=./build/cuda/src/cli/accelbench
out=${AB_LOGS:+$AB_LOGS/bert}
out=${out:-${OUT:-./device-out}/bert}
part=all precision=bf16 skip="" dry_run=0
train_models=bert_base,bert_large train_batch=32 train_seq=512
infer_model=bert_large infer_batch=1,256 infer_seq=384 infer_head=qa
while [[ $# -gt 0 ]]; do
  case $1 in
    --accelbench) ab=${2:?}; shift ;;
    --out) out=${2:?}; shift ;;
    --part) part=${2:?}; shift ;;
    --precision) precision=${2:?}; shift ;;
    --train-models) train_models=${2:?}; shift ;;
    --train-batch) train_batch=${2:?}; shift ;;
    --train-seq) train_seq=${2:?}; shift ;;
    --infer-model) infer_model=${2:?}; shift ;;
    --infer-batch) infer_batch=${2:?}; shift ;;
    --infer-seq) infer_seq=${2:?}; shift ;;
    --infer-head) infer_head=${2:?}; shift ;;
    --skip) skip=${2:?}; shift ;;
    --dry-run) dry_run=1 ;;
    -h | --help) usage ;;
    *) echo "bert.sh: unknown argument '$1'" >&2; usage ;;
  esac
  shift
done
[[ $part =~ ^(all|train|infer)$ ]] || { echo "bert.sh: --part is all, train or infer, not '$part'" >&2; exit 2; }
for n in "$train_batch" "$train_seq" "$infer_seq"; do
  [[ $n =~ ^[0-9]+$ ]] || { echo "bert.sh: '$n' is not a count" >&2; exit 2; }
done
[[ $infer_batch =~ ^[0-9]+(,[0-9]+)*$ ]] || {
  echo "bert.sh: --infer-batch '$infer_batch' is not a list of counts" >&2
  exit 2
}
source bench/peers/steps.sh
[[ $dry_run == 1 ]] || mkdir -p "$out"
gpu=$(gpu_name) || exit 1
echo "BERT ($part), $precision, on $gpu; logs in $out"
peer_logs=()

if [[ $part != infer ]]; then
  IFS=, read -ra models <<< "$train_models"
  for model in "${models[@]}"; do
    for mode in eager compile compile-blocks; do
      skipped "$mode" && continue
      limit=$([[ $mode == eager ]] && echo 180 || echo 360)
      step "pytorch-train-$model-$mode" "$limit" python3 -u bench/peers/bert_train.py --model "$model" \
        --batch "$train_batch" --seq "$train_seq" --precision "$precision" --modes "$mode"
      peer_logs+=("$out/pytorch-train-$model-$mode.log")
    done
  done
  skipped accelbench || accelbench_step accelbench-train 360 "$ab" train --axis model="$train_models" \
    --axis batch="$train_batch" --axis seq="$train_seq" --axis precision="$precision"
fi
if [[ $part != train ]]; then
  for mode in eager cudagraph compile; do
    skipped "$mode" && continue
    limit=$([[ $mode == compile ]] && echo 420 || echo 180)
    step "pytorch-infer-$mode" "$limit" python3 -u bench/peers/bert_infer.py --model "$infer_model" \
      --batch "$infer_batch" --seq "$infer_seq" --precision "$precision" --head "$infer_head" --modes "$mode"
    peer_logs+=("$out/pytorch-infer-$mode.log")
  done
  skipped accelbench || accelbench_step accelbench-infer 300 "$ab" infer --axis model="$infer_model" \
    --axis batch="$infer_batch" --axis seq="$infer_seq" --axis precision="$precision"
fi

[[ $dry_run == 1 ]] && exit 0
title="BERT, $precision, $gpu (PyTorch's inference head: $infer_head; accelbench / this: above 1, accelbench is faster)"
python3 bench/peers/table.py compare --title "$title" \
  --peers "${peer_logs[@]}" --accelbench "$out/accelbench" \
  --accelbench-log train="$out/accelbench-train.log" --accelbench-log infer="$out/accelbench-infer.log" \
  --md "$out/bert.md" --json "$out/bert.json" || failed+=(table)
finish
