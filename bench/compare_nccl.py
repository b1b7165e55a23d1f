#!/usr/bin/env python3
"""accelbench's all-reduce beside torch.distributed's on the same GPUs, in one run (1 MiB and 1 GiB targets).

accelbench runs one process per GPU under mpirun (the multi-process path; --graph adds CUDA-graph
mode, --single-process the one-process path over all visible GPUs). PyTorch runs one process per
GPU (mp.spawn, NCCL backend), all_reduce in place on float32, timed with CUDA events around
back-to-back calls after a warm-up: median over batches of the slowest rank's batch time, the way
accelbench's lock-step measurement counts. busbw = algbw * 2(n-1)/n for both (nccl-tests).
Targets: at 1 GiB accelbench's busbw within 2% of PyTorch's; at 1 MiB at least PyTorch's.
NVLink SHARP (multicast) stays off for every child: NCCL_NVLS_ENABLE=0,
TORCH_SYMM_MEM_DISABLE_MULTICAST=1, NVSHMEM_DISABLE_NVLS=1.
  usage: compare_nccl.py --accelbench build/cuda/src/cli/accelbench --out DIR [--mpirun mpirun]
"""
import argparse
import glob
import json
import os
import statistics
import subprocess
import tempfile

NO_MULTICAST = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1", "NVSHMEM_DISABLE_NVLS": "1"}
os.environ.update(NO_MULTICAST)
SIZES = [1 << 20, 1 << 22, 1 << 24, 1 << 26, 1 << 28, 1 << 30]  # 1 MiB .. 1 GiB by x4


def accelbench_points(cmd, out_dir):
    """Runs one accelbench command, returns its records."""
    proc = subprocess.run(cmd, capture_output=True, text=True, env=dict(os.environ))
    if proc.returncode != 0:
        raise SystemExit("failed (%d): %s\n%s\n%s" % (proc.returncode, " ".join(cmd), proc.stdout[-3000:], proc.stderr[-3000:]))
    runs = sorted(glob.glob(os.path.join(out_dir, "runs", "*", "points.jsonl")), key=os.path.getmtime)
    with open(runs[-1]) as f:
        return [json.loads(line) for line in f if line.strip()]


def busbw_by_size(points, **params):
    out = {}
    for p in points:
        if p["status"] != "ok" or any(p["params"].get(k) != v for k, v in params.items()):
            continue
        m = p["metrics"]
        out[p["params"]["bytes"]] = {"busbw_gbps": m["busbw_gbps"], "algbw_gbps": m["algbw_gbps"],
                                     "median_s": p["time"]["median_s"], "noise": p["time"]["rel_spread"],
                                     "rank_busbw_gbps": m.get("rank_busbw_gbps"), "devices": m.get("devices"),
                                     "nccl": p["context"]["devices"][-1]["versions"].get("nccl")}
    return out


def torch_worker(rank, world, port, sizes, queue):
    import torch
    import torch.distributed as dist
    torch.cuda.set_device(rank)
    os.environ.update({"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)})
    dist.init_process_group("nccl", rank=rank, world_size=world, device_id=torch.device("cuda", rank))
    if rank == 0:
        print("torch: %d ranks joined" % world, flush=True)
    results = {}
    for size in sizes:
        x = torch.ones(size // 4, dtype=torch.float32, device="cuda")
        for _ in range(5):
            dist.all_reduce(x)
        torch.cuda.synchronize()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(10):
            dist.all_reduce(x)
        end.record()
        end.synchronize()
        # Every rank must run the same number of calls, or the ranks' collectives stop matching and
        # hang: the batch length comes from the slowest rank's estimate, agreed on by all.
        estimate = torch.tensor([start.elapsed_time(end) / 1e3 / 10], device="cuda")
        dist.all_reduce(estimate, op=dist.ReduceOp.MAX)
        iters = max(1, min(1000, int(0.01 / max(estimate.item(), 1e-9))))  # ~10 ms batches, like accelbench's 5 ms+
        times = []
        for _ in range(30):
            dist.barrier(device_ids=[rank])
            torch.cuda.synchronize()
            start.record()
            for _ in range(iters):
                dist.all_reduce(x)
            end.record()
            end.synchronize()
            t = torch.tensor([start.elapsed_time(end) / 1e3 / iters], device="cuda")
            dist.all_reduce(t, op=dist.ReduceOp.MAX)  # the slowest rank's batch, as accelbench's lock step
            times.append(t.item())
        t = statistics.median(times)
        algbw = size / t / 1e9
        results[size] = {"busbw_gbps": algbw * 2 * (world - 1) / world, "algbw_gbps": algbw, "median_s": t,
                         "iterations_per_batch": iters}
        if rank == 0:
            print("torch %12d B: busbw %8.1f GB/s" % (size, results[size]["busbw_gbps"]), flush=True)
    if rank == 0:
        queue.put({"results": results, "torch": torch.__version__, "nccl": ".".join(map(str, torch.cuda.nccl.version()))})
    dist.destroy_process_group()


def torch_allreduce(world, sizes):
    import socket
    import torch.multiprocessing as mp
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    mp.spawn(torch_worker, args=(world, port, sizes, queue), nprocs=world, join=True)
    return queue.get()


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--accelbench", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--mpirun", default="mpirun")
    ap.add_argument("--gpus", type=int, default=0, help="processes / GPUs (default: all visible)")
    ap.add_argument("--sizes", default="", help="comma-separated bytes (default: 1 MiB .. 1 GiB by x4)")
    ap.add_argument("--graph", action="store_true", help="also accelbench's CUDA-graph mode")
    ap.add_argument("--torch-only", action="store_true", help="PyTorch's figures only (no accelbench)")
    ap.add_argument("--single-process", action="store_true", help="also accelbench's one-process path")
    ap.add_argument("--torch-after", action="store_true", help="measure PyTorch again after accelbench, keep its best")
    ap.add_argument("--min-time", type=float, default=0.3, help="accelbench --min-time per point")
    ap.add_argument("--point-timeout", type=float, default=20, help="accelbench --timeout per point")
    args = ap.parse_args()
    global SIZES
    if args.sizes:
        SIZES = [int(s) for s in args.sizes.split(",")]
    import torch
    world = args.gpus or torch.cuda.device_count()
    if world < 2:
        raise SystemExit("compare_nccl.py needs at least 2 GPUs; %d visible" % world)
    os.makedirs(args.out, exist_ok=True)
    sizes = ",".join(str(s) for s in SIZES)
    axes = ["--axis", "op=all_reduce", "--axis", "dtype=f32", "--axis", "bytes=" + sizes, "--axis", "in_place=1"]
    exports = sum([["-x", k] for k in NO_MULTICAST], [])

    # No GPU counters: the comparison needs none, and a non-zero rank's NVML sampling once corrupted
    # its heap under mpirun (bench/HISTORY.md).
    measure = ["--min-time", str(args.min_time), "--timeout", str(args.point_timeout), "--no-gpu-telemetry"]

    def show(label, table):
        for s in SIZES:
            if s in table:
                ratio = ""
                if label != "torch" and s in torch_before["results"]:
                    ratio = "  %.1f%% of torch" % (100 * table[s]["busbw_gbps"] / torch_before["results"][s]["busbw_gbps"])
                print("%-22s %12d B: busbw %8.1f GB/s%s" % (label, s, table[s]["busbw_gbps"], ratio), flush=True)

    # Every figure is printed as soon as it is measured, so a time limit keeps what was measured.
    torch_before = torch_allreduce(world, SIZES)
    if args.torch_only:
        with open(os.path.join(args.out, "compare_nccl_torch.json"), "w") as f:
            json.dump(torch_before, f, indent=2, default=str)
        return
    modes = "graph=off,on" if args.graph else "graph=off"
    with tempfile.TemporaryDirectory() as mpi_dir:
        mpi_points = accelbench_points([args.mpirun, "-np", str(world), "--allow-run-as-root", "--bind-to", "none",
                                        *exports, args.accelbench, "run", "collectives", *axes, "--axis", modes,
                                        *measure, "--out", mpi_dir, "-q"], mpi_dir)
    mpi = busbw_by_size(mpi_points, graph="off")
    mpi_graph = busbw_by_size(mpi_points, graph="on")
    show("accelbench mpirun", mpi)
    show("accelbench mpirun graph", mpi_graph)
    single = {}
    if args.single_process:
        with tempfile.TemporaryDirectory() as one_dir:
            one_points = accelbench_points([args.accelbench, "run", "collectives", *axes, "--axis", "gpus=%d" % world,
                                            *measure, "--out", one_dir, "-q"], one_dir)
        single = busbw_by_size(one_points)
        show("accelbench 1 process", single)
    torch_runs = [torch_before]
    if args.torch_after:
        torch_runs.append(torch_allreduce(world, SIZES))
        show("torch (after)", torch_runs[-1]["results"])
    torch_after = torch_runs[-1]
    # The peer's better figure of its runs: drift favours PyTorch, never accelbench.
    peer = {s: max((r["results"][s] for r in torch_runs), key=lambda r: r["busbw_gbps"]) for s in SIZES}

    def cell(table, s):
        return "%8.1f" % table[s]["busbw_gbps"] if s in table else "     n/a"

    print("all_reduce f32 in place, %d GPUs: bus bandwidth GB/s (busbw = algbw * 2(n-1)/n)" % world)
    print("%12s %10s %10s %10s %10s %10s" % ("bytes", "ab mpirun", "ab graph", "ab 1-proc", "torch", "ab/torch"))
    for s in SIZES:
        ratio = mpi[s]["busbw_gbps"] / peer[s]["busbw_gbps"] if s in mpi else float("nan")
        print("%12d %10s %10s %10s %10.1f %9.1f%%" % (s, cell(mpi, s), cell(mpi_graph, s), cell(single, s),
                                                      peer[s]["busbw_gbps"], 100 * ratio))
    big, small = SIZES[-1], SIZES[0]
    checks = {
        "1GiB_within_2pct": big in mpi and abs(mpi[big]["busbw_gbps"] / peer[big]["busbw_gbps"] - 1) <= 0.02,
        "1MiB_at_least_torch": small in mpi and mpi[small]["busbw_gbps"] >= peer[small]["busbw_gbps"],
    }
    print("targets: 1 GiB within 2%% of torch: %s; 1 MiB at least torch: %s" %
          ("PASS" if checks["1GiB_within_2pct"] else "FAIL", "PASS" if checks["1MiB_at_least_torch"] else "FAIL"))
    print("NCCL: accelbench %s, torch %s (torch %s)" % (next(iter(mpi.values()), {}).get("nccl"), torch_after["nccl"],
                                                         torch_after["torch"]))
    report = {"world": world, "sizes": SIZES, "accelbench_mpirun": mpi, "accelbench_mpirun_graph": mpi_graph,
              "accelbench_single_process": single, "torch": peer, "torch_runs": torch_runs,
              "checks": checks, "env": NO_MULTICAST}
    with open(os.path.join(args.out, "compare_nccl.json"), "w") as f:
        json.dump(report, f, indent=2, default=str)


if __name__ == "__main__":
    main()
