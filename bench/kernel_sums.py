#!/usr/bin/env python3
"""Where one step's GPU time goes, kernel by kernel, from bench/kernel_trace.cpp's timelines.

The trace (DIR/kernels-<pid>.csv + names-<pid>.csv) is cut into steps at each start of a kernel
that runs once per step (--marker, a regular expression over kernel names, e.g. count_step_kernel
for an AdamW step); the median-length step of the last --steps is summed by kernel name (names
shortened to the function's), and the names are printed by summed time with their share of the
step, their call count and the step's idle time (no kernel running).
  usage: kernel_sums.py DIR --marker REGEX [--steps 20] [--top 30]
"""
import argparse
import csv
import glob
import os
import re
import statistics


def short(name):
    # "void ns::kernel<T, 4>(args)" -> "kernel<T, 4>"; cuBLAS/cutlass names keep their first 90 chars.
    m = re.match(r"(?:void\s+)?(?:[\w:]+::)?([\w]+(?:<[^()]*>)?)\(", name)
    return (m.group(1) if m else name)[:90]


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("dir")
    ap.add_argument("--marker", required=True)
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--top", type=int, default=30)
    a = ap.parse_args()
    files = glob.glob(os.path.join(a.dir, "kernels-*.csv"))
    if not files:
        raise SystemExit(f"kernel_sums: no kernels-*.csv in {a.dir}")
    biggest = max(files, key=os.path.getsize)
    pid = re.search(r"kernels-(\d+)\.csv$", biggest).group(1)
    names = {}
    with open(os.path.join(a.dir, f"names-{pid}.csv")) as f:
        for row in csv.reader(f):
            if len(row) >= 2:
                names[row[0]] = ",".join(row[1:])
    kernels = []
    with open(biggest) as f:
        for row in csv.reader(f):
            if len(row) < 5 or not row[0].isdigit():
                continue
            name = names.get(row[4], row[4])
            if name.startswith("[api"):
                continue
            kernels.append((int(row[0]), int(row[1]), name))
    kernels.sort()
    marker = re.compile(a.marker)
    starts = [k[0] for k in kernels if marker.search(k[2])]
    if len(starts) < 3:
        raise SystemExit(f"kernel_sums: marker '{a.marker}' starts only {len(starts)} steps")
    steps = list(zip(starts[:-1], starts[1:]))[-a.steps:]
    lengths = sorted(steps, key=lambda s: s[1] - s[0])
    t0, t1 = lengths[len(lengths) // 2]
    sums, counts, busy_end, busy = {}, {}, t0, 0
    for s, e, n in kernels:
        if s < t0 or s >= t1:
            continue
        k = short(n)
        sums[k] = sums.get(k, 0) + (e - s)
        counts[k] = counts.get(k, 0) + 1
        if e > busy_end:
            busy += e - max(s, busy_end)
            busy_end = e
    step = t1 - t0
    print(f"median step of the last {len(steps)}: {step / 1e6:.3f} ms, kernels {sum(counts.values())}, "
          f"idle {(step - busy) / 1e6:.3f} ms; step lengths ms: "
          f"{statistics.median([(e - s) / 1e6 for s, e in steps]):.3f} median")
    for k, t in sorted(sums.items(), key=lambda kv: -kv[1])[: a.top]:
        print(f"{t / 1e6:9.3f} ms {100 * t / step:5.1f}%  x{counts[k]:<4d} {k}")


if __name__ == "__main__":
    main()
