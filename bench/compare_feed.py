#!/usr/bin/env python3
"""Training fed from JPEG files against training on the fixed synthetic batch, one GPU.

The files: `accelbench data make-imagefolder` writes the first --images Fashion-MNIST training
images as --size px JPEGs into a temporary folder outside --out (removed at the end; the logs
never hold it), or --folder names an existing image folder. Then `accelbench run train` of
--model at --precision and --batch (CUDA graphs on, NHWC): once on dataset=synthetic and on
dataset=folder:DIR with the host pipeline (--threads worker threads decode and augment into the
pinned ring, the copy stream brings each batch while the step before runs), in one accelbench
run; then on the folder with decoder=nvjpeg. Printed per line: images/s, the ratio to synthetic,
the feed stall share (the share of the timed window the training thread waited for the workers;
for nvJPEG the time in the decoder's call) and the host CPU ms per image.
Target (the issue's): within 3% of synthetic where the pipeline keeps up (stall share near 0).
nvJPEG decodes one batch ahead on a stream of its own, beside the step.
  usage: compare_feed.py --accelbench build/cuda/src/cli/accelbench --out DIR [--threads 16]
         [--batch 256] [--model resnet50] [--precision bf16] [--folder DIR] [--images 4096]
"""
import argparse
import os
import shutil
import subprocess
import tempfile

from compare_common import accelbench

WITHIN = 0.03


def make_folder(a):
    if a.folder:
        return a.folder, None
    scratch = tempfile.mkdtemp(prefix="ab-feed-")
    folder = os.path.join(scratch, f"fmnist{a.size}")
    subprocess.run([a.accelbench, "data", "make-imagefolder", "fashion-mnist:train", folder, "--size", str(a.size),
                    "--limit", str(a.images)], check=True, stdout=subprocess.DEVNULL)
    return folder, scratch


def records_of(a, args, out):
    """The run's records, also where a point failed or skipped (accelbench then exits non-zero)."""
    got = []
    try:
        accelbench(a.accelbench, args, out, on_record=got.append)
    except SystemExit as e:
        print(f"accelbench exited non-zero: {str(e)[-800:]}", flush=True)
    return got


def train_args(a, datasets, *more):
    return ["train", "--axis", f"model={a.model}", "--axis", f"batch={a.batch}", "--axis", f"precision={a.precision}",
            "--axis", "layout=nhwc", "--axis", f"image_size={a.crop}", "--axis", "graph=on",
            "--axis", f"dataset={','.join(datasets)}", "--option", f"data_threads={a.threads}", *more]


def line(name, r, synthetic_rate):
    if r is None:
        return f"{name:<22} no record"
    if r["status"] != "ok":
        return f"{name:<22} {r['status']}: {r.get('reason', '')}"
    rate = r["rates"]["samples_per_s"]
    f = r["metrics"].get("feed")
    ratio = rate / synthetic_rate if synthetic_rate else float("nan")
    if f is None:
        return f"{name:<22} {rate:>9.0f} images/s {'':>8} ({r['time']['median_s'] * 1e3:.2f} ms/step)"
    return (f"{name:<22} {rate:>9.0f} images/s {ratio:>7.3f}x  stall {100 * f['feed_stall_share']:5.1f}%  "
            f"{f['cpu_ms_per_image']:.3f} ms CPU/image ({f['process_cpu_ms_per_image']:.3f} process), "
            f"{f['threads']} thread(s), {f.get('nvjpeg_engine', f['decoder'])}")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--accelbench", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--folder", default="", help="an image folder (default: one made from Fashion-MNIST)")
    ap.add_argument("--images", type=int, default=4096)
    ap.add_argument("--size", type=int, default=224, help="side of the JPEGs made from Fashion-MNIST")
    ap.add_argument("--crop", type=int, default=224, help="image_size the model trains at")
    ap.add_argument("--model", default="resnet50")
    ap.add_argument("--precision", default="bf16")
    ap.add_argument("--batch", type=int, default=256)
    ap.add_argument("--threads", type=int, default=16, help="host pipeline worker threads")
    ap.add_argument("--no-nvjpeg", action="store_true")
    a = ap.parse_args()
    folder, scratch = make_folder(a)
    try:
        fed = f"folder:{folder}"
        records = records_of(a, train_args(a, ["synthetic", fed]), os.path.join(a.out, "host"))
        by_dataset = {r["params"]["dataset"]: r for r in records}
        nvjpeg = None
        if not a.no_nvjpeg:
            runs = records_of(a, train_args(a, [fed], "--option", "decoder=nvjpeg"), os.path.join(a.out, "nvjpeg"))
            nvjpeg = runs[0] if runs else None
    finally:
        if scratch:
            shutil.rmtree(scratch, ignore_errors=True)
    synthetic = by_dataset.get("synthetic")
    synthetic_rate = synthetic["rates"]["samples_per_s"] if synthetic and synthetic["status"] == "ok" else 0.0
    print(f"train {a.model} {a.precision} b{a.batch}, {a.crop} px, CUDA graphs; {folder if a.folder else 'JPEGs made'}",
          flush=True)
    print(line("synthetic batch", synthetic, synthetic_rate))
    host = by_dataset.get(fed)
    print(line("host pipeline", host, synthetic_rate))
    if not a.no_nvjpeg:
        print(line("nvJPEG", nvjpeg, synthetic_rate))
    for name, r in (("host pipeline", host), ("nvJPEG", nvjpeg)):
        if r is None or r["status"] != "ok" or not synthetic_rate:
            continue
        ratio = r["rates"]["samples_per_s"] / synthetic_rate
        stall = r["metrics"]["feed"]["feed_stall_share"]
        kept_up = "kept up" if stall < 0.01 else f"the training thread waited {100 * stall:.1f}% of the window"
        met = "met" if ratio >= 1 - WITHIN else "NOT met"
        print(f"{name}: {ratio:.3f}x synthetic ({kept_up}); target within {100 * WITHIN:.0f}%: {met}", flush=True)


if __name__ == "__main__":
    main()
