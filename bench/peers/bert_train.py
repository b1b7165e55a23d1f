#!/usr/bin/env python3
"""PyTorch's BERT masked-LM training, a peer of `accelbench run train --axis model=bert_base (or
bert_large) --axis seq=512` (bench/bert.sh runs both).

Hugging Face transformers' BertForMaskedLM built from its configuration (nothing downloaded:
WordPiece vocabulary 30522, 512 positions, 2 token types; base = 12 layers of 12 heads, 768 wide,
MLP 3072; large = 24 layers of 16 heads, 1024 wide, MLP 4096; GELU's tanh form, as BERT's own
code and accelbench compute it; the decoder tied to the word embeddings), sdpa attention,
dropout off (throughput; --dropout for BERT's 0.1), random tokens with no padding; 15% of the
positions masked (their input replaced by [MASK], their label the token), the others' labels
-100, so the loss is over the masked positions (the head's logits over all of them, as Hugging
Face computes it).
Precision, fused AdamW, clipping, modes (compile-blocks: each encoder layer compiled, and the MLM
head with its loss), timing and output as gpt2_train.py's (one peer-result line per mode,
bench/peers/lines.py; exit 1 if any mode failed).
  usage: bert_train.py [--model bert_base|bert_large] [--batch 32] [--seq 512] [--precision bf16]
                       [--modes eager,compile,compile-blocks]
"""
import argparse

import options

# name: (layers, heads, width, MLP width)
BERT_SIZES = {"bert_base": (12, 12, 768, 3072), "bert_large": (24, 16, 1024, 4096)}
BERT_VOCAB = 30522
BERT_POSITIONS = 512
MASK_ID = 103  # [MASK] in BERT's uncased WordPiece vocabulary
MASKED_FRACTION = 0.15


def bert_config(name, dropout):
    from transformers import BertConfig
    layers, heads, width, mlp = BERT_SIZES[name]
    return BertConfig(vocab_size=BERT_VOCAB, hidden_size=width, num_hidden_layers=layers, num_attention_heads=heads,
                      intermediate_size=mlp, hidden_act="gelu_new", max_position_embeddings=BERT_POSITIONS,
                      type_vocab_size=2, hidden_dropout_prob=dropout, attention_probs_dropout_prob=dropout,
                      tie_word_embeddings=True)


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    options.add_train_args(ap, tuple(BERT_SIZES), batch=32, seq=512)
    ap.add_argument("--dropout", type=float, default=0.0, help="hidden and attention dropout (BERT trains with 0.1)")
    args = ap.parse_args(argv)
    options.positive(args, "batch", "seq", "batches", "steps_per_batch")
    if args.seq > BERT_POSITIONS:
        ap.error(f"--seq {args.seq} exceeds BERT's {BERT_POSITIONS} positions")
    if not 0 <= args.dropout < 1:
        ap.error(f"--dropout {args.dropout} is not in [0, 1)")
    return args


def masked_batch(batch, seq):
    """(input ids, labels): random tokens, MASKED_FRACTION of them masked and labelled."""
    import torch
    tokens = torch.randint(0, BERT_VOCAB, (batch, seq), device="cuda")
    masked = torch.rand(batch, seq, device="cuda") < MASKED_FRACTION
    if not masked.any():
        raise RuntimeError(f"no position of {batch}x{seq} was masked")
    return torch.where(masked, MASK_ID, tokens), torch.where(masked, tokens, -100)


def loss_of(model, mode, compile_mode, autocast_dtype):
    """loss_fn(ids, labels): the masked-LM loss (mean over the labelled positions), as the mode runs it."""
    import torch
    import torch.nn.functional as F

    from common import compile_blocks, submodule
    autocast = torch.autocast("cuda", dtype=autocast_dtype or torch.bfloat16, enabled=autocast_dtype is not None)
    if mode == "compile-blocks":
        compile_blocks(submodule(model, "bert.encoder.layer"), compile_mode)
        mlm_head = submodule(model, "cls")
        head = torch.compile(lambda hidden, labels: F.cross_entropy(
            mlm_head(hidden).float().view(-1, BERT_VOCAB), labels.view(-1), ignore_index=-100), mode=compile_mode)

        def loss_fn(ids, labels):
            with autocast:
                return head(model.bert(input_ids=ids).last_hidden_state, labels)
        return loss_fn

    def loss_fn(ids, labels):
        with autocast:
            return model(input_ids=ids, labels=labels).loss
    return torch.compile(loss_fn, mode=compile_mode) if mode == "compile" else loss_fn


def measure(args, case):
    from transformers import BertForMaskedLM

    from common import peak_gib, sdpa_model, setup_precision, time_train
    autocast_dtype = setup_precision(args.precision)
    model = sdpa_model(BertForMaskedLM, bert_config(args.model, args.dropout)).train()
    ids, labels = masked_batch(args.batch, args.seq)
    loss_fn = loss_of(model, case["mode"], args.compile_mode, autocast_dtype)
    step_s, loss = time_train(model, loss_fn, args, (ids, labels))
    return {"tokens_per_s": args.batch * args.seq / step_s, "samples_per_s": args.batch / step_s,
            "step_ms": step_s * 1e3, "peak_mem_gib": peak_gib(), "loss_last": loss,
            "num_parameters": sum(p.numel() for p in model.parameters()), "dropout": args.dropout}


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
