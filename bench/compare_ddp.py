#!/usr/bin/env python3
"""ResNet-50 data-parallel training scaling, accelbench beside PyTorch DDP, on 1..N GPUs of one host.

PyTorch: torchvision's resnet50 (else compare_resnet.py's torch.nn copy), channels_last,
cudnn.benchmark on, bf16 = autocast(bfloat16) (tf32 = fp32 with TF32 allowed), fp32 master
weights, SGD momentum 0.9 (foreach), a fixed synthetic batch per GPU (weak scaling: --batch images
on each GPU), DistributedDataParallel with its defaults (25 MiB buckets, buffers broadcast) and
gradient_as_bucket_view=True, NCCL backend, one process per GPU (torch.multiprocessing.spawn,
MASTER_ADDR=127.0.0.1 on a free port); world 1 runs under DDP too; --torch-compile trains
torch.compile(DDP(model)) instead of eager (Dynamo splits the graph at DDP's buckets). --comm-dtype bf16 registers DDP's
bf16_compress_hook (each bucket all-reduced in bf16, then copied back into the fp32 gradients) and
gives accelbench --axis comm_dtype=bf16 (each bucket cast to bf16, ncclAvg, cast back); grad
(default) all-reduces the fp32 gradients on both sides. Timing as compare_resnet.py's:
warm-up steps, then CUDA events around batches of back-to-back steps, median; the slowest rank's
median is the step time; images/s = world * batch / step time.
accelbench: one command, `mpirun -np N accelbench run train --axis gpus=1,2,..,N ...` (gpus=k trains
on ranks 0..k-1, batch per GPU); rank 0's records are read from DIR/runs/<id>/points.jsonl as they
are appended. Scaling efficiency(k) = images/s(k) / (k * images/s(1)) (docs/METHODOLOGY.md).
PyTorch is measured first (--torch-after: again after accelbench, its better figure kept, so drift
favours the peer). Every figure is printed (flushed) and the JSON summary rewritten as soon as it
is measured, so a run cut short keeps what it measured; the table comes at the end.
NVLink SHARP (multicast) stays off for every child: NCCL_NVLS_ENABLE=0,
TORCH_SYMM_MEM_DISABLE_MULTICAST=1, NVSHMEM_DISABLE_NVLS=1.
--rounds R repeats the whole comparison R times (DIR/round-1 .. round-R) and ends with each round's
scaling at the largest world size for both sides and the medians (exit 1 when a round lacks a side's
figure); --summarize DIR... prints that table for earlier --out folders without measuring.
  usage: compare_ddp.py --accelbench build/cuda/src/cli/accelbench --out DIR [--gpus N] [--comm-dtype bf16] [--rounds R]
         compare_ddp.py --summarize DIR/round-1 DIR/round-2
"""
import argparse
import json
import os
import shlex
import shutil
import socket
import statistics
import sys

NO_MULTICAST = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1", "NVSHMEM_DISABLE_NVLS": "1"}
os.environ.update(NO_MULTICAST)  # before torch loads NCCL, here and in every spawned child

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

from compare_common import GpuWindow, accelbench, time_batches  # noqa: E402


def world_sizes(n):
    """1, 2, 4, ... up to n, and n itself."""
    sizes, k = [], 1
    while k <= n:
        sizes.append(k)
        k *= 2
    return sorted(set(sizes + [n]))


# ----------------------------------------------------------------------------------------------
# PyTorch DDP: one process per GPU, ranks 0..world-1 on GPUs 0..world-1.

def torch_worker(rank, world, cfg, queue):
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP
    from compare_resnet import build_model  # torchvision's, else the same network from torch.nn

    torch.cuda.set_device(rank)
    dist.init_process_group("nccl", rank=rank, world_size=world, device_id=torch.device("cuda", rank))
    precision, batch, px = cfg["precision"], cfg["batch"], cfg["image_size"]
    torch.backends.cudnn.benchmark = True
    torch.backends.cuda.matmul.allow_tf32 = precision == "tf32"
    torch.backends.cudnn.allow_tf32 = precision == "tf32"
    torch.manual_seed(0)  # DDP broadcasts rank 0's weights at construction anyway
    model, net = build_model("resnet50")
    model = model.cuda().to(memory_format=torch.channels_last).train()
    ddp = DDP(model, device_ids=[rank], gradient_as_bucket_view=True)  # bucket_cap_mb: the default 25
    if cfg["comm_dtype"] == "bf16":
        from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import bf16_compress_hook
        ddp.register_comm_hook(state=None, hook=bf16_compress_hook)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.1, momentum=0.9, weight_decay=1e-4, foreach=True)
    if cfg["torch_compile"]:
        # torch.compile of the DDP-wrapped model: Dynamo's DDPOptimizer splits the graph at DDP's
        # bucket boundaries so the all-reduces still overlap backward; compiled in the first steps.
        ddp = torch.compile(ddp)
    gen = torch.Generator(device="cuda")
    gen.manual_seed(1000 + rank)  # a different fixed batch on each GPU, as data parallelism has
    x = torch.randn(batch, 3, px, px, device="cuda", generator=gen).to(memory_format=torch.channels_last)
    y = torch.randint(0, 1000, (batch,), device="cuda", generator=gen)
    last = [None]

    def step():
        opt.zero_grad(set_to_none=True)
        with torch.autocast("cuda", dtype=torch.bfloat16, enabled=precision == "bf16"):
            loss = F.cross_entropy(ddp(x), y)
        loss.backward()
        opt.step()
        last[0] = loss.detach()  # no sync here: read after timing

    step()
    loss_first = last[0].item()
    try:  # power, clocks, power capping over the timed batches, as accelbench's telemetry
        window = GpuWindow(rank)
    except (OSError, RuntimeError, AttributeError):  # no NVML: the figures without them
        window = None
    mine = time_batches(step, iters_per_batch=cfg["steps"], batches=cfg["batches"], warmup=cfg["warmup"],
                        warmup_s=cfg["warmup_s"], window=window)
    loss_last = last[0].item()
    every = torch.zeros(world, device="cuda")
    every[rank] = mine
    dist.all_reduce(every)  # each rank's median step time, for the record
    step_s = every.max().item()  # the slowest rank's: the ranks run in lock step through the all-reduces
    if rank == 0:
        queue.put({"world": world, "step_s": step_s, "rank_step_s": every.tolist(), "img_per_s": world * batch / step_s,
                   "gpu": window.summary() if window else None,
                   "loss_first": loss_first, "loss_last": loss_last,
                   "peak_mem_gib": torch.cuda.max_memory_allocated() / 2**30, "model": net,
                   "device": torch.cuda.get_device_name(), "torch": torch.__version__,
                   "cudnn": torch.backends.cudnn.version(), "nccl": ".".join(map(str, torch.cuda.nccl.version()))})
    dist.destroy_process_group()


def torch_ddp(world, cfg):
    """One PyTorch DDP measurement at this world size; rank 0's report."""
    import torch.multiprocessing as mp
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    os.environ.update({"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)})  # the children inherit them
    queue = mp.get_context("spawn").Queue()
    mp.spawn(torch_worker, args=(world, cfg, queue), nprocs=world, join=True)
    return queue.get(timeout=60)


# ----------------------------------------------------------------------------------------------

def parse_args():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--accelbench", help="the accelbench binary (required unless --summarize)")
    ap.add_argument("--out", help="output folder (required unless --summarize)")
    ap.add_argument("--gpus", type=int, default=0, help="largest world size N (default: all visible GPUs)")
    ap.add_argument("--batch", type=int, default=256, help="images per GPU")
    ap.add_argument("--precision", default="bf16", choices=("bf16", "tf32"))
    ap.add_argument("--image-size", type=int, default=224)
    ap.add_argument("--comm-dtype", default="grad", choices=("grad", "bf16"),
                    help="dtype the gradient buckets are all-reduced in: grad = their own (fp32); bf16 = DDP's "
                         "bf16_compress_hook and accelbench's comm_dtype=bf16")
    ap.add_argument("--steps", type=int, default=5, help="PyTorch: back-to-back steps per timed batch")
    ap.add_argument("--batches", type=int, default=8, help="PyTorch: timed batches (median taken)")
    ap.add_argument("--warmup", type=int, default=10, help="PyTorch: warm-up steps")
    ap.add_argument("--torch-compile", action="store_true",
                    help="PyTorch trains torch.compile(DDP(model)) (compiled in the first steps; the peer of "
                         "compare_resnet.py --torch-compile), not eager")
    ap.add_argument("--warmup-s", type=float, default=0.0,
                    help="both sides: warm up each point for at least this many seconds (accelbench --warmup), so "
                         "that every point runs at the temperature and clocks of sustained load")
    ap.add_argument("--mpirun", default="mpirun")
    ap.add_argument("--accelbench-args", default="", help="extra arguments for `accelbench run`, e.g. '--min-time 2'")
    ap.add_argument("--torch-after", action="store_true", help="measure PyTorch again after accelbench, keep the better")
    ap.add_argument("--skip-torch", action="store_true")
    ap.add_argument("--skip-accelbench", action="store_true")
    ap.add_argument("--rounds", type=int, default=1,
                    help="R > 1: R rounds of the whole comparison (DIR/round-1 .. round-R), then every round's scaling "
                         "at the largest world size and the medians")
    ap.add_argument("--summarize", nargs="+", metavar="ROUND_DIR",
                    help="measure nothing: the rounds table of these earlier --out folders")
    args = ap.parse_args()
    if not args.summarize and not (args.accelbench and args.out):
        ap.error("--accelbench and --out are required unless --summarize")
    return args


def compare(args):
    """One round: PyTorch, then accelbench, into args.out (compare_ddp.json and .md)."""
    n = args.gpus or torch.cuda.device_count()  # counts without creating a context: this process stays off the GPUs
    if n < 1:
        raise SystemExit("compare_ddp.py: no GPU visible")
    if n > torch.cuda.device_count():
        raise SystemExit(f"compare_ddp.py: --gpus {n} but {torch.cuda.device_count()} GPU(s) visible")
    os.makedirs(args.out, exist_ok=True)
    worlds = world_sizes(n)
    b, p, px = args.batch, args.precision, args.image_size
    cd = args.comm_dtype
    cfg = {"precision": p, "batch": b, "image_size": px, "steps": args.steps, "batches": args.batches,
           "warmup": args.warmup, "warmup_s": args.warmup_s, "comm_dtype": cd, "torch_compile": args.torch_compile}
    comm = "fp32 gradient all-reduce" if cd == "grad" else "bf16 gradient all-reduce"
    how = "PyTorch torch.compile(DDP)" if args.torch_compile else "PyTorch eager DDP"
    report = {"what": f"ResNet-50 {px}x{px} training, {p}, NHWC, {b} images per GPU (weak scaling), {comm}; {how}",
              "comm_dtype": cd,
              "torch_training": "torch.compile(DDP(model))" if args.torch_compile else "eager",
              "worlds": worlds, "torch_config": dict(cfg, ddp="bucket_cap_mb=25 (default), broadcast_buffers=True "
                                                               "(default), gradient_as_bucket_view=True" +
                                                               (", comm hook bf16_compress_hook" if cd == "bf16" else "")),
              "env": NO_MULTICAST, "torch": {}, "torch_after": {}, "accelbench": {}, "errors": []}

    def save():
        with open(os.path.join(args.out, "compare_ddp.json"), "w") as f:
            json.dump(report, f, indent=1, default=str)

    def efficiency(table, k, key):
        one, here = table.get(1), table.get(k)
        return here[key] / (k * one[key]) if one and here else None

    def added_ms(table, k):
        one, here = table.get(1), table.get(k)
        return (here["step_s"] - one["step_s"]) * 1e3 if one and here and k > 1 else None

    def pct(x):
        return f"{100 * x:.1f}%" if x is not None else "n/a"

    def gpu_text(g):
        """Rank 0's GPU over the timed window: what the power cap left of its clocks."""
        def f(key, fmt):
            return format(g[key], fmt) if g and g.get(key) is not None else "?"
        return (f"GPU 0 {f('mean_sm_clock_mhz', '.0f')} MHz, {f('mean_power_from_energy_w', '.0f')} W, "
                f"power-capped {pct(g.get('sw_power_cap_fraction')) if g else 'n/a'} of readings, {f('temperature_c', '.0f')} C")

    print(f"{report['what']}; world sizes {worlds}; figures as measured, the table at the end", flush=True)

    def measure_torch(into, when):
        for k in worlds:
            try:
                r = torch_ddp(k, cfg)
            except Exception as e:  # one world size failing (e.g. out of memory) leaves the others
                msg = f"PyTorch DDP world {k} ({when}) failed: {type(e).__name__}: {str(e)[-2000:]}"
                print(msg, flush=True)
                report["errors"].append(msg)
                save()
                continue
            into[k] = r
            print(f"PyTorch DDP    {k} GPU(s) ({when}): {r['img_per_s']:.0f} img/s, {r['step_s'] * 1e3:.2f} ms/step, "
                  f"scaling {pct(efficiency(into, k, 'img_per_s'))}, loss {r['loss_first']:.3f} -> {r['loss_last']:.3f}, "
                  f"peak {r['peak_mem_gib']:.1f} GiB; {gpu_text(r['gpu'])}", flush=True)
            if k == worlds[0]:
                print(f"  ({r['device']}; PyTorch {r['torch']}, {r['model']}, cuDNN {r['cudnn']}, NCCL {r['nccl']})",
                      flush=True)
            save()

    if not args.skip_torch:
        measure_torch(report["torch"], "before accelbench")

    def peer(k):
        """PyTorch's better figure at world k over its runs: drift favours the peer."""
        runs = [t[k] for t in (report["torch"], report["torch_after"]) if k in t]
        return max(runs, key=lambda r: r["img_per_s"]) if runs else None

    mpirun = shutil.which(args.mpirun)
    if args.skip_accelbench:
        pass
    elif not mpirun:
        msg = f"'{args.mpirun}' not found: the accelbench side is skipped (it runs one process per GPU under mpirun)"
        print(msg, flush=True)
        report["errors"].append(msg)
    else:
        launcher = [mpirun, "-np", str(n), "--allow-run-as-root", "--bind-to", "none",
                    *sum([["-x", k] for k in NO_MULTICAST], [])]
        ab_args = ["train", "--axis", "model=resnet50", "--axis", f"precision={p}", "--axis", f"batch={b}",
                   "--axis", "layout=nhwc", "--axis", f"image_size={px}",
                   "--axis", "gpus=" + ",".join(map(str, worlds)), "--axis", f"comm_dtype={cd}",
                   # accelbench refuses a warm-up of half the timeout or more: 3x leaves the samples room
                   *(["--warmup", str(args.warmup_s), "--timeout", str(max(60.0, 3 * args.warmup_s))] if args.warmup_s else []),
                   *shlex.split(args.accelbench_args)]
        report["accelbench_command"] = " ".join(launcher + [args.accelbench, "run", *ab_args])
        ours = report["accelbench"]

        def on_record(rec):
            prm = rec.get("params", {})
            k = prm.get("gpus")
            if rec.get("status") == "ok" and not isinstance(k, int):
                rec = dict(rec, status="unreadable", reason=f"params.gpus is {k!r}, not an integer")
            if rec.get("status") != "ok":
                msg = f"accelbench     {k} GPU(s): {rec.get('status')}: {rec.get('reason')}"
                print(msg, flush=True)
                report["errors"].append(msg)
                save()
                return
            m = rec.get("metrics", {})
            tg = ((rec.get("telemetry") or {}).get("gpus") or [{}])[0]  # rank 0's GPU
            ours[k] = {"img_per_s": rec["rates"]["samples_per_s"], "step_s": rec["time"]["median_s"],
                       "rel_spread": rec["time"].get("rel_spread"), "scaling_efficiency": m.get("scaling_efficiency"),
                       "loss_first": m.get("loss_first"), "loss_last": m.get("loss_last"),
                       "wire_dtype": (m.get("data_parallel") or {}).get("wire_dtype"),
                       "averaging": (m.get("data_parallel") or {}).get("averaging"),
                       "host_cpu": {key: v for key, v in m.items() if key.startswith("host_cpu")} or None,
                       "run_id": rec.get("run_id"), "seq": rec.get("seq"),
                       "gpu": {"mean_power_from_energy_w": tg.get("mean_power_from_energy_w"),
                               "mean_sm_clock_mhz": tg.get("mean_sm_clock_mhz"),
                               "sw_power_cap_fraction": (tg.get("throttle_fraction") or {}).get("sw_power_cap", 0.0 if tg else None),
                               "temperature_c": tg.get("max_temperature_c"), "readings": tg.get("readings")}}
            eff = m.get("scaling_efficiency", efficiency(ours, k, "img_per_s"))
            ref = peer(k)
            vs = f", x{ours[k]['img_per_s'] / ref['img_per_s']:.3f} PyTorch DDP's" if ref else ""
            how = f", averaging over {ours[k]['averaging']}" if ours[k]["averaging"] else ""
            print(f"accelbench     {k} GPU(s): {ours[k]['img_per_s']:.0f} img/s, {ours[k]['step_s'] * 1e3:.2f} ms/step, "
                  f"scaling {pct(eff)}{vs}{how}; {gpu_text(ours[k]['gpu'])}", flush=True)
            save()

        print("accelbench: " + report["accelbench_command"], flush=True)
        try:
            accelbench(args.accelbench, ab_args, os.path.join(args.out, "accelbench"), launcher=launcher,
                       on_record=on_record)
        except SystemExit as e:  # the CLI failed: keep PyTorch's figures and the points it did write
            msg = f"accelbench failed: {e}"
            print(msg, flush=True)
            report["errors"].append(msg)
            save()

    if args.torch_after and not args.skip_torch:
        measure_torch(report["torch_after"], "after accelbench")

    # The table: accelbench's figures beside PyTorch's better one per world size.
    ours = report["accelbench"]
    peers = {k: peer(k) for k in worlds if peer(k)}
    rows = []
    for k in worlds:
        o, t = ours.get(k), peers.get(k)
        ours_eff = (o.get("scaling_efficiency") if o else None) or efficiency(ours, k, "img_per_s")
        rows.append({"gpus": k, "ours_img_per_s": o and o["img_per_s"], "torch_img_per_s": t and t["img_per_s"],
                     "ratio": o["img_per_s"] / t["img_per_s"] if o and t else None,
                     "ours_scaling": ours_eff, "torch_scaling": efficiency(peers, k, "img_per_s"),
                     "ours_step_ms": o and o["step_s"] * 1e3, "torch_step_ms": t and t["step_s"] * 1e3,
                     # Weak scaling: what k GPUs add to one GPU's step (data parallelism's cost, in time).
                     "ours_added_ms": added_ms(ours, k), "torch_added_ms": added_ms(peers, k)})
    report["rows"] = rows
    report["torch_measured"] = "before and after accelbench, better kept" if args.torch_after else "before accelbench"
    save()

    def num(x, fmt):
        return format(x, fmt) if x is not None else "n/a"

    first = next(iter(peers.values()), {})
    lines = ["", f"{report['what']}" + (f", on {first['device']}; PyTorch {first['torch']} DDP ({first['model']}), "
                                         f"NCCL {first['nccl']}; PyTorch measured {report['torch_measured']}" if first else ""),
             "",
             "| GPUs | accelbench img/s | PyTorch DDP img/s | accelbench / PyTorch | accelbench scaling | PyTorch scaling "
             "| accelbench ms/step | PyTorch ms/step | accelbench ms added | PyTorch ms added |",
             "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        lines.append(f"| {r['gpus']} | {num(r['ours_img_per_s'], '.0f')} | {num(r['torch_img_per_s'], '.0f')} "
                     f"| {num(r['ratio'], '.3f')} | {pct(r['ours_scaling'])} | {pct(r['torch_scaling'])} "
                     f"| {num(r['ours_step_ms'], '.2f')} | {num(r['torch_step_ms'], '.2f')} "
                     f"| {num(r['ours_added_ms'], '+.2f')} | {num(r['torch_added_ms'], '+.2f')} |")
    lines += ["", "GPU 0 over each timed window (mean SM clock, mean power from the energy counter, share of readings "
                  "with the software power cap active, temperature):", ""]
    for k in worlds:
        o, t = ours.get(k), peers.get(k)
        lines.append(f"- {k} GPU(s): accelbench {gpu_text(o and o.get('gpu'))}; PyTorch {gpu_text(t and t.get('gpu'))}")
    for e in report["errors"]:
        lines.append(f"\nnote: {e.splitlines()[0] if e else e}")
    text = "\n".join(lines)
    print(text, flush=True)
    with open(os.path.join(args.out, "compare_ddp.md"), "w") as f:
        f.write(text.lstrip("\n") + "\n")


# ----------------------------------------------------------------------------------------------
# Rounds: scaling efficiency drifts between calls on GPUs that touch their power limit
# (bench/HISTORY.md) by as much as accelbench's and DDP's differ, so one round decides nothing.

ROUND_FIELDS = ("ours_scaling", "torch_scaling", "ours_added_ms", "torch_added_ms", "ratio")


def largest_world_row(folder):
    with open(os.path.join(folder, "compare_ddp.json")) as f:
        report = json.load(f)
    rows = [r for r in report.get("rows", []) if r.get("gpus", 0) > 1]
    return max(rows, key=lambda r: r["gpus"]) if rows else None


def rounds_table(folders):
    """Prints each round's scaling at its largest world size for both sides, what k GPUs added to one
    GPU's step, and the medians; returns the text and whether every round had both sides' figures."""
    lines = ["| round | GPUs | accelbench scaling | PyTorch DDP scaling | accelbench ms added | PyTorch ms added "
             "| accelbench / PyTorch |", "|---|---:|---:|---:|---:|---:|---:|"]
    seen, complete = [], True
    for folder in folders:
        name = os.path.basename(folder.rstrip("/"))
        try:
            row, why = largest_world_row(folder), "no multi-GPU row"
        except (OSError, ValueError) as e:
            row, why = None, str(e)
        if row is None or any(row.get(f) is None for f in ROUND_FIELDS):
            complete = False
            lines.append(f"| {name} | | incomplete: {why if row is None else 'a side has no figure'} | | | | |")
            continue
        seen.append(row)
        lines.append(f"| {name} | {row['gpus']} | {100 * row['ours_scaling']:.2f}% | {100 * row['torch_scaling']:.2f}% "
                     f"| {row['ours_added_ms']:+.2f} | {row['torch_added_ms']:+.2f} | {row['ratio']:.3f} |")
    if seen:
        med = {f: statistics.median(r[f] for r in seen) for f in ROUND_FIELDS}
        lines.append(f"| median of {len(seen)} | {seen[0]['gpus']} | {100 * med['ours_scaling']:.2f}% "
                     f"| {100 * med['torch_scaling']:.2f}% | {med['ours_added_ms']:+.2f} | {med['torch_added_ms']:+.2f} "
                     f"| {med['ratio']:.3f} |")
        ahead = sum(1 for r in seen if r["ours_scaling"] >= r["torch_scaling"])
        lines.append(f"\naccelbench's scaling at least DDP's in {ahead} of {len(seen)} rounds")
    return "\n".join(lines), complete and bool(seen)


def main():
    args = parse_args()
    if args.summarize:
        text, complete = rounds_table(args.summarize)
        print(text, flush=True)
        sys.exit(0 if complete else 1)
    if args.rounds <= 1:
        compare(args)
        return
    root, folders = args.out, []
    for r in range(1, args.rounds + 1):
        folders.append(os.path.join(root, f"round-{r}"))
        print(f"\n== round {r} of {args.rounds} ==", flush=True)
        compare(argparse.Namespace(**dict(vars(args), out=folders[-1])))
    text, complete = rounds_table(folders)
    print("\n" + text, flush=True)
    with open(os.path.join(root, "rounds.md"), "w") as f:
        f.write(text + "\n")
    sys.exit(0 if complete else 1)


if __name__ == "__main__":
    main()
