#!/usr/bin/env python3
"""Issue 3's device check: over a >= 10 s GEMM load, energy from the GPU's energy counter and from
integrated power agree within 5%; idle and loaded power reported.

Runs `accelbench run gemm` (bf16 8192^3, --min-time 10, --telemetry-trace), then recomputes the
window's energy independently from the raw trace: linear interpolation of the energy counter at
the window's ends, and the trapezoid of the power readings (instant and 1 s-average) over it.
Idle power comes from `accelbench monitor` before the load.
  usage: energy_check.py --accelbench build/cuda/src/cli/accelbench --out DIR
"""
import argparse
import json
import os
import subprocess
import tempfile


def interp(series, key, t):
    pts = [(s["t_s"], s[key]) for s in series if key in s]
    for (ta, va), (tb, vb) in zip(pts, pts[1:]):
        if ta <= t <= tb:
            return va + (vb - va) * (t - ta) / (tb - ta) if tb > ta else va
    raise ValueError(f"{key} readings do not cover t={t}")


def trapezoid(series, key, t0, t1):
    pts = [(s["t_s"], s[key]) for s in series if key in s]
    inside = [(t0, interp(series, key, t0))] + [p for p in pts if t0 < p[0] < t1] + [(t1, interp(series, key, t1))]
    return sum((tb - ta) * (va + vb) / 2 for (ta, va), (tb, vb) in zip(inside, inside[1:]))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--accelbench", required=True)
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    work = tempfile.mkdtemp(prefix="ab-energy-")
    idle = subprocess.run([args.accelbench, "monitor", "--interval", "500", "--duration", "3"],
                          capture_output=True, text=True).stdout
    subprocess.run([args.accelbench, "run", "gemm", "--axis", "precision=bf16", "--axis", "m,n,k=8192",
                    "--min-time", "10", "--telemetry-trace", "--out", work, "-q"], check=True)
    run_dir = [d for d in sorted(os.listdir(os.path.join(work, "runs"))) if os.path.isdir(os.path.join(work, "runs", d))][-1]
    rec = json.loads(open(os.path.join(work, "runs", run_dir, "points.jsonl")).readline())
    trace = json.load(open(os.path.join(work, "runs", run_dir, "telemetry.json")))
    t0, t1 = rec["time"]["window_start_s"], rec["time"]["window_end_s"]
    series = trace["gpus"][0]["samples"]
    counter = interp(series, "energy_j", t1) - interp(series, "energy_j", t0)
    lines = [f"window {t1 - t0:.2f} s, gemm bf16 8192^3 at {rec['rates']['tflops']:.1f} TFLOP/s",
             f"record: energy_j {rec['telemetry'].get('energy_j')} ({rec['telemetry'].get('energy_method')}), "
             f"mean_power_w {rec['telemetry'].get('mean_power_w')}, samples_per_j {rec['telemetry'].get('samples_per_j')}",
             f"trace: counter difference (linear ends) {counter:.1f} J"]
    for key in ("power_instant_w", "power_w"):
        if any(key in s for s in series):
            e = trapezoid(series, key, t0, t1)
            lines.append(f"trace: integrated {key} {e:.1f} J = {100 * (e - counter) / counter:+.2f}% vs counter "
                         f"(mean {e / (t1 - t0):.1f} W)")
    lines.append("idle (accelbench monitor, before the load):")
    lines += ["  " + l for l in idle.strip().splitlines()]
    text = "\n".join(lines)
    print(text)
    with open(os.path.join(args.out, "energy.txt"), "w") as f:
        f.write(text + "\n")
    with open(os.path.join(args.out, "energy-record.json"), "w") as f:
        json.dump({k: rec[k] for k in ("telemetry", "rates", "params")}, f, indent=1)


if __name__ == "__main__":
    main()
