#!/usr/bin/env python3
"""The hardware counters' device checks (docs/METHODOLOGY.md, "Hardware counters"):
  (a) a STREAM copy of a large buffer with --counters memory: the DRAM bytes read and written
      within 2% of the bytes it moves (counts.bytes: one read and one write of the array);
  (b) a large GEMM and a convolution (a ResNet 3x3 layer at batch 64, bf16, or the point
      --conv-axis names): accelbench's counters (bytes, instructions) against Nsight Compute's
      (`ncu --metrics <same names>`, profiling only the timed samples' NVTX range) for the kernel
      the same binary's timed samples ran with counters off, within 3% (the duration is shown, not
      held: ncu runs each kernel on an idle GPU); the algorithm search may pick another of two
      close kernels run to run, so the counter run repeats until its search chose what the run
      under ncu chose;
  (c) the timed figures of a run with --counters equal those of a run without, within noise.
Prints one table; exits 1 when a check fails, 2 when one could not run.
  usage: check_counters.py --accelbench build/cuda/src/cli/accelbench --out DIR [--ncu ncu]
                           [--conv-axis shape=NAME ...] [--checks stream,gemm,conv,timing]
"""
import argparse
import csv
import io
import json
import os
import re
import shutil
import signal
import statistics
import subprocess
import tempfile
import time

MEMORY = ["dram__bytes_read.sum", "dram__bytes_write.sum", "lts__t_bytes.sum", "gpu__time_duration.sum"]
COMPUTE = ["sm__throughput.avg.pct_of_peak_sustained_elapsed", "sm__warps_active.avg.pct_of_peak_sustained_active",
           "smsp__inst_executed.sum"]
# Compared with ncu: the counts (bytes, instructions) and the duration; the percentages ncu and the
# profiler both average the same way, but a short kernel's % moves more than 3% run to run.
COMPARED = ["dram__bytes_read.sum", "dram__bytes_write.sum", "lts__t_bytes.sum", "smsp__inst_executed.sum"]
GEMM = ["gemm", "--axis", "precision=bf16", "--axis", "m,n,k=8192"]
# A ResNet 3x3 layer at batch 64: 103 MB in and out, twice the H200's L2, so DRAM bytes are the
# operands' and not what a previous kernel left in L2 (a batch-32 14x14 layer fits in L2 and its
# DRAM bytes vary with whatever ran before).
CONV = ["shape=custom", "n,c,h,w,k,r,s,pad,stride=64,256,56,56,256,3,3,1,1", "precision=bf16", "pass=fwd"]
STREAM_COPY = ["stream", "--axis", "op=copy", "--axis", "array_bytes=4294967296"]


def records_of(out):
    runs = os.path.join(out, "runs")
    run_dir = [d for d in sorted(os.listdir(runs)) if os.path.isdir(os.path.join(runs, d))][-1]
    with open(os.path.join(runs, run_dir, "points.jsonl")) as f:
        return [json.loads(line) for line in f if line.strip()]


def run(ab, args, work, counters=None, extra=()):
    out = tempfile.mkdtemp(prefix="run-", dir=work)
    cmd = [ab, "run", *args, "--out", out, "-q", *extra]
    if counters:
        cmd += ["--counters", counters]
    t0 = time.monotonic()
    subprocess.run(cmd, check=True)
    print(f"({' '.join(args[:1])}{' --counters ' + counters if counters else ''}: {time.monotonic() - t0:.0f} s)", flush=True)
    return records_of(out)


def counters_of(rec):
    c = rec.get("metrics", {}).get("counters", {})
    if c.get("status") != "ok":
        raise RuntimeError(f"{rec['workload']}: counters {c.get('status')}: {c.get('reason')}")
    return c


def ncu_metrics(ncu, ab, args, work, names, launches):
    """ncu's values of the kernel the point's timed samples ran, median per metric over its launches, from ncu's CSV in base units, with the record of
    that run (its `algorithm`)."""
    out = tempfile.mkdtemp(prefix="ncu-", dir=work)
    # Caches as accelbench's counter pass of a micro point has them (flushed before each range, as
    # ncu's default --cache-control all); clocks as it leaves them (ncu would lock them at base,
    # which moves the duration).
    # Only the kernels of the timed samples (the NVTX range the CUDA timer opens): profiling the
    # algorithm search's candidates too would slow them and sway its choice.
    for nvtx in (["--nvtx", "--nvtx-include", "accelbench.timed/"], []):  # a build without the range: every kernel
        cmd = [ncu, "--target-processes", "all", *nvtx, "--metrics", ",".join(names), "--csv", "--print-units", "base",
               "--cache-control", "all", "--clock-control", "none", "--launch-count", str(launches if nvtx else 300), ab, "run",
               *args, "--out", out, "-q", "--min-time", "0", "--warmup", "0"]
        # Not check=True: under ncu's serialised replays the point may stop at its timeout; the
        # kernels profiled before it are what is compared. A run past NCU_TIMEOUT_S (--ncu-timeout) is cut, and
        # what ncu had printed (its ==PROF== progress on stderr) is kept beside the CSVs.
        t0 = time.monotonic()
        print(f"ncu {' '.join(nvtx) or 'without NVTX'}: {' '.join(args)}", flush=True)
        # A session of its own, so that a timeout stops the profiled accelbench too, not ncu alone.
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
        try:
            text, _ = proc.communicate(timeout=NCU_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            stdout, stderr = proc.communicate()
            partial = os.path.join(work, os.path.basename(out) + ".timed-out.txt")
            with open(partial, "w") as f:
                f.write(stdout + "\n--- stderr ---\n" + stderr)
            last = [l for l in stderr.splitlines() if l.strip()][-3:]
            raise RuntimeError(f"ncu did not finish within {NCU_TIMEOUT_S} s (its output: {partial}; last: {last})")
        print(f"ncu took {time.monotonic() - t0:.0f} s", flush=True)
        with open(os.path.join(work, os.path.basename(out) + (".timed" if nvtx else ".all") + ".csv"), "w") as f:
            f.write(text)
        start = text.find('"ID"')
        if start >= 0:
            break
        print(f"note: ncu {' '.join(nvtx) or 'without NVTX'} profiled no kernel", flush=True)
        shutil.rmtree(os.path.join(out, "runs"), ignore_errors=True)
    if start < 0:
        raise RuntimeError("ncu printed no CSV table:\n" + text[-2000:])
    launches = {}
    for row in csv.DictReader(io.StringIO(text[start:])):
        try:
            v = float(row["Metric Value"].replace(",", ""))
        except ValueError:
            continue
        k = launches.setdefault(int(row["ID"]), {"name": row["Kernel Name"], "m": {}})
        k["m"][row["Metric Name"]] = v
    duration = lambda k: k["m"].get("gpu__time_duration.sum", 0)
    longest = max(duration(k) for k in launches.values())
    # The last long launch: the timed samples run after the algorithm search (and a point's kernel
    # may be preceded by short helpers: a fill, a reduction).
    timed = [launches[i] for i in sorted(launches) if duration(launches[i]) >= 0.25 * longest][-1]["name"]
    chosen = [k["m"] for k in launches.values() if k["name"] == timed]
    medians = {m: statistics.median(x[m] for x in chosen if m in x) for m in names if any(m in x for x in chosen)}
    return timed, len(chosen), medians, records_of(out)


def pct(a, b):
    return 100.0 * (a - b) / b if b else float("inf")


def check_stream(ab, work, rows):
    rec = run(ab, STREAM_COPY, work, "memory")[0]
    c = counters_of(rec)
    moved = rec["counts"]["bytes"]
    d = pct(c["dram_bytes"], moved)
    rows.append(("(a) stream copy 4 GiB: DRAM bytes vs bytes moved", f"{c['dram_bytes']:.4g}", f"{moved:.4g}",
                 f"{d:+.2f}%", abs(d) <= 2.0))


# The algorithm search times close candidates, so two runs of one point may pick different kernels
# (cuBLASLt's coopA and coopB tiles of an 8192^3 GEMM are within 3%): the counter run is repeated
# until it chose what the run under ncu chose.
SEARCH_ATTEMPTS = 6
NCU_TIMEOUT_S = 240  # one ncu run of a point (--ncu-timeout)


def algorithm_key(rec):
    """The chosen algorithm without the search's own figures (ranks, counts, times in brackets)."""
    text = (rec or {}).get("metrics", {}).get("algorithm")
    return None if text is None else re.sub(r"\s*\([^)]*\)", "", text)


def check_against_ncu(ab, ncu, work, label, args, rows, launches=50):
    try:
        kernel, n, theirs, ncu_records = ncu_metrics(ncu, ab, args, work, MEMORY + COMPUTE, launches)
    except RuntimeError as e:
        rows.append((f"(b) {label}: {e}", "-", "-", "not compared", False))
        return
    want = algorithm_key(ncu_records[0] if ncu_records else None)
    for _ in range(SEARCH_ATTEMPTS):
        rec = run(ab, args, work, "all")[0]
        if want is None or algorithm_key(rec) == want:
            break
    else:
        rows.append((f"(b) {label}: the search chose another algorithm than under ncu in {SEARCH_ATTEMPTS} runs "
                     f"(ncu's: {want})", str(algorithm_key(rec))[:14], str(want)[:14], "not comparable", False))
        return
    ours = counters_of(rec)["metrics"]
    for m in COMPARED + ["gpu__time_duration.sum"]:
        if m not in ours or m not in theirs:
            rows.append((f"(b) {label} {m}", str(ours.get(m)), str(theirs.get(m)), "missing", False))
            continue
        d = pct(ours[m], theirs[m])
        # The duration is no count: ncu runs each kernel alone between replays, at the clocks of
        # an idle GPU; the counter pass follows the timed samples at their (power-limited) clocks.
        timing = m == "gpu__time_duration.sum"
        rows.append((f"(b) {label} {m} (ncu: {kernel[:40]}, {n} launches)" + (" [shown, not held]" if timing else ""),
                     f"{ours[m]:.5g}", f"{theirs[m]:.5g}", f"{d:+.2f}%", timing or abs(d) <= 3.0))


def check_timing(ab, work, rows):
    for label, args in (("gemm bf16 8192^3", GEMM), ("stream copy 4 GiB", STREAM_COPY)):
        extra = ["--min-time", "2"]
        off = run(ab, args, work, None, extra)[0]["time"]
        on = run(ab, args, work, "all", extra)[0]["time"]
        noise = 100.0 * max(off["rel_spread"], on["rel_spread"])
        d = pct(on["median_s"], off["median_s"])
        rows.append((f"(c) {label}: median with --counters vs without", f"{on['median_s']:.6g} s",
                     f"{off['median_s']:.6g} s", f"{d:+.2f}% (noise {noise:.2f}%)", abs(d) <= max(1.0, 3 * noise)))


class Rows(list):
    """The table's rows, each printed as it comes: a run its caller's time limit kills keeps them."""

    def append(self, row):
        print(f"row: {row[0]} | {row[1]} | {row[2]} | {row[3]} | {'ok' if row[4] else 'FAIL'}", flush=True)
        super().append(row)


def main():
    global NCU_TIMEOUT_S
    ap = argparse.ArgumentParser()
    ap.add_argument("--accelbench", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--ncu", default=shutil.which("ncu") or "/usr/local/cuda/bin/ncu")
    ap.add_argument("--conv-axis", action="append", default=None,
                    help="an --axis of the conv point to compare (default: CONV, a 3x3 convolution whose operands outgrow L2)")
    ap.add_argument("--checks", default="stream,gemm,conv,timing", help="which of the checks to run")
    ap.add_argument("--ncu-timeout", type=int, default=NCU_TIMEOUT_S, help="seconds one ncu run may take")
    args = ap.parse_args()
    NCU_TIMEOUT_S = args.ncu_timeout
    args.conv_axis = args.conv_axis or CONV
    os.makedirs(args.out, exist_ok=True)
    work = tempfile.mkdtemp(prefix="ab-counters-", dir=args.out)
    rows = Rows()
    checks = set(args.checks.split(","))
    if "stream" in checks:
        check_stream(args.accelbench, work, rows)
    if "gemm" in checks:
        check_against_ncu(args.accelbench, args.ncu, work, "gemm bf16 8192^3", GEMM, rows)
    if "conv" in checks:
        conv = ["conv"] + [a for axis in args.conv_axis for a in ("--axis", axis)]
        # Fewer profiled launches: each replays with every allocation the kernel could write saved
        # and restored, and the conv engine holds a search workspace of up to 1 GiB (a suspect of
        # the conv run's slowness under ncu).
        check_against_ncu(args.accelbench, args.ncu, work, "conv " + " ".join(args.conv_axis), conv, rows, launches=8)
    if "timing" in checks:
        check_timing(args.accelbench, work, rows)
    if not rows:
        ap.error("--checks names none of stream, gemm, conv, timing")
    width = max(len(r[0]) for r in rows)
    lines = [f"{'check':<{width}}  {'accelbench':>14}  {'reference':>14}  {'difference':<28} verdict"]
    lines += [f"{r[0]:<{width}}  {r[1]:>14}  {r[2]:>14}  {r[3]:<28} {'ok' if r[4] else 'FAIL'}" for r in rows]
    text = "\n".join(lines)
    print(text)
    with open(os.path.join(args.out, "check_counters.txt"), "w") as f:
        f.write(text + "\n")
    return 0 if all(r[4] for r in rows) else 1


if __name__ == "__main__":
    raise SystemExit(main())
