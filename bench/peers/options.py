"""The peers' command-line options (standard library only: --help and argument errors need no
PyTorch)."""
import argparse

PRECISIONS = ("bf16", "fp16", "tf32", "fp32")
COMPILE_MODES = ("default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs")
TRAIN_MODES = ("eager", "compile", "compile-blocks")


def add_timing_args(ap, warmup_steps=10):
    ap.add_argument("--warmup-steps", type=int, default=warmup_steps,
                    help="untimed steps first (torch.compile compiles in the first)")
    ap.add_argument("--warmup-s", type=float, default=5.0,
                    help="then more untimed steps until this many seconds have passed (sustained clocks)")
    ap.add_argument("--batches", type=int, default=8, help="timed batches of back-to-back steps (median kept)")
    ap.add_argument("--steps-per-batch", type=int, default=5)


def add_train_args(ap, models, batch, seq):
    ap.add_argument("--model", default=models[0], choices=models)
    ap.add_argument("--batch", type=int, default=batch)
    ap.add_argument("--seq", type=int, default=seq)
    ap.add_argument("--precision", default="bf16", choices=PRECISIONS,
                    help="bf16 / fp16: autocast over fp32 weights (fp16 with dynamic loss scaling); "
                         "tf32: fp32 with TF32 matmuls; fp32")
    ap.add_argument("--modes", default=",".join(TRAIN_MODES), type=modes_list(TRAIN_MODES),
                    help="comma-separated: eager; compile (torch.compile of the forward and the loss); "
                         "compile-blocks (each transformer block and the classifier with its loss compiled, "
                         "the model's own forward eager)")
    ap.add_argument("--compile-mode", default="default", choices=COMPILE_MODES, help="torch.compile's mode")
    ap.add_argument("--lr", type=float, default=6e-4)
    ap.add_argument("--weight-decay", type=float, default=0.1)
    ap.add_argument("--grad-clip", type=float, default=1.0)
    add_timing_args(ap)


def modes_list(allowed):
    def parse(text):
        modes = [m for m in text.split(",") if m]
        bad = [m for m in modes if m not in allowed]
        if bad or not modes:
            raise argparse.ArgumentTypeError(f"modes {bad or '(none)'}: choose among {', '.join(allowed)}")
        return modes
    return parse


def positive(args, *names):
    for name in names:
        if getattr(args, name) <= 0:
            raise SystemExit(f"--{name.replace('_', '-')} must be positive, not {getattr(args, name)}")
