"""Runs configurations and writes one fixture per configuration.

    python -m headroom_validation.record --out validation/fixtures [--device cpu|cuda] [NAME ...]

Each configuration runs in its own process (a fresh allocator, nothing left over from another model): a
warm-up step first, so optimizer state exists as in any later step, then the measured step. The fixture
records the live bytes before the step, their peak during it, the op and phase at the peak, the bytes at
the end of forward and those saved for backward, and the step's allocation trace (RMM CSV on CPU, a
PyTorch memory snapshot on CUDA; `headroom replay` reads both).
"""
import argparse
import concurrent.futures
import contextlib
import gc
import json
import os
import pathlib
import platform
import subprocess
import sys

import torch

from headroom_validation import configs, hook as hooks, peers, workloads

FIXTURE_VERSION = 1


def measure(cfg, device, trace_path):
    counters = hooks.CpuHook() if device.type == "cpu" else hooks.CudaCounters()
    if device.type == "cuda":
        torch.cuda.init()
        _, total = torch.cuda.mem_get_info()  # creates the context
        used_before, _ = driver_used(total)
    w = workloads.build(cfg, device)
    w.step(lambda phase: None)  # warm-up: optimizer state, lazily built caches
    gc.collect()
    reserved = [torch.cuda.memory_reserved()] if device.type == "cuda" else []  # after each step

    marker = hooks.OpMarker(counters)
    # PyTorch 1.13 fails a backward that runs non-reentrant checkpointing's saved-tensor hooks under a
    # dispatch mode, so checkpointed steps there are measured without naming the peak's op.
    name_ops = not (cfg.get("checkpoint", "none") == "full" and torch.__version__.startswith("1."))
    if not name_ops:
        w.notes.append("peak op not recorded: PyTorch 1.13 cannot run a dispatch mode under checkpointing")
    boundaries = {}

    def phase(name):
        boundaries[name] = counters.live()
        marker.phase = name

    baseline = counters.live()
    counters.reset_peak()
    with counters.log(trace_path), (marker if name_ops else contextlib.nullcontext()):
        out = w.step(phase)
        del out
    peak = counters.peak()
    if reserved:
        reserved.append(torch.cuda.memory_reserved())
    peak_mark = counters.peak_mark()
    end_of_forward = boundaries.get("backward", boundaries.get("done"))

    # Saved tensors are counted in a third step: PyTorch 1.13 fails a backward that runs under both a
    # dispatch mode and saved-tensor hooks. That step's peak must repeat the measured one.
    saved = hooks.SavedTensors()
    counters.reset_peak()
    out = w.step(saved.forward_phase())
    del out
    repeat_peak = counters.peak()
    if reserved:
        peak_reserved = torch.cuda.max_memory_reserved()
        reserved.append(torch.cuda.memory_reserved())
        # Three more steps show whether the allocator's cache has settled (it grows while a step still finds
        # no room in the segments earlier steps left).
        for _ in range(3):
            out = w.step(lambda phase: None)
            del out
            reserved.append(torch.cuda.memory_reserved())
    if counters.dropped():
        raise RuntimeError(f"the allocation hook's table overflowed ({counters.dropped()} blocks uncounted)")
    measured = {
        "baseline_bytes": baseline,
        "peak_allocated_bytes": peak,
        "end_of_forward_bytes": end_of_forward,
        "saved_for_backward_bytes": saved.bytes(),
        "repeat_peak_allocated_bytes": repeat_peak,
    }
    if name_ops:
        measured["ops"] = len(marker.ops)
    i = peak_mark
    if 0 <= i < len(marker.ops):
        measured["peak_op"], measured["peak_phase"] = marker.ops[i]
    if device.type == "cuda":
        measured["peak_reserved_bytes"] = peak_reserved  # over the measured step and the one after it
        measured["reserved_after_steps"] = reserved
        measured["driver_used_bytes"], how = driver_used(total)
        measured["driver_used_before_bytes"] = used_before
        w.notes.append(f"driver's view from {how}")
    if os.environ.get("HEADROOM_VALIDATION_OPS"):  # debugging: every op with the live bytes after it
        with open(os.environ["HEADROOM_VALIDATION_OPS"], "w") as f:
            for (op, ph), (live, events) in zip(marker.ops, marker.live_after):
                f.write(f"{ph}\t{op}\t{live}\t{events}\n")
    return w, measured


def driver_used(total):
    """The device memory this process holds as the driver sees it (nvidia-smi's figure): NVML's count for this
    process, so that configurations recorded side by side (--jobs) do not see each other; without NVML, the
    device's used memory (right only when nothing else runs)."""
    try:
        import pynvml
        pynvml.nvmlInit()
        handle = pynvml.nvmlDeviceGetHandleByIndex(torch.cuda.current_device())
        for process in pynvml.nvmlDeviceGetComputeRunningProcesses(handle):
            if process.pid == os.getpid() and process.usedGpuMemory:
                return int(process.usedGpuMemory), "NVML, this process"
    except Exception:  # no NVML, or no per-process figure in this container
        pass
    free, _ = torch.cuda.mem_get_info()
    return total - free, "cudaMemGetInfo, the whole device"


def versions():
    out = {"torch": torch.__version__, "python": platform.python_version()}
    for name in ("transformers", "peft", "torchvision"):
        try:
            out[name] = __import__(name).__version__
        except ImportError:
            pass
    return out


def cpu_description():
    """What decides the CPU kernels' workspaces: oneDNN picks its kernels by instruction set, and some of them
    take a buffer per thread."""
    flags = set()
    model = platform.processor()
    with open("/proc/cpuinfo") as f:
        for line in f:
            key, _, value = line.partition(":")
            if key.strip() == "flags":
                flags = set(value.split())
            elif key.strip() == "model name":
                model = value.strip()
    isa = next((name for name, flag in (("avx512", "avx512f"), ("avx2", "avx2"), ("sse4.1", "sse4_1"))
                if flag in flags), "other")
    return {"model": model, "isa": isa, "threads": torch.get_num_threads(),
            "onednn_max_cpu_isa": os.environ.get("ONEDNN_MAX_CPU_ISA")}


def run_one(name, device_name, out_dir):
    cfg = configs.by_name(name)
    device = torch.device(device_name)
    torch.set_num_threads(max(1, min(4, os.cpu_count() or 1)))
    traces = out_dir / "traces"
    traces.mkdir(parents=True, exist_ok=True)
    suffix = "rmm.csv" if device.type == "cpu" else "snapshot.json"
    trace = traces / f"{name}.{suffix}"
    w, measured = measure(cfg, device, trace)
    fixture = {
        "headroom_fixture_version": FIXTURE_VERSION,
        "name": name,
        "description": cfg["description"],
        "device": device.type if device.type == "cpu" else torch.cuda.get_device_name(device),
        "versions": versions(),
        **({"cpu": cpu_description()} if device.type == "cpu" else {}),
        "setup": {k: v for k, v in cfg.items() if k not in ("name", "description", "model")},
        "model": w.estimate_model,
        "estimate_args": configs.estimate_args(cfg, device.type, versions()),
        "measured": measured,
        "trace": f"traces/{trace.name}",
        "notes": w.notes,
        "parameters": sum(p.numel() for p in w.model.parameters()),
    }
    fixture["peers"] = peers.peer_estimates(fixture, fixture["parameters"])
    path = out_dir / f"{name}.json"
    path.write_text(json.dumps(fixture, indent=1, sort_keys=False) + "\n")
    print(f"{name}: peak {measured['peak_allocated_bytes']:,} B at {measured.get('peak_op', '?')} "
          f"({measured.get('peak_phase', '?')})", flush=True)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=pathlib.Path, required=True, help="fixture folder")
    parser.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    parser.add_argument("--jobs", type=int, default=1,
                        help="configurations recorded at once (each in its own process; on a GPU they share it)")
    parser.add_argument("--one", action="store_true", help=argparse.SUPPRESS)  # child process
    parser.add_argument("--rewrite-args", action="store_true",
                        help="rewrite the estimate_args and peers of the fixtures in --out; measure nothing")
    parser.add_argument("names", nargs="*", help="configurations (default: all that run on --device)")
    args = parser.parse_args(argv)
    if args.one:
        run_one(args.names[0], args.device, args.out)
        return 0
    if args.rewrite_args:
        for path in sorted(args.out.glob("*.json")):
            fixture = json.loads(path.read_text())
            device = "cpu" if fixture["device"] == "cpu" else "cuda"
            cfg = configs.by_name(fixture["name"])
            fixture["estimate_args"] = configs.estimate_args(cfg, device, fixture["versions"])
            if "parameters" not in fixture:
                fixture["parameters"] = sum(p.numel() for p in workloads.build(cfg, torch.device("cpu")).model.parameters())
            fixture["peers"] = peers.peer_estimates(fixture, fixture["parameters"])
            path.write_text(json.dumps(fixture, indent=1) + "\n")
        return 0
    names = args.names or [c["name"] for c in configs.CONFIGS if args.device in c["devices"]]
    unknown = [n for n in names if n not in {c["name"] for c in configs.CONFIGS}]
    if unknown:
        parser.error(f"unknown configuration(s): {', '.join(unknown)}")

    def record(name):
        # A configuration's environment (oneDNN's instruction set) must be set before PyTorch loads.
        env = dict(os.environ, **configs.by_name(name).get("env", {}))
        return subprocess.call([sys.executable, "-m", "headroom_validation.record", "--one", "--device",
                                args.device, "--out", str(args.out), name], env=env)

    with concurrent.futures.ThreadPoolExecutor(max(1, args.jobs)) as pool:
        failed = [name for name, rc in zip(names, pool.map(record, names)) if rc != 0]
    if failed:
        print(f"failed: {', '.join(failed)}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
