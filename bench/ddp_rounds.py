#!/usr/bin/env python3
"""Rounds of bench/compare_ddp.py side by side: scaling efficiency drifts between calls on a GPU
that touches its power limit (bench/RESULTS.md, tenth session) by as much as accelbench's and
DDP's differ, so one round decides nothing. Each round (a compare_ddp.py --out folder) measured
PyTorch DDP and accelbench back to back; this prints every round's scaling at the largest world
size for both, what k GPUs added to one GPU's step, and the medians over the rounds, and exits 1
when a round has no figure for either side.

    python3 bench/ddp_rounds.py OUT/round-1 OUT/round-2 OUT/round-3
"""
import argparse
import json
import os
import statistics
import sys


def rows_of(folder):
    with open(os.path.join(folder, "compare_ddp.json")) as f:
        report = json.load(f)
    rows = [r for r in report.get("rows", []) if r.get("gpus", 0) > 1]
    return max(rows, key=lambda r: r["gpus"]) if rows else None


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("rounds", nargs="+", help="compare_ddp.py --out folders, one per round")
    args = ap.parse_args()
    fields = ("ours_scaling", "torch_scaling", "ours_added_ms", "torch_added_ms", "ratio")
    seen, complete = [], True
    print("| round | GPUs | accelbench scaling | PyTorch DDP scaling | accelbench ms added | PyTorch ms added | accelbench / PyTorch |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    for folder in args.rounds:
        try:
            row = rows_of(folder)
        except (OSError, ValueError) as e:
            row, why = None, str(e)
        else:
            why = "no multi-GPU row"
        if row is None or any(row.get(f) is None for f in fields):
            complete = False
            print(f"| {os.path.basename(folder.rstrip('/'))} | | incomplete: {why if row is None else 'a side has no figure'} | | | | |")
            continue
        seen.append(row)
        print(f"| {os.path.basename(folder.rstrip('/'))} | {row['gpus']} | {100 * row['ours_scaling']:.2f}% "
              f"| {100 * row['torch_scaling']:.2f}% | {row['ours_added_ms']:+.2f} | {row['torch_added_ms']:+.2f} "
              f"| {row['ratio']:.3f} |")
    if seen:
        med = {f: statistics.median(r[f] for r in seen) for f in fields}
        print(f"| median of {len(seen)} | {seen[0]['gpus']} | {100 * med['ours_scaling']:.2f}% "
              f"| {100 * med['torch_scaling']:.2f}% | {med['ours_added_ms']:+.2f} | {med['torch_added_ms']:+.2f} "
              f"| {med['ratio']:.3f} |")
        ahead = sum(1 for r in seen if r["ours_scaling"] >= r["torch_scaling"])
        print(f"\naccelbench's scaling at least DDP's in {ahead} of {len(seen)} rounds")
    sys.exit(0 if complete and seen else 1)


if __name__ == "__main__":
    main()
