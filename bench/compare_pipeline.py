#!/usr/bin/env python3
"""accelbench's host input pipeline side by side with PyTorch's DataLoader on the same JPEG files.

The files: `accelbench data make-imagefolder` writes the first --images Fashion-MNIST training
images as --size px JPEGs (or --folder names an existing image folder). accelbench: the `pipeline`
workload on that folder at each thread count (records from the run's points.jsonl). PyTorch:
torchvision's ImageFolder (PIL decode) with RandomResizedCrop(--crop), RandomHorizontalFlip,
ToTensor, Normalize (ImageNet's mean and std) and a cast to bfloat16, in a DataLoader of the same
batch with num_workers = threads; images/s = images over the seconds of --batches batches after
--warmup batches. Per core = images/s / threads (both sides keep every worker busy: the consumer
only drains). The table gives both and their ratio. torchvision's crop of a PIL image antialiases
when it shrinks; accelbench's is plain bilinear (docs/DATA.md), which is less work.
  usage: compare_pipeline.py --accelbench build/cuda/src/cli/accelbench --out DIR [--threads 1,2,4,8,16]
"""
import argparse
import os
import subprocess
import time

from compare_common import accelbench


def torch_images_per_s(folder, threads, batch, crop, batches, warmup):
    import torch
    import torchvision.transforms as T
    from torchvision.datasets import ImageFolder

    transform = T.Compose([T.RandomResizedCrop(crop), T.RandomHorizontalFlip(), T.ToTensor(),
                           T.Normalize([0.485, 0.456, 0.406], [0.229, 0.224, 0.225]),
                           T.ConvertImageDtype(torch.bfloat16)])
    loader = torch.utils.data.DataLoader(ImageFolder(folder, transform=transform), batch_size=batch, shuffle=True,
                                         num_workers=threads, drop_last=True, persistent_workers=True,
                                         prefetch_factor=4)
    done, start, images = 0, None, 0
    while True:
        for x, _ in loader:
            done += 1
            if done == warmup:
                start = time.perf_counter()
            elif done > warmup:
                images += x.shape[0]
            if done == warmup + batches:
                return images / (time.perf_counter() - start)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--accelbench", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--folder", default="", help="an image folder (default: one made from Fashion-MNIST)")
    ap.add_argument("--images", type=int, default=4096)
    ap.add_argument("--size", type=int, default=224, help="side of the JPEGs made from Fashion-MNIST")
    ap.add_argument("--crop", type=int, default=224)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--threads", default="1,2,4,8")
    ap.add_argument("--batches", type=int, default=40)
    ap.add_argument("--warmup", type=int, default=8)
    a = ap.parse_args()
    folder = a.folder or os.path.join(a.out, f"fmnist{a.size}")
    if not a.folder and not os.path.isdir(folder):
        subprocess.run([a.accelbench, "data", "make-imagefolder", "fashion-mnist:train", folder, "--size", str(a.size),
                        "--limit", str(a.images)], check=True)
    records = accelbench(a.accelbench, ["pipeline", "--option", f"folder={folder}", "--option", f"batch={a.batch}",
                                        "--axis", f"threads={a.threads}", "--axis", f"image_px={a.crop}"],
                         os.path.join(a.out, "accelbench"))
    ours = {r["params"]["threads"]: r for r in records if r["status"] == "ok"}
    print(f"{'threads':>7} {'accelbench img/s':>17} {'per core':>9} {'cpu ms/img':>10} {'torch img/s':>12} "
          f"{'per core':>9} {'ratio':>6}", flush=True)
    for t in (int(x) for x in a.threads.split(",")):
        theirs = torch_images_per_s(folder, t, a.batch, a.crop, a.batches, a.warmup)
        r = ours.get(t)
        mine = r["rates"]["samples_per_s"] if r else float("nan")
        cpu_ms = r["metrics"]["cpu_ms_per_image"] if r else float("nan")
        print(f"{t:>7} {mine:>17.0f} {mine / t:>9.0f} {cpu_ms:>10.3f} {theirs:>12.0f} {theirs / t:>9.0f} "
              f"{mine / theirs:>6.2f}", flush=True)


if __name__ == "__main__":
    main()
