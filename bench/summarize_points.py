#!/usr/bin/env python3
"""Prints chosen fields of every record an accelbench run wrote under OUT/runs/*/points.jsonl, one
line per point, with the reason of any point that is not ok: the device scripts' summaries of a
sweep, including figures the `accelbench results` table leaves out (metrics.*).

    python3 bench/summarize_points.py OUT params.precision params.fuse rates.samples_per_s metrics.model.ops
"""
import argparse
import glob
import json
import os


def field(record, path):
    value = record
    for key in path.split("."):
        if isinstance(value, list) and key.isdigit():  # telemetry.gpus.0.mean_power_w
            value = value[int(key)] if int(key) < len(value) else None
        else:
            value = value.get(key) if isinstance(value, dict) else None
    return value


def shown(value):
    return f"{value:.4g}" if isinstance(value, float) else str(value)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out", help="the folder given to `accelbench run --out`")
    ap.add_argument("fields", nargs="+", help="dotted paths into a record, e.g. time.median_s")
    args = ap.parse_args()
    files = sorted(glob.glob(os.path.join(args.out, "runs", "*", "points.jsonl")))
    if not files:
        raise SystemExit(f"no runs under {args.out}")
    for path in files:
        with open(path) as f:
            for line in f:
                r = json.loads(line)
                text = "  ".join(f"{name.split('.')[-1]}={shown(field(r, name))}" for name in args.fields)
                status = r.get("status")
                print(f"{r.get('workload')} {status}  {text}" + ("" if status == "ok" else f"  ({r.get('reason', '')[:200]})"))


if __name__ == "__main__":
    main()
