"""The lines the peers print and how bench/gpt2.sh and bench/bert.sh read them back (standard
library only, so the table is made where PyTorch is absent):
  peer-result {json}   one per measured mode of a PyTorch peer (gpt2_train.py, bert_train.py,
                       bert_infer.py) or of llm.c (from its log, below)
  peer-error {json}    one per mode that failed, with the error; the script exits non-zero
llm.c's per-step lines are the ones .anchors/llmc/run.sh keeps of train_gpt2cu's output:
  step    2/60 | loss 10.987654 (+0.12z)| norm 1.2345 (-0.50z)| lr 6.00e-04 | 33.91 ms | 45.1% bf16 MFU | 483140 tok/s
llm.c times each step with CUDA events around all of it (its data loading and the host's reads of
the loss and the gradient norm included); its tok/s is a moving average from step 2 on. The figure
kept here is the batch's tokens over the mean of the step times after a warm-up. (The PyTorch peers
take the median over batches of back-to-back steps, which nothing in them makes wait for the host.)"""
import json
import math
import re
import statistics

RESULT = "peer-result"
ERROR = "peer-error"


def result_line(fields):
    return f"{RESULT} {json.dumps(fields)}"


def error_line(fields):
    return f"{ERROR} {json.dumps(fields)}"


def read_lines(paths):
    """(results, errors): the peer-result and peer-error objects of these files, in order; a file
    that does not exist is skipped (its step did not run), a line that does not parse is an error."""
    results, errors = [], []
    for path in paths:
        try:
            with open(path, errors="replace") as f:
                text = f.read()
        except FileNotFoundError:
            continue
        for number, line in enumerate(text.splitlines(), 1):
            for prefix, into in ((RESULT, results), (ERROR, errors)):
                if line.startswith(prefix + " "):
                    try:
                        into.append(json.loads(line[len(prefix) + 1:]))
                    except json.JSONDecodeError as e:
                        errors.append({"source": f"{path}:{number}", "error": f"unreadable {prefix} line: {e}"})
    return results, errors


# The format train_gpt2.cu prints (printf0 in its training loop), one line per step.
LLMC_STEP = re.compile(r"^step\s+(?P<step>\d+)/(?P<steps>\d+)\s*\|\s*loss\s+(?P<loss>\S+)\s.*?"
                       r"\|\s*(?P<ms>[0-9.]+) ms\s*\|\s*(?P<mfu>-?[0-9.]+)% bf16 MFU\s*\|\s*(?P<tok>[0-9.]+) tok/s")
LLMC_PARAMS = re.compile(r"^num_parameters:\s*(\d+)")


def number(text):
    """A printed float; C's "-nan" and anything unreadable as NaN."""
    try:
        return float(text)
    except ValueError:
        return math.nan


def parse_llmc(text, batch, seq, warmup_steps):
    """llm.c's peer-result from its log: batch * seq tokens over the mean step time of the steps
    after the first warmup_steps. ValueError, saying what is missing, when it cannot be read."""
    steps = [m for m in map(LLMC_STEP.match, text.splitlines()) if m]
    if not steps:
        tail = " | ".join(text.strip().splitlines()[-5:]) or "(empty)"
        raise ValueError(f"no llm.c step lines in its log (did it build and run? its last lines: {tail})")
    timed = steps[warmup_steps:]
    if not timed:
        raise ValueError(f"llm.c printed {len(steps)} step lines, none after the {warmup_steps} warm-up steps")
    times_ms = [float(m["ms"]) for m in timed]
    losses = [number(m["loss"]) for m in timed]
    params = [int(m[1]) for m in map(LLMC_PARAMS.match, text.splitlines()) if m]
    mean_ms = statistics.mean(times_ms)
    return {"peer": "llm.c", "bench": "train", "mode": "llm.c (cuDNN attention)", "model": "gpt2_124m",
            "precision": "bf16", "batch": batch, "seq": seq,
            "tokens_per_s": batch * seq / mean_ms * 1e3, "step_ms": mean_ms,
            "step_ms_median": statistics.median(times_ms), "steps_timed": len(timed), "warmup_steps": warmup_steps,
            # llm.c prints -100% where it has no peak figure for the GPU (the H200 is not in its table).
            "mfu_pct_mean": (statistics.mean(float(m["mfu"]) for m in timed)
                             if all(float(m["mfu"]) >= 0 for m in timed) else None),
            "llmc_ema_tokens_per_s_last": float(timed[-1]["tok"]),
            "loss_last": losses[-1], "loss_finite": all(math.isfinite(x) for x in losses),
            "num_parameters": params[0] if params else None}
