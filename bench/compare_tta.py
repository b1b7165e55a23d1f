#!/usr/bin/env python3
"""Time to train on Fashion-MNIST: accelbench's `train` in its time-to-train mode side by side with
the same model and recipe in PyTorch, to the same target accuracy on the test split.

The model: fashion_resnet (models/resnet.h): a 3x3 stride-1 stem of 32 channels, no max pool, three
stages of two torchvision Bottleneck blocks (planes 16, 32, 64; expansion 4) at 28, 14 and 7 px,
global average pool, a 10-way linear layer; torchvision's initialisation (Kaiming normal, fan out,
for convolutions; batch norms 1 and 0). The recipe (accelbench's train options and defaults): SGD
momentum 0.9, weight decay 5e-4 on every parameter, peak rate 0.2 x batch / 256, linear warm-up
over `warmup_epochs`, cosine to 1% of the peak at `schedule_epochs`, held after it, the rate
piecewise constant over `lr_updates_per_epoch` segments an epoch (each at its midpoint's value);
each epoch a seeded permutation of the 60,000 training images (the remainder of a batch dropped),
each image padded by 2 black pixels a side, a random 28x28 window cut back, mirrored with
probability 1/2, normalised by Fashion-MNIST's mean and std; an evaluation on the 10,000 test
images after every epoch; stop at the first evaluation at or above the target.

PyTorch is given what is fastest for it: the whole data set on the GPU as tensors (the crop, flip
and normalisation on the GPU per batch), bf16 autocast, channels_last, torch.compile of the model,
the fused SGD where this PyTorch has it; compilation and a warm-up run before its clock starts
(then the weights, optimizer and batch-norm statistics are put back), as accelbench's init holds
its graph build, bind and capture. Both clocks run from the start of the first epoch to the end of
the evaluation that reaches the target (MLPerf's run_start to run_stop).

The IDX files are read with numpy from ACCELBENCH_FASHION_MNIST or /usr/share/datasets/fashion-mnist
(torchvision is not needed).
  usage: compare_tta.py --accelbench build/cuda/src/cli/accelbench --out DIR [--seeds 1,2,3] [--target 0.92]

--part gpt (compare_tta_gpt.py) does the same for a GPT on a text file to a target validation loss:
  compare_tta.py --part gpt --accelbench ... --out DIR [--model tiny_gpt2] [--target-loss 1.0] [--text FILE]
"""
import argparse
import gzip
import math
import os
import statistics
import time

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

import compare_tta_gpt
from compare_common import accelbench

MEAN, STD = 0.2860, 0.3530


def read_idx(path):
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rb") as f:
        data = f.read()
    if data[0] != 0 or data[1] != 0 or data[2] != 8:
        raise SystemExit(f"{path}: not an unsigned-byte IDX file")
    rank = data[3]
    dims = [int.from_bytes(data[4 + 4 * i:8 + 4 * i], "big") for i in range(rank)]
    return np.frombuffer(data, dtype=np.uint8, offset=4 + 4 * rank).reshape(dims)


def fashion_mnist(split):
    root = os.environ.get("ACCELBENCH_FASHION_MNIST") or "/usr/share/datasets/fashion-mnist"
    stem = "train" if split == "train" else "t10k"

    def find(kind):
        for ext in (".gz", ""):
            p = os.path.join(root, f"{stem}-{kind}-ubyte{ext}")
            if os.path.exists(p):
                return p
        raise SystemExit(f"no {stem}-{kind}-ubyte[.gz] in {root} (set ACCELBENCH_FASHION_MNIST)")

    return read_idx(find("images-idx3")), read_idx(find("labels-idx1"))


class Bottleneck(nn.Module):
    def __init__(self, cin, planes, stride):
        super().__init__()
        out = planes * 4
        self.conv1, self.bn1 = nn.Conv2d(cin, planes, 1, bias=False), nn.BatchNorm2d(planes)
        self.conv2, self.bn2 = nn.Conv2d(planes, planes, 3, stride, 1, bias=False), nn.BatchNorm2d(planes)
        self.conv3, self.bn3 = nn.Conv2d(planes, out, 1, bias=False), nn.BatchNorm2d(out)
        self.down = None
        if stride != 1 or cin != out:
            self.down = nn.Sequential(nn.Conv2d(cin, out, 1, stride, bias=False), nn.BatchNorm2d(out))

    def forward(self, x):
        y = F.relu(self.bn1(self.conv1(x)))
        y = F.relu(self.bn2(self.conv2(y)))
        y = self.bn3(self.conv3(y))
        return F.relu(y + (x if self.down is None else self.down(x)))


class FashionResNet(nn.Module):
    def __init__(self, blocks=(2, 2, 2), planes=(16, 32, 64), stem=32, classes=10):
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(1, stem, 3, 1, 1, bias=False), nn.BatchNorm2d(stem), nn.ReLU())
        layers, cin = [], stem
        for i, (n, p) in enumerate(zip(blocks, planes)):
            for b in range(n):
                layers.append(Bottleneck(cin, p, 2 if (i > 0 and b == 0) else 1))
                cin = p * 4
        self.layers = nn.Sequential(*layers)
        self.fc = nn.Linear(cin, classes)
        for m in self.modules():
            if isinstance(m, nn.Conv2d):
                nn.init.kaiming_normal_(m.weight, mode="fan_out", nonlinearity="relu")

    def forward(self, x):
        return self.fc(torch.flatten(F.adaptive_avg_pool2d(self.layers(self.stem(x)), 1), 1))


def scheduled_lr(peak, step, steps_per_epoch, a):
    """accelbench's zoo::scheduled_lr (train_to_target.cpp), step for step."""
    segment = math.floor(step * a.lr_updates_per_epoch / steps_per_epoch)
    epoch = (segment + 0.5) / a.lr_updates_per_epoch
    if epoch < a.warmup_epochs:
        return peak * epoch / a.warmup_epochs
    t = min(1.0, (epoch - a.warmup_epochs) / (a.schedule_epochs - a.warmup_epochs))
    return peak * (0.01 + 0.99 * 0.5 * (1 + math.cos(math.pi * t)))


def augment(images_u8, pad, gen):
    """Pad, random crop back to the size, random horizontal flip, normalise: [B, 1, H, W] float."""
    b, h, w = images_u8.shape
    padded = F.pad(images_u8, (pad, pad, pad, pad))
    dy = torch.randint(0, 2 * pad + 1, (b,), device=images_u8.device, generator=gen)
    dx = torch.randint(0, 2 * pad + 1, (b,), device=images_u8.device, generator=gen)
    flip = torch.rand(b, device=images_u8.device, generator=gen) < 0.5
    base_h = torch.arange(h, device=images_u8.device)
    base_w = torch.arange(w, device=images_u8.device)
    rows = dy[:, None] + base_h[None, :]
    cols = dx[:, None] + torch.where(flip[:, None], (w - 1 - base_w)[None, :], base_w[None, :])
    batch = torch.arange(b, device=images_u8.device)[:, None, None]
    crop = padded[batch, rows[:, :, None], cols[:, None, :]]
    return normalise(crop)


def normalise(images_u8):
    x = (images_u8.float() / 255.0 - MEAN) / STD
    return x[:, None].contiguous(memory_format=torch.channels_last)


def evaluate(model, test_x, test_y, batch=2000):
    model.eval()
    correct = 0
    with torch.no_grad(), torch.autocast("cuda", dtype=torch.bfloat16):
        for i in range(0, test_x.shape[0], batch):
            correct += (model(test_x[i:i + batch]).argmax(1) == test_y[i:i + batch]).sum()
    model.train()
    return correct.item() / test_x.shape[0]


def torch_time_to_train(a, seed):
    torch.manual_seed(seed)
    dev = "cuda"
    train_x, train_y = (torch.from_numpy(v.copy()).to(dev) for v in fashion_mnist("train"))
    test_x_u8, test_y = (torch.from_numpy(v.copy()).to(dev) for v in fashion_mnist("test"))
    test_x, train_y, test_y = normalise(test_x_u8), train_y.long(), test_y.long()
    model = FashionResNet().to(dev).to(memory_format=torch.channels_last)
    peak = a.lr if a.lr > 0 else 0.2 * a.batch / 256
    try:
        opt = torch.optim.SGD(model.parameters(), lr=peak, momentum=0.9, weight_decay=a.weight_decay, fused=True)
    except (TypeError, RuntimeError):
        opt = torch.optim.SGD(model.parameters(), lr=peak, momentum=0.9, weight_decay=a.weight_decay)
    compiled = torch.compile(model)
    steps_per_epoch = train_x.shape[0] // a.batch
    gen = torch.Generator(device=dev)
    gen.manual_seed(seed)

    def step(x, y, lr):
        for g in opt.param_groups:
            g["lr"] = lr
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = F.cross_entropy(compiled(x), y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        return loss

    # Init: compile (train and eval graphs) and warm up, then restore the initial state.
    state = {k: v.clone() for k, v in model.state_dict().items()}
    for _ in range(3):
        step(augment(train_x[:a.batch], a.pad, gen), train_y[:a.batch], 0.0)
    evaluate(compiled, test_x, test_y)
    model.load_state_dict(state)
    opt.state.clear()
    gen.manual_seed(seed)
    torch.cuda.synchronize()

    start = time.perf_counter()
    curve, total_step = [], 0
    for epoch in range(1, a.max_epochs + 1):
        order = torch.randperm(train_x.shape[0], device=dev, generator=gen)
        for i in range(steps_per_epoch):
            idx = order[i * a.batch:(i + 1) * a.batch]
            loss = step(augment(train_x[idx], a.pad, gen), train_y[idx],
                        scheduled_lr(peak, total_step, steps_per_epoch, a))
            total_step += 1
        acc = evaluate(compiled, test_x, test_y)
        curve.append((epoch, acc, loss.item(), time.perf_counter() - start))
        if acc >= a.target:
            return {"time_s": time.perf_counter() - start, "epochs": epoch, "accuracy": acc, "curve": curve}
    return {"time_s": None, "epochs": a.max_epochs, "accuracy": max(c[1] for c in curve), "curve": curve}


def accelbench_time_to_train(a, seeds):
    args = ["train", "--axis", "model=fashion_resnet", "--axis", "dataset=fashion-mnist",
            "--axis", f"target_accuracy={a.target}", "--axis", f"batch={a.batch}", "--axis", "precision=bf16",
            "--axis", "seed=" + ",".join(str(s) for s in seeds),
            "--option", f"max_epochs={a.max_epochs}", "--option", f"lr={a.lr}",
            "--option", f"warmup_epochs={a.warmup_epochs}", "--option", f"schedule_epochs={a.schedule_epochs}",
            "--option", f"lr_updates_per_epoch={a.lr_updates_per_epoch}",
            "--option", f"weight_decay={a.weight_decay}", "--option", f"pad={a.pad}"]
    out = {}
    for r in accelbench(a.accelbench, args, a.out):
        t = r.get("metrics", {}).get("time_to_train", {})
        seed = int(r["params"]["seed"]) if "seed" in r.get("params", {}) else t.get("seed")
        out[seed] = {"status": r["status"], "time_s": t.get("time_to_train_s"), "epochs": t.get("epochs"),
                     "accuracy": t.get("final_accuracy"), "init_s": t.get("init_s"),
                     "energy_j": r.get("telemetry", {}).get("energy_j"), "reason": r.get("reason", ""),
                     "olympic": r.get("metrics", {}).get("time_to_train_olympic")}
    return out


def fmt(v, spec):
    return "-" if v is None else format(v, spec)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--part", choices=("image", "gpt"), default="image",
                    help="image: fashion_resnet on Fashion-MNIST; gpt: a GPT on a text file (compare_tta_gpt.py)")
    ap.add_argument("--accelbench", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--seeds", default="1", help="comma-separated seeds, e.g. 1,2,3")
    ap.add_argument("--target", type=float, default=0.92)
    ap.add_argument("--batch", type=int, default=None, help="default: 256 (image), 64 (gpt)")
    ap.add_argument("--max-epochs", type=int, default=30)
    ap.add_argument("--lr", type=float, default=None,
                    help="peak rate; image default 0 = 0.2 x batch / 256; gpt default 1e-3")
    ap.add_argument("--warmup-epochs", type=float, default=None, help="default: 1 (image), 0.2 (gpt)")
    ap.add_argument("--schedule-epochs", type=float, default=None, help="default: 10 (image), 5 (gpt)")
    ap.add_argument("--lr-updates-per-epoch", type=int, default=10)
    ap.add_argument("--weight-decay", type=float, default=5e-4)
    ap.add_argument("--pad", type=int, default=2)
    compare_tta_gpt.add_arguments(ap)
    a = ap.parse_args()
    seeds = [int(s) for s in a.seeds.split(",") if s]
    if a.part == "gpt":
        return compare_tta_gpt.run(a, seeds)
    a.batch = 256 if a.batch is None else a.batch
    a.lr = 0.0 if a.lr is None else a.lr
    a.warmup_epochs = 1.0 if a.warmup_epochs is None else a.warmup_epochs
    a.schedule_epochs = 10.0 if a.schedule_epochs is None else a.schedule_epochs
    print(f"time to train fashion_resnet on Fashion-MNIST to {a.target:.2%} top-1, batch {a.batch}, bf16", flush=True)
    try:
        ab = accelbench_time_to_train(a, seeds)
    except SystemExit as e:  # accelbench exits 1 when no seed reached the target: PyTorch still runs
        print(f"accelbench: {e}", flush=True)
        ab = {}
    rows = []
    for seed in seeds:
        t = torch_time_to_train(a, seed)
        mine = ab.get(seed, {})
        rows.append((seed, mine.get("time_s"), t["time_s"]))
        print(f"seed {seed}: accelbench {mine.get('status', '?')} {fmt(mine.get('time_s'), '.2f')} s "
              f"({mine.get('epochs')} epochs, acc {fmt(mine.get('accuracy'), '.4f')}, "
              f"init {fmt(mine.get('init_s'), '.1f')} s, {fmt(mine.get('energy_j'), '.0f')} J) | "
              f"PyTorch {fmt(t['time_s'], '.2f')} s ({t['epochs']} epochs, acc {t['accuracy']:.4f})", flush=True)
        if mine.get("reason"):
            print(f"  accelbench: {mine['reason']}", flush=True)
        print("  PyTorch curve: " + ", ".join(f"e{e} {acc:.4f} ({s:.1f} s)" for e, acc, _, s in t["curve"]), flush=True)
    done = [(x, y) for _, x, y in rows if x is not None and y is not None]
    if done:
        ab_mean, pt_mean = statistics.mean(x for x, _ in done), statistics.mean(y for _, y in done)
        print(f"mean over {len(done)} seeds both converged: accelbench {ab_mean:.2f} s, PyTorch {pt_mean:.2f} s, "
              f"PyTorch / accelbench {pt_mean / ab_mean:.2f}x", flush=True)
    last = ab.get(seeds[-1], {}).get("olympic")
    if last:
        mean = fmt(last.get("olympic_mean_s"), ".2f")
        print(f"accelbench olympic mean over {last['runs']} seeds: {mean} s", flush=True)


if __name__ == "__main__":
    main()
