#!/usr/bin/env python3
"""accelbench's input pipeline side by side with PyTorch's DataLoader on the same JPEG files.

The files: `accelbench data make-imagefolder` writes the first --images Fashion-MNIST training
images as --size px JPEGs (ACCELBENCH_FASHION_MNIST names the IDX folder where Debian's package is
not installed), or --folder names an existing image folder. accelbench: the `pipeline` workload on
that folder at each thread count with decoder=cpu, and once with decoder=nvjpeg (the GPU decodes
and augments; one host thread feeds it) at --nvjpeg-batch. PyTorch: a DataLoader of the same batch
with num_workers = threads over the same files with the same decode and transforms -
RandomResizedCrop(--crop), RandomHorizontalFlip, ToTensor, Normalize (ImageNet's mean and std),
a cast to bfloat16 - through torchvision where it imports, else PIL + numpy in a Dataset of our own
(the output says which); images/s = images over the seconds of --batches batches after --warmup
batches. Per core = images/s / threads (both keep every worker busy: the consumer only drains).
Targets (the issue's): accelbench at least 1.5x PyTorch per core; nvJPEG at least 7,200 images/s.
torchvision's crop of a PIL image antialiases when it shrinks; accelbench's is plain bilinear
(docs/DATA.md), which is less work.
  usage: compare_pipeline.py --accelbench build/cuda/src/cli/accelbench --out DIR [--threads 1,2,4,8,16]
         [--nvjpeg-batch 256] [--folder DIR]
"""
import argparse
import math
import os
import random
import subprocess
import time

from compare_common import accelbench

MEAN, STD = [0.485, 0.456, 0.406], [0.229, 0.224, 0.225]
PER_CORE_TARGET, NVJPEG_TARGET = 1.5, 7200.0


def torchvision_dataset(folder, crop):
    import torch
    import torchvision.transforms as T
    from torchvision.datasets import ImageFolder

    transform = T.Compose([T.RandomResizedCrop(crop), T.RandomHorizontalFlip(), T.ToTensor(), T.Normalize(MEAN, STD),
                           T.ConvertImageDtype(torch.bfloat16)])
    return ImageFolder(folder, transform=transform)


class PilDataset:
    """The same transforms without torchvision: PIL decodes, torchvision's RandomResizedCrop box
    rule (ten tries, then the centre at a clamped ratio) picks the crop, PIL resizes it bilinearly,
    numpy flips and normalises, torch holds the bfloat16 CHW tensor."""

    def __init__(self, folder, crop):
        import numpy as np
        self.np, self.crop = np, crop
        self.mean = np.array(MEAN, dtype=np.float32).reshape(3, 1, 1)
        self.std = np.array(STD, dtype=np.float32).reshape(3, 1, 1)
        classes = sorted(d for d in os.listdir(folder) if os.path.isdir(os.path.join(folder, d)))
        self.files = [(os.path.join(folder, c, f), i) for i, c in enumerate(classes)
                      for f in sorted(os.listdir(os.path.join(folder, c)))
                      if f.lower().endswith((".jpg", ".jpeg", ".png"))]

    def __len__(self):
        return len(self.files)

    @staticmethod
    def box(width, height, scale=(0.08, 1.0), ratio=(3 / 4, 4 / 3)):
        area = width * height
        for _ in range(10):
            target = area * random.uniform(*scale)
            r = math.exp(random.uniform(math.log(ratio[0]), math.log(ratio[1])))
            w, h = int(round(math.sqrt(target * r))), int(round(math.sqrt(target / r)))
            if 0 < w <= width and 0 < h <= height:
                x, y = random.randint(0, width - w), random.randint(0, height - h)
                return x, y, w, h
        r_in = width / height
        w, h = (width, int(round(width / ratio[0]))) if r_in < ratio[0] else \
            (int(round(height * ratio[1])), height) if r_in > ratio[1] else (width, height)
        return (width - w) // 2, (height - h) // 2, w, h

    def __getitem__(self, i):
        import torch
        from PIL import Image
        path, label = self.files[i]
        with Image.open(path) as im:
            im = im.convert("RGB")
            x, y, w, h = self.box(*im.size)
            im = im.crop((x, y, x + w, y + h)).resize((self.crop, self.crop), Image.BILINEAR)
            a = self.np.asarray(im, dtype=self.np.float32).transpose(2, 0, 1) / 255.0
        if random.random() < 0.5:
            a = a[:, :, ::-1]
        a = (a - self.mean) / self.std
        return torch.from_numpy(self.np.ascontiguousarray(a)).to(torch.bfloat16), label


def torch_dataset(folder, crop):
    """The dataset and which decode + transforms it uses; (None, why) where neither works."""
    try:
        return torchvision_dataset(folder, crop), "torchvision (ImageFolder, PIL decode, torchvision.transforms)"
    except ImportError:
        pass
    try:
        import numpy  # noqa: F401
        import PIL  # noqa: F401
        return PilDataset(folder, crop), "PIL + numpy transforms in a Dataset (torchvision is not installed)"
    except ImportError:
        return None, "neither torchvision nor PIL imports: torch alone decodes no JPEG, so no PyTorch side"


def torch_images_per_s(dataset, threads, batch, batches, warmup):
    import torch
    loader = torch.utils.data.DataLoader(dataset, batch_size=batch, shuffle=True, num_workers=threads, drop_last=True,
                                         persistent_workers=True, prefetch_factor=4)
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


def make_folder(a):
    folder = a.folder or os.path.join(a.out, f"fmnist{a.size}")
    if not a.folder and not os.path.isdir(folder):
        subprocess.run([a.accelbench, "data", "make-imagefolder", "fashion-mnist:train", folder, "--size", str(a.size),
                        "--limit", str(a.images)], check=True)
    return folder


def nvjpeg_line(a, folder):
    records = accelbench(a.accelbench, ["pipeline", "--option", f"folder={folder}", "--option", f"batch={a.nvjpeg_batch}",
                                        "--axis", "decoder=nvjpeg", "--axis", "threads=1", "--axis", f"image_px={a.crop}"],
                         os.path.join(a.out, "accelbench-nvjpeg"))
    for r in records:
        if r["status"] != "ok":
            return f"nvJPEG: {r['status']}: {r.get('reason', '')}"
        rate, m = r["rates"]["samples_per_s"], r["metrics"]
        met = "met" if rate >= NVJPEG_TARGET else "NOT met"
        return (f"nvJPEG ({m.get('nvjpeg_engine', '?')} engine, batch {a.nvjpeg_batch}): {rate:.0f} images/s, "
                f"{m['process_cpu_ms_per_image']:.3f} ms of process CPU per image; target >= {NVJPEG_TARGET:.0f}: {met}")
    return "nvJPEG: no record"


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--accelbench", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--folder", default="", help="an image folder (default: one made from Fashion-MNIST)")
    ap.add_argument("--images", type=int, default=4096)
    ap.add_argument("--size", type=int, default=224, help="side of the JPEGs made from Fashion-MNIST")
    ap.add_argument("--crop", type=int, default=224)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--nvjpeg-batch", type=int, default=256)
    ap.add_argument("--threads", default="", help="worker counts (default 1, 2, 4, ... and the core count)")
    ap.add_argument("--batches", type=int, default=40)
    ap.add_argument("--warmup", type=int, default=8)
    a = ap.parse_args()
    if not a.threads:
        cores = os.cpu_count() or 1
        a.threads = ",".join(str(t) for t in sorted({2 ** k for k in range(cores.bit_length()) if 2 ** k < cores} | {cores}))
    folder = make_folder(a)
    records = accelbench(a.accelbench, ["pipeline", "--option", f"folder={folder}", "--option", f"batch={a.batch}",
                                        "--axis", "decoder=cpu", "--axis", f"threads={a.threads}",
                                        "--axis", f"image_px={a.crop}"],
                         os.path.join(a.out, "accelbench"))
    ours = {r["params"]["threads"]: r for r in records if r["status"] == "ok"}
    dataset, how = torch_dataset(folder, a.crop)
    print(f"PyTorch side: {how}", flush=True)
    print(f"{'threads':>7} {'accelbench img/s':>17} {'per core':>9} {'cpu ms/img':>10} {'torch img/s':>12} "
          f"{'per core':>9} {'ratio':>6}", flush=True)
    ratios = []
    for t in (int(x) for x in a.threads.split(",")):
        theirs = torch_images_per_s(dataset, t, a.batch, a.batches, a.warmup) if dataset is not None else float("nan")
        r = ours.get(t)
        mine = r["rates"]["samples_per_s"] if r else float("nan")
        cpu_ms = r["metrics"]["cpu_ms_per_image"] if r else float("nan")
        ratio = mine / theirs if theirs > 0 else float("nan")
        ratios.append(ratio)
        print(f"{t:>7} {mine:>17.0f} {mine / t:>9.0f} {cpu_ms:>10.3f} {theirs:>12.0f} {theirs / t:>9.0f} "
              f"{ratio:>6.2f}", flush=True)
    known = [x for x in ratios if not math.isnan(x)]
    if known:
        met = "met" if min(known) >= PER_CORE_TARGET else "NOT met"
        print(f"per core, accelbench / PyTorch: {min(known):.2f}x to {max(known):.2f}x; target >= {PER_CORE_TARGET}x at "
              f"every thread count: {met}", flush=True)
    print(nvjpeg_line(a, folder), flush=True)


if __name__ == "__main__":
    main()
