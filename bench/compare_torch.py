#!/usr/bin/env python3
"""accelbench side by side with PyTorch on the same GPU, in one run (the GEMM and copy targets).

PyTorch is the peer to beat, timed the way accelbench's batch mode times: CUDA events around
back-to-back iterations, median over batches. Each peer is timed before and after accelbench and
its better figure kept, so drift favours the peer, never us.
  usage: compare_torch.py --accelbench build/cuda/src/cli/accelbench --out DIR
"""
import argparse
import json
import os
import statistics
import tempfile

import torch

from compare_common import accelbench, time_batches


def time_cuda(fn, iters_per_batch=10, batches=30, warmup=5):
    return time_batches(fn, iters_per_batch, batches, warmup)


def torch_gemm_tflops(precision, n):
    if precision == "fp8":
        a = torch.randn(n, n, device="cuda").to(torch.float8_e4m3fn)
        b = torch.randn(n, n, device="cuda").to(torch.float8_e4m3fn).t()  # column-major, as _scaled_mm needs
        one = torch.tensor(1.0, device="cuda")
        fn = lambda: torch._scaled_mm(a, b, scale_a=one, scale_b=one, out_dtype=torch.bfloat16)
    else:
        dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}[precision]
        a = torch.rand(n, n, device="cuda", dtype=dtype) * 2 - 1
        b = torch.rand(n, n, device="cuda", dtype=dtype) * 2 - 1
        fn = lambda: torch.matmul(a, b)
    t = time_cuda(fn)
    return 2 * n**3 / t / 1e12


def torch_copy_gbps(array_bytes):
    x = torch.rand(array_bytes // 4, device="cuda")
    y = torch.empty_like(x)
    t = time_cuda(lambda: y.copy_(x), iters_per_batch=5)
    return 2 * array_bytes / t / 1e9  # read + write, as accelbench's stream copy counts


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--accelbench", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--size", type=int, default=8192)
    ap.add_argument("--array-bytes", type=int, default=2 << 30)
    args = ap.parse_args()
    work = tempfile.mkdtemp(prefix="ab-compare-")
    n = args.size
    rows, report = [], {"device": torch.cuda.get_device_name(), "torch": torch.__version__}

    before = {p: torch_gemm_tflops(p, n) for p in ("bf16", "fp16", "fp8")}
    before["copy"] = torch_copy_gbps(args.array_bytes)
    ours = {}
    for rec in accelbench(args.accelbench, ["gemm", "--axis", "precision=bf16,fp16,fp8", "--axis", f"m,n,k={n}"], work):
        assert rec["status"] == "ok", rec
        ours[rec["params"]["precision"]] = rec["rates"]["tflops"]
        report.setdefault("algorithms", {})[rec["params"]["precision"]] = rec["metrics"]["algorithm"]
    rec = accelbench(args.accelbench, ["stream", "--axis", "op=copy", "--axis", f"array_bytes={args.array_bytes}"], work)[0]
    assert rec["status"] == "ok", rec
    ours["copy"] = rec["rates"]["gbps"]
    after = {p: torch_gemm_tflops(p, n) for p in ("bf16", "fp16", "fp8")}
    after["copy"] = torch_copy_gbps(args.array_bytes)

    peers = {"bf16": "torch.matmul", "fp16": "torch.matmul", "fp8": "torch._scaled_mm", "copy": "Tensor.copy_"}
    for key in ("bf16", "fp16", "fp8", "copy"):
        peer = max(before[key], after[key])
        unit = "GB/s" if key == "copy" else "TFLOP/s"
        what = f"stream copy {args.array_bytes >> 20} MiB" if key == "copy" else f"gemm {key} {n}^3"
        rows.append((what, unit, ours[key], peers[key], peer, 100 * ours[key] / peer))

    # Repeatability: five separate runs of gemm bf16 at n^3.
    medians = []
    for _ in range(5):
        rec = accelbench(args.accelbench, ["gemm", "--axis", "precision=bf16", "--axis", f"m,n,k={n}"], work)[0]
        medians.append(rec["time"]["median_s"])
    spread = (max(medians) - min(medians)) / statistics.median(medians)
    report["repeat_bf16_medians_s"] = medians
    report["repeat_bf16_rel_spread"] = spread
    report["rows"] = rows

    lines = ["| what | unit | accelbench | peer | peer value | accelbench / peer |", "|---|---|---:|---|---:|---:|"]
    for what, unit, o, peer_name, p, pct in rows:
        lines.append(f"| {what} | {unit} | {o:.1f} | {peer_name} | {p:.1f} | {pct:.1f}% |")
    lines.append("")
    lines.append(f"Five runs of gemm bf16 {n}^3: medians {', '.join(f'{m*1e3:.4f}' for m in medians)} ms; "
                 f"relative spread (max-min)/median = {100*spread:.2f}%")
    text = "\n".join(lines)
    print(text)
    with open(os.path.join(args.out, "compare.md"), "w") as f:
        f.write(text + "\n")
    with open(os.path.join(args.out, "compare.json"), "w") as f:
        json.dump(report, f, indent=1)


if __name__ == "__main__":
    main()
