#!/usr/bin/env python3
"""PyTorch's BERT inference, a peer of `accelbench run infer --axis model=bert_large --axis seq=384
--axis batch=1,256` (bench/bert.sh runs both).

Hugging Face transformers' BERT built from its configuration as bert_train.py builds it, with
the head --head names: qa (BertForQuestionAnswering, default: MLPerf Inference's BERT-large task,
SQuAD at sequence 384), mlm (BertForMaskedLM: the logits over the vocabulary at every position) or
encoder (BertModel). Weights and activations in the precision (bf16, fp16; tf32 and fp32: fp32
weights), eval mode under torch.inference_mode, random tokens with no padding (no attention mask,
so sdpa runs flash attention). Modes:
  eager      the model called from Python
  cudagraph  its forward captured once in a CUDA graph (after warm-up on a side stream), replayed
  compile    torch.compile(model, dynamic=False), mode reduce-overhead by default (Inductor's
             kernels replayed as CUDA graphs), compiled afresh for each batch
  compile-blocks  each encoder layer compiled so, the model's forward eager (common.compile_blocks
             says why; not in the default modes)
Latency as accelbench's infer samples it: one forward per sample, timed alone with CUDA events
(bench/compare_resnet.py's time_singles), after warm-up; p50 and p99 (type 7), sequences/s =
batch / p50. One peer-result line per mode and batch (bench/peers/lines.py), a failure a
peer-error line; exit 1 if any failed.
  usage: bert_infer.py [--model bert_large] [--batch 1,256] [--seq 384] [--precision bf16]
                       [--modes eager,cudagraph,compile] [--head qa]
"""
import argparse

import options
from bert_train import BERT_POSITIONS, BERT_SIZES, BERT_VOCAB, bert_config

HEADS = {"qa": "BertForQuestionAnswering", "mlm": "BertForMaskedLM", "encoder": "BertModel"}
MODES = ("eager", "cudagraph", "compile", "compile-blocks")
LARGE_BATCH = 32  # above it a forward takes milliseconds: fewer samples suffice


def batch_list(text):
    try:
        batches = [int(b) for b in text.split(",") if b]
    except ValueError:
        raise argparse.ArgumentTypeError(f"'{text}' is not a comma-separated list of batch sizes")
    if not batches or min(batches) <= 0:
        raise argparse.ArgumentTypeError(f"batch sizes must be positive: '{text}'")
    return batches


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="bert_large", choices=tuple(BERT_SIZES))
    ap.add_argument("--batch", default=[1, 256], type=batch_list, help="comma-separated batch sizes")
    ap.add_argument("--seq", type=int, default=384)
    ap.add_argument("--precision", default="bf16", choices=options.PRECISIONS)
    ap.add_argument("--head", default="qa", choices=tuple(HEADS))
    ap.add_argument("--modes", default=list(MODES[:3]), type=options.modes_list(MODES),
                    help="comma-separated: " + ", ".join(MODES))
    ap.add_argument("--compile-mode", default="reduce-overhead", choices=options.COMPILE_MODES)
    ap.add_argument("--warmup", type=int, default=20, help="untimed forwards first (compile compiles in the first)")
    ap.add_argument("--samples", type=int, default=300, help=f"timed forwards at batch <= {LARGE_BATCH}")
    ap.add_argument("--large-batch-samples", type=int, default=40, help=f"timed forwards at batch > {LARGE_BATCH}")
    args = ap.parse_args(argv)
    options.positive(args, "seq", "warmup", "samples", "large_batch_samples")
    if args.seq > BERT_POSITIONS:
        ap.error(f"--seq {args.seq} exceeds BERT's {BERT_POSITIONS} positions")
    return args


def captured(model, ids):
    """The forward captured in a CUDA graph: warmed up on a side stream (lazy initialisation and
    library heuristics outside the capture), then recorded once; returns its replay."""
    import torch
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):
            model(input_ids=ids)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        model(input_ids=ids)
    return graph.replay  # the bound method keeps the graph alive


def forward_of(model, ids, mode, compile_mode):
    import torch

    from common import compile_blocks, submodule
    if mode == "eager":
        return lambda: model(input_ids=ids)
    if mode == "cudagraph":
        return captured(model, ids)
    if mode == "compile-blocks":
        compile_blocks(submodule(getattr(model, "bert", model), "encoder.layer"), compile_mode, dynamic=False)
        return lambda: model(input_ids=ids)
    compiled = torch.compile(model, mode=compile_mode, dynamic=False)
    return lambda: compiled(input_ids=ids)


def measure(args, case):
    import torch
    import transformers

    from common import latency, peak_gib, sdpa_model, setup_precision
    setup_precision(args.precision)
    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(args.precision, torch.float32)
    model_class = getattr(transformers, HEADS[args.head])
    model = sdpa_model(model_class, bert_config(args.model, dropout=0.0)).to(dtype).eval()
    batch = case["batch"]
    ids = torch.randint(0, BERT_VOCAB, (batch, args.seq), device="cuda")
    samples = args.samples if batch <= LARGE_BATCH else args.large_batch_samples
    with torch.inference_mode():
        p50_s, p99_s = latency(forward_of(model, ids, case["mode"], args.compile_mode), samples, args.warmup)
    return {"seqs_per_s": batch / p50_s, "tokens_per_s": batch * args.seq / p50_s, "p50_ms": p50_s * 1e3,
            "p99_ms": p99_s * 1e3, "samples": samples, "peak_mem_gib": peak_gib(),
            "num_parameters": sum(p.numel() for p in model.parameters())}


def main():
    args = parse_args()
    import common  # PyTorch and transformers, after the arguments are known to be good
    common.require_gpu()
    what = {"peer": "pytorch", "bench": "infer", "model": args.model, "precision": args.precision,
            "seq": args.seq, "head": args.head}
    if any(m.startswith("compile") for m in args.modes):
        what["compile_mode"] = args.compile_mode
    cases = [{"mode": m, "batch": b} for m in args.modes for b in args.batch]
    raise SystemExit(common.run_cases(cases, lambda case: measure(args, case), what))


if __name__ == "__main__":
    main()
