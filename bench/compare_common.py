"""Helpers shared by the compare_*.py scripts: CUDA-event timing the way accelbench's batch mode
times, and running accelbench's CLI to read back the records of the run it made."""
import contextlib
import json
import os
import statistics
import subprocess
import tempfile
import threading
import time

import torch


def time_batches(fn, iters_per_batch, batches, warmup, warmup_s=0.0, window=None):
    """Median seconds per call over batches of back-to-back calls, timed with CUDA events, after
    `warmup` calls and then more until warmup_s seconds have passed (a GPU reaches the clocks and
    temperature of sustained load only after tens of seconds; accelbench's --warmup). window: a
    context manager held around the timed batches only (GpuWindow)."""
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    start = time.perf_counter()
    while time.perf_counter() - start < warmup_s:
        for _ in range(iters_per_batch):
            fn()
        torch.cuda.synchronize()
    times = []
    with window or contextlib.nullcontext():
        for _ in range(batches):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            for _ in range(iters_per_batch):
                fn()
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end) / 1e3 / iters_per_batch)
    return statistics.median(times)


def _new_runs(runs_dir, before):
    if not os.path.isdir(runs_dir):
        return []
    return [r for r in os.listdir(runs_dir) if r not in before and os.path.isdir(os.path.join(runs_dir, r))]


def accelbench(binary, args, out_dir, launcher=(), on_record=None, poll_s=1.0):
    """Runs `[LAUNCHER...] accelbench run ARGS --out OUT_DIR -q`; returns the records of the one run it added.

    launcher: a prefix such as `mpirun -np 2 ...` (under it rank 0 alone writes the run). on_record:
    called with each record as soon as accelbench has appended it to points.jsonl (it writes each
    point durably when measured), so a caller can print figures before a long run ends."""
    os.makedirs(out_dir, exist_ok=True)
    runs_dir = os.path.join(out_dir, "runs")
    before = set(os.listdir(runs_dir)) if os.path.isdir(runs_dir) else set()
    cmd = [*launcher, binary, "run", *args, "--out", out_dir, "-q"]
    if on_record is None:
        proc = subprocess.run(cmd, capture_output=True, text=True)
        code, stdout, stderr = proc.returncode, proc.stdout, proc.stderr
    else:
        # Output to files, not pipes: a full pipe would stall accelbench while this loop polls.
        with tempfile.TemporaryFile("w+") as out, tempfile.TemporaryFile("w+") as err:
            proc = subprocess.Popen(cmd, stdout=out, stderr=err, text=True)
            seen, offset, run = [], 0, None
            while True:
                done = proc.poll() is not None  # read once more after exit: the last records
                if run is None:
                    new = _new_runs(runs_dir, before)
                    run = new[0] if len(new) == 1 else None
                path = os.path.join(runs_dir, run, "points.jsonl") if run else None
                if path and os.path.exists(path):
                    with open(path, "rb") as f:
                        f.seek(offset)
                        chunk = f.read()
                    complete = chunk[:chunk.rfind(b"\n") + 1]  # a line still being written waits
                    offset += len(complete)
                    for line in complete.decode().splitlines():
                        if line.strip():
                            seen.append(json.loads(line))
                            on_record(seen[-1])
                if done:
                    break
                time.sleep(poll_s)
            code = proc.returncode
            out.seek(0)
            err.seek(0)
            stdout, stderr = out.read(), err.read()
    if code != 0:
        raise SystemExit(f"{' '.join(cmd)} failed ({code}):\n{stdout[-3000:]}\n{stderr[-3000:]}")
    new = _new_runs(runs_dir, before)
    if len(new) != 1:
        hint = " (under a launcher: was accelbench built without MPI, so every process ran alone?)" if launcher else ""
        raise SystemExit(f"expected one new run in {runs_dir}, found {new}{hint}")
    with open(os.path.join(runs_dir, new[0], "points.jsonl")) as f:
        return [json.loads(line) for line in f if line.strip()]


class GpuEnergy:
    """The GPU's cumulative energy counter (NVML's nvmlDeviceGetTotalEnergyConsumption, mJ), read
    through ctypes so no NVML Python package is needed; the device is found by its PCI bus id, so
    CUDA's and NVML's numbering may differ. The counter advances about every 100 ms on an H200, so
    windows of several seconds keep its step below a few percent."""

    def __init__(self, cuda_index=0):
        import ctypes
        self._nvml = ctypes.CDLL("libnvidia-ml.so.1")
        if self._nvml.nvmlInit_v2() != 0:
            raise RuntimeError("nvmlInit_v2 failed")
        p = torch.cuda.get_device_properties(cuda_index)
        bus = getattr(p, "pci_bus_id", None)
        domain = getattr(p, "pci_domain_id", 0)
        device = getattr(p, "pci_device_id", None)
        if bus is None or device is None:
            raise RuntimeError("this PyTorch does not report the GPU's PCI location")
        self._handle = ctypes.c_void_p()
        bus_id = f"{domain:08x}:{bus:02x}:{device:02x}.0".encode()
        if self._nvml.nvmlDeviceGetHandleByPciBusId_v2(bus_id, ctypes.byref(self._handle)) != 0:
            raise RuntimeError(f"NVML does not know {bus_id.decode()}")
        self._ctypes = ctypes

    def joules(self):
        mj = self._ctypes.c_ulonglong()
        if self._nvml.nvmlDeviceGetTotalEnergyConsumption(self._handle, self._ctypes.byref(mj)) != 0:
            raise RuntimeError("nvmlDeviceGetTotalEnergyConsumption failed")
        return mj.value / 1e3

    def sm_clock_mhz(self):
        v = self._ctypes.c_uint()
        return v.value if self._nvml.nvmlDeviceGetClockInfo(self._handle, 1, self._ctypes.byref(v)) == 0 else None  # NVML_CLOCK_SM

    def temperature_c(self):
        v = self._ctypes.c_uint()
        return v.value if self._nvml.nvmlDeviceGetTemperature(self._handle, 0, self._ctypes.byref(v)) == 0 else None  # NVML_TEMPERATURE_GPU

    def clocks_event_reasons(self):
        v = self._ctypes.c_ulonglong()
        return v.value if self._nvml.nvmlDeviceGetCurrentClocksEventReasons(self._handle, self._ctypes.byref(v)) == 0 else None


class GpuWindow:
    """What a GPU ran at over a timed window, as accelbench's telemetry records it: mean power from
    the energy counter, SM clock and the share of readings with the software power cap active
    (NVML clocks-event reason 0x4) sampled every period_s on a thread, the last temperature.
        with GpuWindow(cuda_index) as w: ...   then w.summary()"""

    def __init__(self, cuda_index=0, period_s=0.05):
        self._gpu, self._period_s = GpuEnergy(cuda_index), period_s
        self._clocks, self._capped, self._stop = [], 0, threading.Event()

    def _sample(self):
        while not self._stop.wait(self._period_s):
            clock, reasons = self._gpu.sm_clock_mhz(), self._gpu.clocks_event_reasons()
            if clock is not None:
                self._clocks.append(clock)
            if reasons is not None and reasons & 0x4:
                self._capped += 1

    def __enter__(self):
        self._e0, self._t0 = self._gpu.joules(), time.perf_counter()
        self._thread = threading.Thread(target=self._sample, daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join()
        self._e1, self._t1 = self._gpu.joules(), time.perf_counter()
        self._temperature = self._gpu.temperature_c()
        return False

    def summary(self):
        n = len(self._clocks)
        return {"mean_power_from_energy_w": (self._e1 - self._e0) / (self._t1 - self._t0),
                "mean_sm_clock_mhz": statistics.mean(self._clocks) if n else None,
                "sw_power_cap_fraction": self._capped / n if n else None, "temperature_c": self._temperature,
                "readings": n}


def samples_per_joule(fn, samples_per_call, min_s, energy):
    """Calls fn one at a time (synchronised after each, as the latency loop runs) for at least
    min_s seconds; samples per joule from the energy counter over that window."""
    torch.cuda.synchronize()
    e0, t0, calls = energy.joules(), time.perf_counter(), 0
    while time.perf_counter() - t0 < min_s:
        fn()
        torch.cuda.synchronize()
        calls += 1
    e1, t1 = energy.joules(), time.perf_counter()
    return calls * samples_per_call / (e1 - e0), (e1 - e0) / (t1 - t0)
