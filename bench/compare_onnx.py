#!/usr/bin/env python3
"""Users' models through ONNX: each family exported from PyTorch (random weights, opset 17, dynamic
batch), run by accelbench from the .onnx file, its logits compared with PyTorch's and its speed
with torch.compile of the same module, in one run on the same GPU.

Families: torchvision's ResNet-50, ConvNeXt-T, ViT-B/16, MobileNetV2, MobileNetV3-Large,
EfficientNet-B0, VGG-11 and DenseNet-121 (without torchvision: transformers' modules from their configs,
no download, or plain PyTorch stand-ins here; MobileNetV3 needs torchvision), ResNeXt-101 32x4d (plain
PyTorch here, as src/models/resnet.cpp builds it), and transformers' BERT-base
(BertForSequenceClassification, 2 labels) on 128 token ids: bert_base exports input_ids alone (its
attention maps onto accelbench's attention op), bert_base_mask also attention_mask (ones) and
token_type_ids (zeros), whose masked attention runs the plain matmul + softmax mapping. Batch norms get
random statistics, so the folding is exercised; parameters a module initialises to zeros (ViT's head
and class token) get random values, so the logits are not all zero.
accelbench: `run infer --axis model=FILE --axis batch=1,64 --axis precision=fp32,fp16
--option inputs=FILE --option dump_outputs=all`; the inputs file holds the 64 samples PyTorch sees
(float32 images, or int64 ids; NAME:FILE,NAME:FILE for several inputs), the records name each
point's outputs file: every sample of the file, run in batches of the point's batch, so the batch-1
and batch-64 verdicts rest on the same 64 samples (batch 1 runs them one at a time).
Checks (as the issue asks): fp32 max |error| <= 1e-4 x max |logit|, fp16 <= 1e-2 x max |logit|,
top-1 the same for every sample but near-ties (PyTorch's two logits closer than the bound); speed: accelbench's median latency vs torch.compile's (fp16,
channels_last for images, CUDA-event timing as compare_common.time_batches) at batch 1 and 64
(--batches picks others). Each fp16 row also shows PyTorch's own fp16 error (the module in half,
eager, on the same samples against the same fp32 logits): how much of the bound fp16 itself takes.
Finally the imported ResNeXt-101 32x4d vs the built-in resnext101_32x4d (target: within 3%).
With --precisions ...,fp8 (off by default): fp8 (e4m3 where it timed faster, infer's fp8_layers=faster)
against the same fp32 PyTorch logits within infer's own fp8 bound, max |error| <= 0.25 x max |logit|
(logits_tolerance in src/workloads/models/model_zoo.cpp: 4 units of e4m3 roundoff); top-1 agreement
is reported, not required (a random network's logits lie close together); timed beside the same
torch.compile fp16 figure.
  usage: compare_onnx.py --accelbench build/cuda/src/cli/accelbench --out DIR [--families resnet50,vit_b16]
                         [--no-compile] [--precisions fp32,fp16,fp8] [--batches 1,64] [--profile]
"""
import argparse
import copy
import json
import os
import subprocess

import numpy as np
import torch
import torch.nn as nn

from compare_common import accelbench, time_batches

TOLERANCE = {"fp32": 1e-4, "fp16": 1e-2, "fp8": 0.25}
BERT_SEQ = 128


# ----------------------------------------------------------------------------------------------
# Plain-PyTorch families (torchvision may be missing on the device).

class Bottleneck(nn.Module):
    def __init__(self, inplanes, planes, stride, groups, width_per_group):
        super().__init__()
        width = planes * width_per_group // 64 * groups
        self.conv1, self.bn1 = nn.Conv2d(inplanes, width, 1, bias=False), nn.BatchNorm2d(width)
        self.conv2 = nn.Conv2d(width, width, 3, stride, 1, groups=groups, bias=False)
        self.bn2 = nn.BatchNorm2d(width)
        self.conv3, self.bn3 = nn.Conv2d(width, planes * 4, 1, bias=False), nn.BatchNorm2d(planes * 4)
        self.relu = nn.ReLU(inplace=True)
        self.downsample = None
        if stride != 1 or inplanes != planes * 4:
            self.downsample = nn.Sequential(nn.Conv2d(inplanes, planes * 4, 1, stride, bias=False), nn.BatchNorm2d(planes * 4))

    def forward(self, x):
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.relu(self.bn2(self.conv2(out)))
        out = self.bn3(self.conv3(out))
        return self.relu(out + (x if self.downsample is None else self.downsample(x)))


class ResNeXt(nn.Module):
    """models::resnext101_32x4d: blocks 3, 4, 23, 3; groups 32, width 4; stride on the 3x3."""

    def __init__(self, blocks=(3, 4, 23, 3), groups=32, width_per_group=4, classes=1000):
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, 64, 7, 2, 3, bias=False), nn.BatchNorm2d(64), nn.ReLU(inplace=True),
                                  nn.MaxPool2d(3, 2, 1))
        layers, inplanes = [], 64
        for s, (n, planes) in enumerate(zip(blocks, (64, 128, 256, 512))):
            for i in range(n):
                layers.append(Bottleneck(inplanes, planes, 2 if s > 0 and i == 0 else 1, groups, width_per_group))
                inplanes = planes * 4
        self.layers = nn.Sequential(*layers)
        self.fc = nn.Linear(2048, classes)

    def forward(self, x):
        return self.fc(torch.flatten(nn.functional.adaptive_avg_pool2d(self.layers(self.stem(x)), 1), 1))


def vgg11(classes=1000):
    cfg, layers, c = [64, "M", 128, "M", 256, 256, "M", 512, 512, "M", 512, 512, "M"], [], 3
    for v in cfg:
        if v == "M":
            layers.append(nn.MaxPool2d(2, 2))
        else:
            layers += [nn.Conv2d(c, v, 3, padding=1), nn.ReLU(inplace=True)]
            c = v
    return nn.Sequential(*layers, nn.Flatten(), nn.Linear(512 * 7 * 7, 4096), nn.ReLU(inplace=True), nn.Dropout(),
                         nn.Linear(4096, 4096), nn.ReLU(inplace=True), nn.Dropout(), nn.Linear(4096, classes))


class DenseLayer(nn.Module):
    def __init__(self, c, growth):
        super().__init__()
        self.f = nn.Sequential(nn.BatchNorm2d(c), nn.ReLU(inplace=True), nn.Conv2d(c, 4 * growth, 1, bias=False),
                               nn.BatchNorm2d(4 * growth), nn.ReLU(inplace=True),
                               nn.Conv2d(4 * growth, growth, 3, padding=1, bias=False))

    def forward(self, x):
        return torch.cat([x, self.f(x)], 1)


def densenet121(classes=1000, growth=32):
    layers, c = [nn.Conv2d(3, 64, 7, 2, 3, bias=False), nn.BatchNorm2d(64), nn.ReLU(inplace=True), nn.MaxPool2d(3, 2, 1)], 64
    for i, n in enumerate((6, 12, 24, 16)):
        for _ in range(n):
            layers.append(DenseLayer(c, growth))
            c += growth
        if i < 3:
            layers += [nn.BatchNorm2d(c), nn.ReLU(inplace=True), nn.Conv2d(c, c // 2, 1, bias=False), nn.AvgPool2d(2, 2)]
            c //= 2
    layers += [nn.BatchNorm2d(c), nn.ReLU(inplace=True), nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(c, classes)]
    return nn.Sequential(*layers)


class Logits(nn.Module):
    """A transformers classifier's logits alone (its forward returns a ModelOutput)."""

    def __init__(self, model):
        super().__init__()
        self.model = model

    def forward(self, x):
        return self.model(x).logits


def torchvision_model(kind):
    """torchvision's own module where torchvision is installed (the families users export first)."""
    import torchvision.models as tv
    return getattr(tv, kind)(weights=None)


def hf(kind):
    import transformers as t
    make = {"resnet50": (t.ResNetConfig, t.ResNetForImageClassification),
            "convnext_tiny": (t.ConvNextConfig, t.ConvNextForImageClassification),
            "vit_b16": (t.ViTConfig, t.ViTForImageClassification),
            "mobilenet_v2": (t.MobileNetV2Config, t.MobileNetV2ForImageClassification),
            "efficientnet_b0": (t.EfficientNetConfig, t.EfficientNetForImageClassification)}[kind]
    config = make[0](num_labels=1000)
    if kind == "vit_b16":
        config._attn_implementation = "eager"  # plain MatMul/Softmax in the export
    return Logits(make[1](config))


def family(torchvision_name, fallback):
    """torchvision's module where it is installed, else the stand-in (transformers' or plain PyTorch's)."""
    def make():
        try:
            return torchvision_model(torchvision_name)
        except ImportError:
            if fallback is None:
                raise RuntimeError(f"{torchvision_name} needs torchvision, which is not installed")
            return fallback()
    return make


FAMILIES = {
    "resnet50": family("resnet50", lambda: hf("resnet50")),
    "convnext_tiny": family("convnext_tiny", lambda: hf("convnext_tiny")),
    "vit_b16": family("vit_b_16", lambda: hf("vit_b16")),
    "mobilenet_v2": family("mobilenet_v2", lambda: hf("mobilenet_v2")),
    "mobilenet_v3": family("mobilenet_v3_large", None),
    "efficientnet_b0": family("efficientnet_b0", lambda: hf("efficientnet_b0")),
    "vgg11": family("vgg11", vgg11), "densenet121": family("densenet121", densenet121),
    "resnext101_32x4d": ResNeXt, "bert_base": lambda: bert(), "bert_base_mask": lambda: bert(),
}
LANGUAGE = ("bert_base", "bert_base_mask")


class BertLogits(nn.Module):
    """BertForSequenceClassification's logits from positional inputs (ids [, mask, token types])."""

    def __init__(self, model):
        super().__init__()
        self.model = model

    def forward(self, input_ids, attention_mask=None, token_type_ids=None):
        return self.model(input_ids=input_ids, attention_mask=attention_mask, token_type_ids=token_type_ids).logits


def bert():
    import transformers as t
    return BertLogits(t.BertForSequenceClassification(t.BertConfig(num_labels=2)))


def family_inputs(name, model, batch, seed):
    """The family's inputs at `batch`, as (ONNX input name, tensor): random images, or random token
    ids with (bert_base_mask) a mask of ones and token types 0, the rule accelbench's synthetic
    inputs follow too."""
    g = torch.Generator().manual_seed(seed)
    if name not in LANGUAGE:
        return [("pixel_values", torch.randn(batch, 3, 224, 224, generator=g))]
    vocab = model.model.config.vocab_size
    ids = [("input_ids", torch.randint(0, vocab, (batch, BERT_SEQ), generator=g))]
    if name == "bert_base":
        return ids
    return ids + [("attention_mask", torch.ones(batch, BERT_SEQ, dtype=torch.long)),
                  ("token_type_ids", torch.zeros(batch, BERT_SEQ, dtype=torch.long))]


def randomise_batchnorms(model, seed):
    g = torch.Generator().manual_seed(seed)
    for m in model.modules():
        if isinstance(m, nn.BatchNorm2d):
            with torch.no_grad():
                m.weight.copy_(torch.rand(m.weight.shape, generator=g) + 0.5)
                m.bias.copy_(torch.rand(m.bias.shape, generator=g) * 0.2 - 0.1)
                m.running_mean.copy_(torch.rand(m.running_mean.shape, generator=g) * 0.2 - 0.1)
                m.running_var.copy_(torch.rand(m.running_var.shape, generator=g) + 0.5)


def randomise_zero_weights(model, seed):
    """Weights a module starts at zero (torchvision's ViT head and class token) get N(0, 0.02): with
    them at zero every logit is 0 and the comparison checks nothing."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() >= 2 and p.is_floating_point() and not p.any():
                p.copy_(torch.randn(p.shape, generator=g) * 0.02)


def export(model, inputs, path):
    """inputs: (name, tensor) at a small batch; dim 0 of each is the symbolic batch."""
    names = [n for n, _ in inputs]
    axes = {n: {0: "batch"} for n in names}
    axes["logits"] = {0: "batch"}
    kw = dict(opset_version=17, input_names=names, output_names=["logits"], dynamic_axes=axes)
    args = tuple(t for _, t in inputs)
    try:  # the TorchScript exporter: batch norms folded into the convolutions, static shapes but the batch
        torch.onnx.export(model, args, path, dynamo=False, **kw)
    except Exception as e:  # a PyTorch without it: the dynamo exporter (dynamic_axes become dynamic_shapes)
        print(f"note: TorchScript export failed ({str(e)[:120]}); using the dynamo exporter", flush=True)
        torch.onnx.export(model, args, path, **kw)


def write_inputs(inputs, path):
    """Each input's raw little-endian file (float32, or int64 for ids and masks); the value of
    accelbench's `inputs` option: FILE for one input, NAME:FILE,... for several."""
    files = []
    for name, t in inputs:
        f = f"{path}.{name}." + ("f32" if t.is_floating_point() else "i64")
        t.numpy().astype("<f4" if t.is_floating_point() else "<i8").tofile(f)
        files.append((name, f))
    return files[0][1] if len(files) == 1 else ",".join(f"{n}:{f}" for n, f in files)


# ----------------------------------------------------------------------------------------------

def torch_logits(model, inputs):
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    with torch.inference_mode():
        return model.cuda().float()(*[t.cuda() for _, t in inputs]).double().cpu().numpy()


def half_module(name, model):
    """The module in fp16 on the GPU, channels_last for images (as torch.compile runs it)."""
    m = model.cuda().half().eval()
    return m.to(memory_format=torch.channels_last) if name not in LANGUAGE else m


def half_inputs(name, inputs):
    xs = []
    for _, t in inputs:
        t = t.cuda()
        if t.is_floating_point():
            t = t.half().to(memory_format=torch.channels_last) if name not in LANGUAGE else t.half()
        xs.append(t)
    return xs


def torch_half_logits(name, model, inputs):
    """PyTorch's own fp16 logits (eager) on the checked inputs: how much of the fp16 bound a
    framework's own fp16 arithmetic takes on the same weights and samples."""
    m = half_module(name, copy.deepcopy(model))
    with torch.inference_mode():
        return m(*half_inputs(name, inputs)).double().cpu().numpy().reshape(len(inputs[0][1]), -1)


def torch_compile_latency_s(name, model, batch):
    c = torch.compile(half_module(name, model))
    xs = half_inputs(name, family_inputs(name, model, batch, seed=3))  # the same kind of inputs as the checked ones
    with torch.inference_mode():
        return time_batches(lambda: c(*xs), iters_per_batch=20 if batch == 1 else 5, batches=15, warmup=10)


def compare(got, want, precision):
    """Max error relative to the largest logit, top-1 agreement, and the verdict. A sample whose
    top-1 differs counts against the verdict unless PyTorch's own logits of the two classes are
    closer than the precision's error bound: random weights make such near-ties, and either answer
    is then within the allowed error."""
    scale = np.abs(want).max()
    err = np.abs(got - want).max() / scale
    ours, theirs = got.argmax(1), want.argmax(1)
    differ = np.nonzero(ours != theirs)[0]
    margins = want[differ, theirs[differ]] - want[differ, ours[differ]]
    ties = int((margins <= TOLERANCE[precision] * scale).sum())
    top1 = float((ours == theirs).mean())
    return err, top1, ties, err <= TOLERANCE[precision] and (ties == len(differ) or precision == "fp8")


def run_family(name, args, rows):
    path = os.path.join(args.out, name + ".onnx")
    torch.manual_seed(0)
    model = FAMILIES[name]().eval()
    randomise_batchnorms(model, 1)
    randomise_zero_weights(model, 2)
    export(model, family_inputs(name, model, 2, seed=4), path)
    inputs = family_inputs(name, model, max(args.batches), seed=5)
    want = torch_logits(model, inputs)
    want_half = torch_half_logits(name, model, inputs) if "fp16" in args.precisions.split(",") else None
    records = accelbench(args.accelbench, ["infer", "--axis", "model=" + path, "--axis", "batch=" + ",".join(map(str, args.batches)),
                                           "--axis", "precision=" + args.precisions, "--option", "inputs=" + write_inputs(inputs, path),
                                           "--option", "dump_outputs=all", "--timeout", "600"], os.path.join(args.out, name))
    ours, compiled_s = {}, {}
    for r in records:
        b, p = r["params"]["batch"], r["params"]["precision"]
        if r["status"] != "ok":
            rows.append((name, b, p, r["status"], r.get("reason", "")[:100]))
            continue
        # Every sample of the inputs file, run in batches of b: each batch size's verdict rests on
        # the same samples.
        got = np.fromfile(r["metrics"]["outputs_file"], dtype="<f4").astype(np.float64).reshape(-1, int(np.prod(want.shape[1:])))
        n = len(got)
        err, top1, ties, ok = compare(got, want[:n], p)
        ours[(b, p)] = r["time"]["median_s"]
        if p in ("fp16", "fp8") and args.compile and b not in compiled_s:
            compiled_s[b] = torch_compile_latency_s(name, model, b)
        compiled = compiled_s.get(b) if p in ("fp16", "fp8") else None
        speed = f"{r['time']['median_s'] * 1e3:.3f} ms vs torch.compile {compiled * 1e3:.3f} ms ({compiled / r['time']['median_s']:.2f}x)" if compiled else ""
        theirs = f" (PyTorch fp16 eager: err {compare(want_half[:n], want[:n], p)[0]:.2e})" if p == "fp16" else ""
        fp8 = f" fp8 layers {r['metrics']['fp8']['layers']}/{r['metrics']['fp8']['layers'] + r['metrics']['fp8']['fallback_layers']}" if p == "fp8" else ""
        rows.append((name, b, p, "PASS" if ok else "FAIL", f"{n} samples err {err:.2e} top1 {top1:.3f}{f' ({ties} near-tie(s) within the bound)' if ties else ''}{theirs}{fp8} {speed}"))
        print(*rows[-1], flush=True)
    if args.profile:
        print_profile(name, path, args)
    return ours


def print_profile(name, path, args):
    """accelbench's per-op profile of the file at the largest batch, fp16 (`--axis profile=on`):
    the time of each op kind, largest first, so a slow family shows where its time goes."""
    batch = max(args.batches)
    records = accelbench(args.accelbench, ["infer", "--axis", "model=" + path, "--axis", f"batch={batch}",
                                           "--axis", "precision=fp16", "--axis", "profile=on"],
                         os.path.join(args.out, name + "-profile"))
    for r in records:
        kinds = r.get("metrics", {}).get("profile", {}).get("by_kind", {}) if r["status"] == "ok" else {}
        if not kinds:
            print(f"{name} profile: {r['status']} {r.get('reason', '')[:100]}", flush=True)
            continue
        total = sum(k["time_s"] for k in kinds.values())
        top = sorted(kinds.items(), key=lambda kv: -kv[1]["time_s"])
        print(f"{name} profile b{batch} fp16: {total * 1e3:.3f} ms: " +
              ", ".join(f"{kind} {k['time_s'] * 1e3:.3f}" for kind, k in top), flush=True)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--accelbench", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--families", default=",".join(FAMILIES))
    ap.add_argument("--no-compile", dest="compile", action="store_false",
                    help="check the logits only (no torch.compile timing): a quick pass over many families")
    ap.add_argument("--precisions", default="fp32,fp16",
                    help="accelbench's precisions, of fp32, fp16 and fp8 (fp8: see the checks above)")
    ap.add_argument("--profile", action="store_true",
                    help="also print each family's per-op-kind times at the largest batch, fp16")
    ap.add_argument("--batches", default="1,64", type=lambda v: tuple(int(b) for b in v.split(",")),
                    help="the batch sizes (comma-separated)")
    args = ap.parse_args()
    if not set(args.precisions.split(",")) <= set(TOLERANCE):
        ap.error("--precisions takes fp32, fp16 and fp8")
    os.makedirs(args.out, exist_ok=True)
    rows, imported = [], {}
    for name in args.families.split(","):
        try:
            result = run_family(name, args, rows)
            if name == "resnext101_32x4d":
                imported = result or {}
        except Exception as e:  # one family's failure is a row, not the end of the run
            rows.append((name, "-", "-", "ERROR", str(e)[:200]))
            print(*rows[-1], flush=True)
    if imported:
        built = accelbench(args.accelbench, ["infer", "--axis", "model=resnext101_32x4d", "--axis",
                                             "batch=" + ",".join(map(str, args.batches)), "--axis", "precision=fp16"],
                           os.path.join(args.out, "builtin"))
        for r in built:
            b = r["params"]["batch"]
            if r["status"] == "ok" and (b, "fp16") in imported:
                ratio = imported[(b, "fp16")] / r["time"]["median_s"]
                rows.append(("resnext101 imported/built-in", b, "fp16", "PASS" if ratio <= 1.03 else "SLOWER",
                             f"{ratio:.3f} (imported {imported[(b, 'fp16')] * 1e3:.3f} ms)"))
    print("\n| family | batch | precision | verdict | detail |\n|---|---|---|---|---|")
    for row in rows:
        print("| " + " | ".join(map(str, row)) + " |")
    with open(os.path.join(args.out, "compare_onnx.json"), "w") as f:
        json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
