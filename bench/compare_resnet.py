#!/usr/bin/env python3
"""accelbench's ResNet-50 (or ResNeXt-101, --model) training and inference side by side with PyTorch on the same GPU, in one run.

accelbench: `train` (batch 256, bf16 and tf32, NHWC, CUDA-graph replay of the whole step) and `infer`
(batch 1..256, fp16 and bf16, NHWC, CUDA-graph replay of the forward), through the CLI; records read
from the run's points.jsonl. PyTorch: torchvision's resnet50 (or the same network built here from
torch.nn when torchvision is absent), channels_last, cudnn.benchmark on;
  training   eager, SGD with momentum (foreach), fp32 master weights; bf16 = autocast(bfloat16),
             tf32 = fp32 with TF32 allowed in cuDNN and cuBLAS;
  inference  the model cast to half / bfloat16, eval mode, its forward captured in a CUDA graph.
Timing follows accelbench's: CUDA events, warm-up first; training = median over batches of
back-to-back steps; inference = median (and p99) over single replays, one forward per sample, as
the `infer` workload samples. Each PyTorch figure is taken before and after accelbench and the
better one kept, so drift favours the peer (--torch-once: before only, to fit a short time limit).
Every figure is printed (flushed) the moment it is measured, accelbench's as its CLI appends each
record, so a run cut short by a time limit keeps what it measured; the table comes at the end.
With --energy-batches, those inference batches also get samples per joule on both sides over the
same kind of loop (one batch at a time, synchronised), each timed for ENERGY_WINDOW_S seconds.
  usage: compare_resnet.py --accelbench build/cuda/src/cli/accelbench --out DIR [--torch-once]
         [--model resnext101_32x4d] [--infer-batches 1,2,10,12] [--energy-batches 10]
"""
import argparse
import json
import os
import statistics

import torch
import torch.nn as nn
import torch.nn.functional as F

from compare_common import GpuEnergy, accelbench, samples_per_joule, time_batches

TRAIN_PRECISIONS = ("bf16", "tf32")
MODEL = "resnet50"
TORCH_COMPILE = False  # --torch-compile: PyTorch trains the torch.compile'd model (the training target's peer)
ENERGY_WINDOW_S = 5.0  # the energy counter steps every ~100 ms on an H200: a 2% step at most
INFER_PRECISIONS = ("fp16", "bf16")


# ----------------------------------------------------------------------------------------------
# The network: torchvision's when present, else the same ResNet-50 v1.5 (stride on the 3x3).

class Bottleneck(nn.Module):
    expansion = 4

    def __init__(self, inplanes, planes, stride=1, downsample=None):
        super().__init__()
        self.conv1 = nn.Conv2d(inplanes, planes, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(planes)
        self.conv2 = nn.Conv2d(planes, planes, 3, stride=stride, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(planes)
        self.conv3 = nn.Conv2d(planes, planes * 4, 1, bias=False)
        self.bn3 = nn.BatchNorm2d(planes * 4)
        self.relu = nn.ReLU(inplace=True)
        self.downsample = downsample

    def forward(self, x):
        identity = x if self.downsample is None else self.downsample(x)
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.relu(self.bn2(self.conv2(out)))
        out = self.bn3(self.conv3(out))
        return self.relu(out + identity)


class ResNet50(nn.Module):
    def __init__(self, num_classes=1000):
        super().__init__()
        self.conv1 = nn.Conv2d(3, 64, 7, stride=2, padding=3, bias=False)
        self.bn1 = nn.BatchNorm2d(64)
        self.relu = nn.ReLU(inplace=True)
        self.maxpool = nn.MaxPool2d(3, stride=2, padding=1)
        self.inplanes = 64
        self.layer1 = self._layer(64, 3, 1)
        self.layer2 = self._layer(128, 4, 2)
        self.layer3 = self._layer(256, 6, 2)
        self.layer4 = self._layer(512, 3, 2)
        self.avgpool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(2048, num_classes)
        for m in self.modules():  # torchvision's initialisation
            if isinstance(m, nn.Conv2d):
                nn.init.kaiming_normal_(m.weight, mode="fan_out", nonlinearity="relu")
            elif isinstance(m, nn.BatchNorm2d):
                nn.init.ones_(m.weight)
                nn.init.zeros_(m.bias)

    def _layer(self, planes, blocks, stride):
        downsample = None
        if stride != 1 or self.inplanes != planes * 4:
            downsample = nn.Sequential(nn.Conv2d(self.inplanes, planes * 4, 1, stride=stride, bias=False),
                                       nn.BatchNorm2d(planes * 4))
        layers = [Bottleneck(self.inplanes, planes, stride, downsample)]
        self.inplanes = planes * 4
        layers += [Bottleneck(self.inplanes, planes) for _ in range(1, blocks)]
        return nn.Sequential(*layers)

    def forward(self, x):
        x = self.maxpool(self.relu(self.bn1(self.conv1(x))))
        x = self.layer4(self.layer3(self.layer2(self.layer1(x))))
        return self.fc(torch.flatten(self.avgpool(x), 1))


MODELS = ("resnet50", "resnext101_32x4d", "resnext101_32x8d")


def build_model(name):
    """torchvision's network (ResNeXt-101 32x4d, which torchvision does not name, from its ResNet class
    with timm's / the paper's groups=32, width 4); ResNet-50 from torch.nn when torchvision is absent."""
    try:
        import torchvision
        from torchvision.models.resnet import Bottleneck as TvBottleneck, ResNet
    except ImportError:
        if name != "resnet50":
            raise SystemExit(f"{name} needs torchvision")
        return ResNet50(), "resnet50 built from torch.nn (torchvision absent)"
    tag = f"torchvision {torchvision.__version__} {name}"
    if name == "resnext101_32x4d":
        return ResNet(TvBottleneck, [3, 4, 23, 3], groups=32, width_per_group=4), tag + " (ResNet class, groups 32, width 4)"
    return getattr(torchvision.models, name)(), tag


# ----------------------------------------------------------------------------------------------
# Timing

def time_singles(fn, samples, warmup):
    """One call per sample, as the infer workload samples: median and p99 latency in seconds."""
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(samples):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) / 1e3)
    times.sort()
    h = 0.99 * (len(times) - 1)  # type 7 interpolation, as accelbench's p99_s
    lo = int(h)
    p99 = times[lo] + (h - lo) * (times[min(lo + 1, len(times) - 1)] - times[lo])
    return statistics.median(times), p99


def torch_train_step_s(precision, batch, image_px):
    torch.backends.cuda.matmul.allow_tf32 = precision == "tf32"
    torch.backends.cudnn.allow_tf32 = precision == "tf32"
    model, _ = build_model(MODEL)
    model = model.cuda().to(memory_format=torch.channels_last).train()
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9, weight_decay=1e-4, foreach=True)
    if TORCH_COMPILE:
        model = torch.compile(model)  # compiled during the warm-up steps below
    x = torch.randn(batch, 3, image_px, image_px, device="cuda").to(memory_format=torch.channels_last)
    y = torch.randint(0, 1000, (batch,), device="cuda")

    def step():
        opt.zero_grad(set_to_none=True)
        with torch.autocast("cuda", dtype=torch.bfloat16, enabled=precision == "bf16"):
            loss = F.cross_entropy(model(x), y)
        loss.backward()
        opt.step()

    t = time_batches(step, iters_per_batch=5, batches=8, warmup=10)
    del model, opt, x, y
    torch.cuda.empty_cache()
    return t


def torch_infer_latency_s(precision, batch, image_px, energy=None):
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    dtype = {"fp16": torch.float16, "bf16": torch.bfloat16}[precision]
    model, _ = build_model(MODEL)
    model = model.cuda().to(dtype=dtype, memory_format=torch.channels_last).eval()
    x = torch.randn(batch, 3, image_px, image_px, device="cuda", dtype=dtype).to(memory_format=torch.channels_last)
    with torch.inference_mode():
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(5):  # cuDNN autotuning and lazy initialisation, outside the capture
                model(x)
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            model(x)
    samples = 400 if batch <= 32 else 100
    t = time_singles(graph.replay, samples=samples, warmup=20)
    if energy is not None:  # (samples/J, mean W) over the same one-replay-at-a-time loop
        t = (*t, *samples_per_joule(graph.replay, batch, ENERGY_WINDOW_S, energy))
    del graph, model, x
    torch.cuda.empty_cache()
    return t


def main():
    global TRAIN_PRECISIONS, INFER_PRECISIONS, MODEL, TORCH_COMPILE
    ap = argparse.ArgumentParser()
    ap.add_argument("--accelbench", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--train-batch", type=int, default=256)
    ap.add_argument("--image-size", type=int, default=224)
    ap.add_argument("--model", default=MODEL, choices=MODELS)
    ap.add_argument("--max-infer-batch", type=int, default=256)
    ap.add_argument("--infer-batches", default="", help="comma-separated inference batches (default: 1, 2, 4, .. max)")
    ap.add_argument("--train-precisions", default=",".join(TRAIN_PRECISIONS))
    ap.add_argument("--infer-precisions", default=",".join(INFER_PRECISIONS))
    ap.add_argument("--energy-batches", default="",
                    help="inference batches whose samples/J are compared too (PyTorch: NVML energy counter over "
                         f"{ENERGY_WINDOW_S:.0f} s of the latency loop; accelbench: its record, timed for as long)")
    ap.add_argument("--infer-axes", default="",
                    help="extra accelbench infer axes of one value each, space-separated, e.g. 'fold=on'")
    ap.add_argument("--train-axes", default="",
                    help="extra accelbench train axes of one value each, space-separated, e.g. 'fuse=on'")
    ap.add_argument("--torch-compile", action="store_true",
                    help="PyTorch trains torch.compile(model) (default mode; compiled in the warm-up), not eager")
    ap.add_argument("--torch-once", action="store_true",
                    help="measure PyTorch before accelbench only, not again after (about half the PyTorch time)")
    args = ap.parse_args()
    TRAIN_PRECISIONS = tuple(p for p in args.train_precisions.split(",") if p)
    INFER_PRECISIONS = tuple(p for p in args.infer_precisions.split(",") if p)
    os.makedirs(args.out, exist_ok=True)
    px, tb = args.image_size, args.train_batch
    MODEL = args.model
    TORCH_COMPILE = args.torch_compile
    infer_batches = ([int(b) for b in args.infer_batches.split(",") if b] if args.infer_batches else
                     [b for b in (1, 2, 4, 8, 16, 32, 64, 128, 256, 512) if b <= args.max_infer_batch])
    energy_batches = [int(b) for b in args.energy_batches.split(",") if b]
    def one_value_axes(option, text):
        if any("," in axis or ":" in axis for axis in text.split()):
            raise SystemExit(f"{option} takes one value per axis (records are matched by precision and batch)")
        return [a for axis in text.split() for a in ("--axis", axis)]
    extra_axes = one_value_axes("--infer-axes", args.infer_axes)
    train_axes = one_value_axes("--train-axes", args.train_axes)
    if not set(energy_batches) <= set(infer_batches):
        raise SystemExit(f"--energy-batches {energy_batches} must be among the inference batches {infer_batches}")
    energy = GpuEnergy(0) if energy_batches else None
    _, net = build_model(MODEL)
    report = {"device": torch.cuda.get_device_name(), "torch": torch.__version__,
              "cudnn": torch.backends.cudnn.version(), "torch_model": net, "image_size": px,
              "torch_training": "torch.compile" if TORCH_COMPILE else "eager",
              "accelbench_train_axes": args.train_axes, "accelbench_infer_axes": args.infer_axes}
    torch.backends.cudnn.benchmark = True

    print(f"{MODEL} at {px}x{px}, NHWC, on {report['device']}; PyTorch {report['torch']} ({net}); "
          f"figures as measured, the table at the end", flush=True)

    def torch_all(when):
        train, infer = {}, {}
        for p in TRAIN_PRECISIONS:
            train[p] = t = torch_train_step_s(p, tb, px)
            how = "torch.compile" if TORCH_COMPILE else "eager"
            print(f"PyTorch    train {MODEL} {p} b{tb} {how} ({when}): {tb / t:.0f} img/s, {t * 1e3:.2f} ms/step", flush=True)
        for p in INFER_PRECISIONS:
            for b in infer_batches:
                infer[(p, b)] = t = torch_infer_latency_s(p, b, px, energy if b in energy_batches else None)
                joules = f", {t[2]:.2f} img/J at {t[3]:.0f} W" if len(t) > 2 else ""
                print(f"PyTorch    infer {MODEL} {p} b{b} ({when}): {b / t[0]:.0f} img/s, "
                      f"p50 {t[0] * 1e3:.3f} ms, p99 {t[1] * 1e3:.3f} ms{joules}", flush=True)
        return train, infer

    def print_ours(rec):
        prm = rec.get("params", {})
        what = f"{rec.get('workload')} {MODEL} {prm.get('precision')} b{prm.get('batch')}"
        if rec.get("status") != "ok":
            print(f"accelbench {what}: {rec.get('status')}: {rec.get('reason')}", flush=True)
            return
        t = rec["time"]
        if rec.get("workload") == "train":
            tail = f"{t['median_s'] * 1e3:.2f} ms/step"
            peer_s = train_before.get(prm.get("precision"))
        else:
            tail = f"p50 {t['median_s'] * 1e3:.3f} ms, p99 {t['p99_s'] * 1e3:.3f} ms"
            peer_s = infer_before.get((prm.get("precision"), prm.get("batch")), (None,))[0]
        vs = f"; x{peer_s / t['median_s']:.2f} PyTorch's (before)" if peer_s else ""
        print(f"accelbench {what}: {prm['batch'] / t['median_s']:.0f} img/s, {tail}{vs}", flush=True)

    train_before, infer_before = torch_all("before accelbench")
    ab_dir = os.path.join(args.out, "accelbench")
    ours_train, ours_infer = {}, {}
    train_runs = [["train", "--axis", f"model={MODEL}", "--axis", f"batch={tb}",
                   "--axis", f"precision={','.join(TRAIN_PRECISIONS)}", "--axis", "layout=nhwc",
                   "--axis", f"image_size={px}", "--axis", "graph=on", *train_axes]] if TRAIN_PRECISIONS else []
    for rec in (r for run in train_runs for r in accelbench(args.accelbench, run, ab_dir, on_record=print_ours)):
        if rec["status"] != "ok":
            raise SystemExit(f"accelbench train point not ok: {rec.get('status')}: {rec.get('reason')}")
        ours_train[rec["params"]["precision"]] = rec
    infer_runs = [["infer", "--axis", f"model={MODEL}", "--axis", f"batch={','.join(map(str, infer_batches))}",
                   "--axis", f"precision={','.join(INFER_PRECISIONS)}", "--axis", "layout=nhwc",
                   "--axis", f"image_size={px}", "--axis", "graph=on", *extra_axes]] if INFER_PRECISIONS else []
    for rec in (r for run in infer_runs for r in accelbench(args.accelbench, run, ab_dir, on_record=print_ours)):
        if rec["status"] != "ok":
            raise SystemExit(f"accelbench infer point not ok: {rec.get('status')}: {rec.get('reason')}")
        ours_infer[(rec["params"]["precision"], rec["params"]["batch"])] = rec
    # Energy: a separate accelbench run timed for as long as PyTorch's energy window.
    ours_energy = {}
    energy_runs = [["infer", "--axis", f"model={MODEL}", "--axis", f"batch={','.join(map(str, energy_batches))}",
                    "--axis", f"precision={','.join(INFER_PRECISIONS)}", "--axis", "layout=nhwc",
                    "--axis", f"image_size={px}", "--axis", "graph=on", *extra_axes,
                    "--min-time", str(ENERGY_WINDOW_S)]] if energy_batches and INFER_PRECISIONS else []
    for rec in (r for run in energy_runs for r in accelbench(args.accelbench, run, ab_dir)):
        tel = rec.get("telemetry", {})
        key = (rec["params"]["precision"], rec["params"]["batch"])
        ours_energy[key] = (tel.get("samples_per_j"), tel.get("mean_power_w"))
        print(f"accelbench infer {MODEL} {key[0]} b{key[1]} (energy run): {rec.get('status')}, "
              f"{tel.get('samples_per_j')} img/J at {tel.get('mean_power_w')} W", flush=True)
    # Without a second measurement "after" is the same figure, so min() below keeps "before".
    train_after, infer_after = (train_before, infer_before) if args.torch_once else torch_all("after accelbench")

    rows = []
    for p in TRAIN_PRECISIONS:
        rec = ours_train[p]
        peer_s = min(train_before[p], train_after[p])
        ours_s = rec["time"]["median_s"]
        rows.append({"what": f"train {MODEL} {p} b{tb}", "unit": "img/s", "ours": tb / ours_s, "torch": tb / peer_s,
                     "ratio": peer_s / ours_s, "ours_step_ms": ours_s * 1e3, "torch_step_ms": peer_s * 1e3,
                     "ours_tflops": rec["rates"].get("tflops"), "ours_pct_of_ceiling": rec["rates"].get("pct_of_ceiling"),
                     "ours_loss_first_last": [rec["metrics"]["loss_first"], rec["metrics"]["loss_last"]]})
    for p in INFER_PRECISIONS:
        for b in infer_batches:
            rec = ours_infer[(p, b)]
            peer = min(infer_before[(p, b)], infer_after[(p, b)], key=lambda t: t[0])
            ours_s = rec["time"]["median_s"]
            rows.append({"what": f"infer {MODEL} {p} b{b}", "unit": "img/s", "ours": b / ours_s, "torch": b / peer[0],
                         "ratio": peer[0] / ours_s, "ours_p50_ms": ours_s * 1e3, "torch_p50_ms": peer[0] * 1e3,
                         "ours_p99_ms": rec["time"]["p99_s"] * 1e3, "torch_p99_ms": peer[1] * 1e3,
                         "ours_check_rel_error": rec.get("check", {}).get("rel_error")})
            if (p, b) in ours_energy and len(peer) > 2:
                rows[-1].update({"ours_img_per_j": ours_energy[(p, b)][0], "ours_mean_w": ours_energy[(p, b)][1],
                                 "torch_img_per_j": peer[2], "torch_mean_w": peer[3]})
    report["rows"] = rows
    report["torch_measured"] = "before accelbench only" if args.torch_once else "before and after accelbench, better kept"
    report["torch_raw"] = {"train_before_s": train_before,
                           "train_after_s": None if args.torch_once else train_after,
                           "infer_before_s": {f"{p} b{b}": v for (p, b), v in infer_before.items()},
                           "infer_after_s": None if args.torch_once else
                           {f"{p} b{b}": v for (p, b), v in infer_after.items()}}

    lines = ["",
             f"{MODEL} at {px}x{px}, NHWC, on {report['device']}; PyTorch {report['torch']} ({net}), cuDNN {report['cudnn']}; "
             f"PyTorch measured {report['torch_measured']}",
             "",
             "| what | accelbench img/s | PyTorch img/s | accelbench / PyTorch | accelbench ms (p50 / p99) | PyTorch ms (p50 / p99) |",
             "|---|---:|---:|---:|---:|---:|"]
    for r in rows:
        if "ours_step_ms" in r:
            ms_ours, ms_peer = f"{r['ours_step_ms']:.2f}", f"{r['torch_step_ms']:.2f}"
        else:
            ms_ours = f"{r['ours_p50_ms']:.3f} / {r['ours_p99_ms']:.3f}"
            ms_peer = f"{r['torch_p50_ms']:.3f} / {r['torch_p99_ms']:.3f}"
        lines.append(f"| {r['what']} | {r['ours']:.0f} | {r['torch']:.0f} | {r['ratio']:.2f} | {ms_ours} | {ms_peer} |")
    energy_rows = [r for r in rows if r.get("torch_img_per_j")]
    if energy_rows:
        lines += ["", f"Energy over {ENERGY_WINDOW_S:.0f} s of one-batch-at-a-time inference (GPU energy counter):", "",
                  "| what | accelbench img/J (W) | PyTorch img/J (W) | accelbench / PyTorch |", "|---|---:|---:|---:|"]
        for r in energy_rows:
            ours = r["ours_img_per_j"]
            ratio = f"{ours / r['torch_img_per_j']:.2f}" if ours else "n/a"
            ours_text = f"{ours:.2f} ({r['ours_mean_w']:.0f})" if ours else "n/a (no energy in the record)"
            lines.append(f"| {r['what']} | {ours_text} | {r['torch_img_per_j']:.2f} ({r['torch_mean_w']:.0f}) | {ratio} |")
    text = "\n".join(lines)
    print(text)
    with open(os.path.join(args.out, "compare_resnet.md"), "w") as f:
        f.write(text.lstrip("\n") + "\n")
    with open(os.path.join(args.out, "compare_resnet.json"), "w") as f:
        json.dump(report, f, indent=1)


if __name__ == "__main__":
    main()
