#!/usr/bin/env python3
"""PyTorch's GPT-2 training, a peer of `accelbench run train --axis model=gpt2_124m --axis batch=16
--axis seq=1024 --axis precision=bf16` (bench/gpt2.sh runs both, and llm.c).

Hugging Face transformers' GPT2LMHeadModel built from its configuration (nothing downloaded:
vocabulary 50257, 1024 positions; 124M = 12 layers of 12 heads, 768 wide; tied embeddings), sdpa
attention (flash attention where PyTorch has it), dropout off as llm.c trains, random tokens and
next-token targets, the loss over every position. bf16 / fp16 autocast over fp32 weights (or tf32,
fp32); fused AdamW (lr 6e-4, betas 0.9 / 0.95, weight decay 0.1 on the matrices only), gradients
clipped to global norm 1.0. Modes: eager; compile (torch.compile of the forward and the loss, so
the classifier's cross-entropy fuses with the logits); compile-blocks (each of the 12 blocks
compiled, and the classifier with its loss, the model's forward eager: common.compile_blocks says
why both are measured). Each mode: warm-up steps, then batches of
back-to-back steps timed with CUDA events (bench/compare_common.py), the median step kept; one line
  peer-result {"bench": "train", "model": "gpt2_124m", "mode": "eager", "tokens_per_s": ..,
               "step_ms": .., "peak_mem_gib": .., ...}
per mode (bench/peers/lines.py), a failed mode a peer-error line; exit 1 if any mode failed.
  usage: gpt2_train.py [--model gpt2_124m] [--batch 16] [--seq 1024] [--precision bf16]
                       [--modes eager,compile,compile-blocks] [--compile-mode default] [--vocab 50257]
"""
import argparse

import options

# name: (layers, heads, width); GPT-2's four sizes (llm.c's d12, d24, d36, d48).
GPT2_SIZES = {"gpt2_124m": (12, 12, 768), "gpt2_350m": (24, 16, 1024),
              "gpt2_774m": (36, 20, 1280), "gpt2_1558m": (48, 25, 1600)}
GPT2_VOCAB = 50257
GPT2_POSITIONS = 1024
GPT2_124M_PARAMETERS = 124_439_808  # vocabulary 50257, tied embeddings: Hugging Face's gpt2


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    options.add_train_args(ap, tuple(GPT2_SIZES), batch=16, seq=1024)
    ap.add_argument("--vocab", type=int, default=GPT2_VOCAB,
                    help="vocabulary size (50304, llm.c's padded one, is friendlier to the classifier's GEMM)")
    args = ap.parse_args(argv)
    options.positive(args, "batch", "seq", "vocab", "batches", "steps_per_batch")
    if args.seq > GPT2_POSITIONS:
        ap.error(f"--seq {args.seq} exceeds GPT-2's {GPT2_POSITIONS} positions")
    return args


def build(args):
    from transformers import GPT2Config, GPT2LMHeadModel

    from common import sdpa_model
    layers, heads, width = GPT2_SIZES[args.model]
    config = GPT2Config(vocab_size=args.vocab, n_positions=GPT2_POSITIONS, n_embd=width, n_layer=layers,
                        n_head=heads, activation_function="gelu_new", resid_pdrop=0.0, embd_pdrop=0.0,
                        attn_pdrop=0.0, tie_word_embeddings=True, use_cache=False)
    model = sdpa_model(GPT2LMHeadModel, config).train()
    if model.lm_head.weight.data_ptr() != model.transformer.wte.weight.data_ptr():
        raise RuntimeError("the classifier's weight is not tied to the token embedding")
    count = sum(p.numel() for p in model.parameters())
    if (args.model, args.vocab) == ("gpt2_124m", GPT2_VOCAB) and count != GPT2_124M_PARAMETERS:
        raise RuntimeError(f"GPT-2 124M has {count:,} parameters here, not {GPT2_124M_PARAMETERS:,}")
    return model, count


def loss_of(model, mode, compile_mode, autocast_dtype):
    """loss_fn(x, y): the mean next-token cross-entropy over every position, as the mode runs it."""
    import torch
    import torch.nn.functional as F

    from common import compile_blocks, submodule
    autocast = torch.autocast("cuda", dtype=autocast_dtype or torch.bfloat16, enabled=autocast_dtype is not None)

    def classifier_loss(logits, y):
        return F.cross_entropy(logits.float().view(-1, logits.size(-1)), y.view(-1))

    if mode == "compile-blocks":
        compile_blocks(submodule(model, "transformer.h"), compile_mode)
        lm_head = submodule(model, "lm_head")
        head = torch.compile(lambda hidden, y: classifier_loss(lm_head(hidden), y), mode=compile_mode)

        def loss_fn(x, y):
            with autocast:
                return head(model.transformer(input_ids=x, use_cache=False).last_hidden_state, y)
        return loss_fn

    def loss_fn(x, y):
        with autocast:
            return classifier_loss(model(input_ids=x, use_cache=False).logits, y)
    return torch.compile(loss_fn, mode=compile_mode) if mode == "compile" else loss_fn


def measure(args, case):
    import torch

    from common import peak_gib, setup_precision, time_train
    autocast_dtype = setup_precision(args.precision)
    model, count = build(args)
    # GPT-2's token ids, as llm.c draws them (a padded vocabulary's extra rows are never a target).
    tokens = torch.randint(0, min(args.vocab, GPT2_VOCAB), (args.batch, args.seq + 1), device="cuda")
    x, y = tokens[:, :-1].contiguous(), tokens[:, 1:].contiguous()
    loss_fn = loss_of(model, case["mode"], args.compile_mode, autocast_dtype)
    step_s, loss = time_train(model, loss_fn, args, (x, y))
    return {"tokens_per_s": args.batch * args.seq / step_s, "step_ms": step_s * 1e3, "peak_mem_gib": peak_gib(),
            "loss_last": loss, "num_parameters": count, "vocab": args.vocab}


def main():
    args = parse_args()
    import common  # PyTorch and transformers, after the arguments are known to be good
    common.require_gpu()
    what = {"peer": "pytorch", "bench": "train", "model": args.model, "precision": args.precision,
            "batch": args.batch, "seq": args.seq}
    if any(m.startswith("compile") for m in args.modes):
        what["compile_mode"] = args.compile_mode
    raise SystemExit(common.run_cases([{"mode": m} for m in args.modes], lambda case: measure(args, case), what))


if __name__ == "__main__":
    main()
