"""Helpers shared by the compare_*.py scripts: CUDA-event timing the way accelbench's batch mode
times, and running accelbench's CLI to read back the records of the run it made."""
import json
import os
import statistics
import subprocess

import torch


def time_batches(fn, iters_per_batch, batches, warmup):
    """Median seconds per call over batches of back-to-back calls, timed with CUDA events."""
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(batches):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(iters_per_batch):
            fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) / 1e3 / iters_per_batch)
    return statistics.median(times)


def accelbench(binary, args, out_dir):
    """Runs `accelbench run ARGS --out OUT_DIR -q`; returns the records of the one run it added."""
    os.makedirs(out_dir, exist_ok=True)
    runs_dir = os.path.join(out_dir, "runs")
    before = set(os.listdir(runs_dir)) if os.path.isdir(runs_dir) else set()
    cmd = [binary, "run", *args, "--out", out_dir, "-q"]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} failed ({proc.returncode}):\n{proc.stdout}\n{proc.stderr}")
    new = [r for r in os.listdir(runs_dir) if r not in before and os.path.isdir(os.path.join(runs_dir, r))]
    if len(new) != 1:
        raise SystemExit(f"expected one new run in {runs_dir}, found {new}")
    with open(os.path.join(runs_dir, new[0], "points.jsonl")) as f:
        return [json.loads(line) for line in f]
