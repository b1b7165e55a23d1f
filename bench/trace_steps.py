#!/usr/bin/env python3
"""Where a training step's time goes, from bench/kernel_trace.cpp's kernel timelines.

Each process's trace (DIR/kernels-<pid>.csv + names-<pid>.csv) is cut into steps at the starts of a
kernel that runs once per step (--marker, default the softmax cross-entropy forward). A step with a
communication kernel (--comm, default NCCL's) or a copy from another GPU is a data-parallel step,
one without is a single-GPU step; the eager warm-up steps are left out by keeping the steps within
10% of each kind's 25th percentile. Per kind, the medians of:
  step_ms         marker to next marker
  compute_sum_ms  summed durations of the non-communication kernels
  compute_busy_ms time in which at least one of them runs (their union)
  comm_ms         time in which a communication kernel runs (union)
  comm_alone_ms   communication time with no compute kernel beside it (exposed)
  idle_ms         time with no kernel at all
then the kernels whose summed time per step grew most from the single-GPU steps to the
data-parallel ones (the compute slowed by the all-reduces running beside it), the median
data-parallel step's communication kernels with their offsets and how busy the compute was
meanwhile, each kind's median step's longest idle gaps (offset, length, the kernels on either
side: at the step's end the gap between two CUDA-graph replays), the host's cudaGraphLaunch calls
(how long each blocked) and the median step's memcpys where the trace holds them, and for two
processes the skew: the k-th all-reduce of each paired, how much later one rank started it than
the other (the end difference checks that the two clocks agree), and the compute kernels whose
time per data-parallel step differs most between the two ranks (or that run on one rank only).
  usage: trace_steps.py DIR [--marker REGEX] [--comm REGEX] [--json FILE]
"""
import argparse
import bisect
import csv
import glob
import json
import os
import re
import statistics


def load(kernels_csv):
    pid = re.search(r"kernels-(\d+)\.csv$", kernels_csv).group(1)
    names = {}
    with open(os.path.join(os.path.dirname(kernels_csv), f"names-{pid}.csv")) as f:
        for line in f:
            i, _, name = line.rstrip("\n").partition(",")
            names[int(i)] = name
    rows, extras = [], []
    with open(kernels_csv) as f:
        for r in csv.DictReader(f):
            row = (int(r["start_ns"]), int(r["end_ns"]), int(r["device"]), int(r["stream"]), names[int(r["name_id"])])
            (extras if row[4].startswith("[") else rows).append(row)
    rows.sort()
    extras.sort()
    return pid, rows, extras


def print_extras(extras, steady_steps, mid_step):
    """The cudaGraphLaunch calls the host made during these steps (how long each blocked it) and the
    median step's memcpys."""
    a, b = steady_steps[0]["start"], steady_steps[-1]["start"] + steady_steps[-1]["step_ms"] * 1e6
    launches = sorted((e - s) / 1e6 for s, e, _, _, n in extras if n == "[api cudaGraphLaunch]" and a <= s < b)
    if launches:
        print(f"{'':>14}  cudaGraphLaunch on the host meanwhile: {len(launches)} calls, median "
              f"{statistics.median(launches):.3f} ms, p90 {launches[int(0.9 * (len(launches) - 1))]:.3f} ms, "
              f"max {launches[-1]:.3f} ms")
    a, b = mid_step["start"], mid_step["start"] + mid_step["step_ms"] * 1e6
    copies = [(s, e, n) for s, e, _, _, n in extras if n.startswith("[memcpy") and a <= s < b]
    if copies:
        print(f"{'':>14}  its memcpys (start, end from the marker, ms; GB/s):")
        for s, e, n in copies:
            size = int(re.search(r"(\d+) B", n).group(1))
            print(f"{'':>16}{(s - a) / 1e6:8.3f} {(e - a) / 1e6:8.3f}  {size / max(e - s, 1):7.1f}  {n}")


def union_length(intervals):
    total, cur_s, cur_e = 0, None, None
    for s, e in sorted(intervals):
        if cur_e is None or s > cur_e:
            if cur_e is not None:
                total += cur_e - cur_s
            cur_s, cur_e = s, e
        else:
            cur_e = max(cur_e, e)
    if cur_e is not None:
        total += cur_e - cur_s
    return total


def merged(intervals):
    out = []
    for s, e in sorted(intervals):
        if out and s <= out[-1][1]:
            out[-1][1] = max(out[-1][1], e)
        else:
            out.append([s, e])
    return out


def overlap_with(merged_list, s, e):
    return sum(max(0, min(e, b) - max(s, a)) for a, b in merged_list)


kGapNs = 3000  # idle stretches listed per step: longer than 3 us


def steps_of(rows, marker, comm):
    starts = [r[0] for r in rows if marker.search(r[4])]
    steps, i = [], 0
    for a, b in zip(starts, starts[1:]):
        while i < len(rows) and rows[i][0] < a:
            i += 1
        j = i
        while j < len(rows) and rows[j][0] < b:
            j += 1
        ks = rows[i:j]
        clip = [(max(a, s), min(b, e)) for s, e, *_ in ks if min(b, e) > max(a, s)]
        comp = [(max(a, s), min(b, e)) for s, e, _, _, n in ks if not comm.search(n) and min(b, e) > max(a, s)]
        comms = [(max(a, s), min(b, e)) for s, e, _, _, n in ks if comm.search(n) and min(b, e) > max(a, s)]
        comp_m = merged(comp)
        comm_alone = sum((e - s) - overlap_with(comp_m, s, e) for s, e in merged(comms))
        per_name = {}
        for s, e, _, _, n in ks:
            per_name[n] = per_name.get(n, 0) + (e - s)
        gaps, busy_until, before = [], a, ""
        for s, e, _, _, n in ks:  # sorted by start
            if s - busy_until > kGapNs:
                gaps.append((s - busy_until, busy_until - a, before, n))
            if e > busy_until:
                busy_until, before = e, n
        steps.append({
            "start": a,
            "kind": "data-parallel" if comms else "single",
            "step_ms": (b - a) / 1e6,
            "compute_sum_ms": sum(e - s for s, e, _, _, n in ks if not comm.search(n)) / 1e6,
            "compute_busy_ms": union_length(comp) / 1e6,
            "comm_ms": union_length(comms) / 1e6,
            "comm_alone_ms": comm_alone / 1e6,
            "idle_ms": ((b - a) - union_length(clip)) / 1e6,
            "kernels": len(ks),
            "per_name_ns": per_name,
            "comm_kernels": [(s - a, e - a, overlap_with(comp_m, s, e), n) for s, e, _, _, n in ks if comm.search(n)],
            "gaps": sorted(gaps, reverse=True),
        })
    return steps


def steady(steps):
    if not steps:
        return []
    q1 = sorted(s["step_ms"] for s in steps)[len(steps) // 4]
    return [s for s in steps if s["step_ms"] <= 1.10 * q1]


def short(name, width=90):
    name = re.sub(r"\s+", " ", name)
    return name if len(name) <= width else name[: width - 3] + "..."


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("dir")
    ap.add_argument("--marker", default=r"softmax_xent_rows_kernel")
    ap.add_argument("--comm", default=r"nccl")
    ap.add_argument("--json")
    args = ap.parse_args()
    marker, comm = re.compile(args.marker), re.compile(args.comm, re.I)
    summary, dp_by_pid = {}, {}
    fields = ("step_ms", "compute_sum_ms", "compute_busy_ms", "comm_ms", "comm_alone_ms", "idle_ms", "kernels")
    for path in sorted(glob.glob(os.path.join(args.dir, "kernels-*.csv"))):
        pid, rows, extras = load(path)
        if not rows:
            continue
        devices = sorted({r[2] for r in rows})
        steps = steps_of(rows, marker, comm)
        # A step that copies from another GPU (the copy-engine averager, whose mean may run inside
        # the update: no communication kernel at all) is a data-parallel one too.
        peer_copies = [s for s, _, _, _, n in extras if n.startswith("[memcpy") and " from " in n]
        for st in steps:
            i = bisect.bisect_left(peer_copies, st["start"])
            if i < len(peer_copies) and peer_copies[i] < st["start"] + st["step_ms"] * 1e6:
                st["kind"] = "data-parallel"
        print(f"\n== pid {pid}, device(s) {devices}: {len(rows)} kernels, {len(steps)} steps")
        kinds = {}
        for kind in ("single", "data-parallel"):
            ks = steady([s for s in steps if s["kind"] == kind])
            if not ks:
                continue
            med = {f: statistics.median(s[f] for s in ks) for f in fields}
            kinds[kind] = (ks, med)
            print(f"{kind:>14}: {len(ks)} steady steps  " + "  ".join(f"{f} {med[f]:.3f}" for f in fields))
            mid = sorted(ks, key=lambda s: s["step_ms"])[len(ks) // 2]
            print(f"{'':>14}  its median step's longest idle gaps (us at ms from the marker, between):")
            for g, at, before, after in mid["gaps"][:5]:
                print(f"{'':>16}{g / 1e3:7.1f} us at {at / 1e6:7.3f} ms  {short(before, 45)} | {short(after, 45)}")
            print_extras(extras, sorted(ks, key=lambda s: s["start"]), mid)
        summary[pid] = {k: v[1] for k, v in kinds.items()}
        if "data-parallel" in kinds:
            dp_by_pid[pid] = kinds["data-parallel"][0]
        if "single" in kinds and "data-parallel" in kinds:
            one, dp = kinds["single"], kinds["data-parallel"]
            d = {f: dp[1][f] - one[1][f] for f in fields}
            print("  data-parallel - single: " + "  ".join(f"{f} {d[f]:+.3f}" for f in fields))
            names = set()
            for s in one[0] + dp[0]:
                names.update(s["per_name_ns"])
            grown = []
            for n in names:
                if comm.search(n):
                    continue
                a = statistics.median(s["per_name_ns"].get(n, 0) for s in one[0])
                b = statistics.median(s["per_name_ns"].get(n, 0) for s in dp[0])
                grown.append(((b - a) / 1e6, a / 1e6, b / 1e6, n))
            grown.sort(reverse=True)
            print("  compute kernels whose time per step grew most (ms: growth, single, data-parallel):")
            for g, a, b, n in grown[:12]:
                print(f"    {g:+.3f}  {a:.3f} -> {b:.3f}  {short(n)}")
            print(f"  summed growth of all compute kernels: {sum(g[0] for g in grown):+.3f} ms")
            mid = sorted(dp[0], key=lambda s: s["step_ms"])[len(dp[0]) // 2]
            print(f"  the median data-parallel step ({mid['step_ms']:.3f} ms): communication kernels"
                  " (start, end from the marker, ms; compute beside them):")
            for s, e, ov, n in mid["comm_kernels"]:
                dur = e - s
                print(f"    {s / 1e6:8.3f} {e / 1e6:8.3f}  {dur / 1e6:6.3f} ms, compute beside it "
                      f"{100.0 * ov / dur if dur else 0:5.1f}%  {short(n, 60)}")
            summary[pid]["grown_top"] = [{"ms": g, "name": n} for g, _, _, n in grown[:12]]
    if len(dp_by_pid) == 2:
        summary["rank_kernels"] = rank_kernels(dp_by_pid, comm)
    skew = rank_skew(args.dir, comm)
    if skew:
        summary["rank_skew"] = skew
    if args.json:
        with open(args.json, "w") as f:
            json.dump(summary, f, indent=1)


def rank_kernels(dp_by_pid, comm):
    """The two ranks' steady data-parallel steps side by side, kernel by kernel (median time per
    step): which compute kernels one rank runs longer than the other, and which run on one rank only
    (each rank picks its own algorithms when it times candidates at bind), so that the faster rank's
    wait at the end of backward can be traced to kernels."""
    (pa, a), (pb, b) = sorted(dp_by_pid.items())
    names = set()
    for s in a + b:
        names.update(n for n in s["per_name_ns"] if not comm.search(n))
    rows = []
    for n in names:
        ta = statistics.median(s["per_name_ns"].get(n, 0) for s in a) / 1e6
        tb = statistics.median(s["per_name_ns"].get(n, 0) for s in b) / 1e6
        rows.append((ta - tb, ta, tb, n))
    only = [r for r in rows if (r[1] == 0) != (r[2] == 0)]
    rows.sort(key=lambda r: -abs(r[0]))
    total = sum(r[0] for r in rows)
    print(f"\n== compute kernels per data-parallel step, pid {pa} against pid {pb} (ms: {pa} - {pb}, {pa}, {pb});"
          f" summed difference {total:+.3f} ms")
    for d, ta, tb, n in rows[:12]:
        print(f"    {d:+.3f}  {ta:.3f}  {tb:.3f}  {short(n)}")
    print(f"  kernels on one rank only: {len(only)}")
    for d, ta, tb, n in sorted(only, key=lambda r: -abs(r[0]))[:12]:
        print(f"    {d:+.3f}  {ta:.3f}  {tb:.3f}  {short(n)}")
    return {"pids": [pa, pb], "summed_diff_ms": total, "one_rank_only": len(only),
            "top": [{"ms": d, "name": n} for d, _, _, n in rows[:12]]}


def rank_skew(trace_dir, comm):
    """Two processes' communication kernels paired in order (the k-th all-reduce of one with the
    k-th of the other: the same collective). A collective ends together on both ranks, so the
    median end difference says whether the two clocks agree; the start difference says which rank
    reached each all-reduce first and how long the other kept it waiting."""
    ranks = []
    for path in sorted(glob.glob(os.path.join(trace_dir, "kernels-*.csv"))):
        pid, rows, _ = load(path)
        kernels = [(s, e) for s, e, _, _, n in rows if comm.search(n)]
        if kernels:
            ranks.append((pid, kernels))
    if len(ranks) != 2:
        return None
    (pa, a), (pb, b) = ranks
    if len(a) != len(b):
        print(f"\nrank skew: pids {pa} and {pb} ran {len(a)} and {len(b)} communication kernels: not paired")
        return None
    end_diff = statistics.median((ea - eb) / 1e6 for (_, ea), (_, eb) in zip(a, b))
    start_diff = [(sa - sb) / 1e6 for (sa, _), (sb, _) in zip(a, b)]
    later_a = sum(1 for d in start_diff if d > 0)
    print(f"\n== rank skew, pids {pa} and {pb}: {len(a)} paired communication kernels")
    print(f"  end difference (clock agreement): median {end_diff:+.4f} ms")
    print(f"  start difference ({pa} - {pb}): median {statistics.median(start_diff):+.4f} ms, "
          f"mean |.| {statistics.mean(abs(d) for d in start_diff):.4f} ms; {pa} started later in "
          f"{later_a} of {len(start_diff)}")
    return {"pids": [pa, pb], "paired": len(a), "end_diff_ms": end_diff,
            "start_diff_median_ms": statistics.median(start_diff),
            "start_diff_mean_abs_ms": statistics.mean(abs(d) for d in start_diff), "later_count_first_pid": later_a}


if __name__ == "__main__":
    main()
