"""Headroom's allocator inside PyTorch, against PyTorch's own, on the same training steps (needs a GPU).

    python -m headroom_validation.pluggable --library build/allocator/cuda/c_abi/libheadroom_cuda_alloc.so \
        [--config gpt2-fp32-adamw ...] [--conf expandable_segments:True] [--steps 3] [--json out.json]

Each configuration of configs.py runs twice, each time in a fresh process (an allocator must be chosen before
the first CUDA allocation): once with PyTorch's caching allocator, once with libheadroom_cuda_alloc.so loaded
through torch.cuda.memory.CUDAPluggableAllocator (policy from --conf, as HEADROOM_ALLOC_CONF; unset, the
library's default, Headroom's own policy). Both run the harness's workload (workloads.build) for a warm-up step
and --steps more, and report the peak allocated and reserved bytes: torch.cuda.max_memory_allocated / max_memory_reserved for PyTorch, headroom_get_stats for
Headroom (PyTorch's own counters do not see a pluggable allocator).
"""
import argparse
import ctypes
import json
import multiprocessing
import os
import sys

from . import configs


class HeadroomStats(ctypes.Structure):  # allocator/cuda/c_abi/headroom_alloc.h, HEADROOM_STATS_VERSION 1
    _fields_ = [("version", ctypes.c_uint32), ("struct_size", ctypes.c_uint32)] + [
        (name, ctypes.c_int64)
        for name in ("allocated_bytes", "allocated_bytes_peak", "reserved_bytes", "reserved_bytes_peak",
                     "active_bytes", "requested_bytes", "inactive_split_bytes", "allocations", "segments",
                     "num_alloc_retries", "num_ooms", "num_device_alloc", "num_device_free")
    ] + [("largest_free_block_bytes", ctypes.c_uint64), ("external_fragmentation", ctypes.c_double)]


def _run(name, library, conf, steps, queue):
    try:
        import torch

        from . import workloads

        if library:
            if conf:
                os.environ["HEADROOM_ALLOC_CONF"] = conf
            allocator = torch.cuda.memory.CUDAPluggableAllocator(library, "headroom_malloc", "headroom_free")
            torch.cuda.memory.change_current_allocator(allocator)
        device = torch.device("cuda")
        work = workloads.build(configs.by_name(name), device)
        for _ in range(1 + steps):
            work.step(lambda phase: None)
        torch.cuda.synchronize()
        if library:
            lib = ctypes.CDLL(library)
            stats = HeadroomStats(version=1, struct_size=ctypes.sizeof(HeadroomStats))
            if lib.headroom_get_stats(torch.cuda.current_device(), ctypes.byref(stats)) != 0:
                raise RuntimeError("headroom_get_stats failed")
            result = {"allocated_peak": stats.allocated_bytes_peak, "reserved_peak": stats.reserved_bytes_peak,
                      "retries": stats.num_alloc_retries}
        else:
            result = {"allocated_peak": torch.cuda.max_memory_allocated(),
                      "reserved_peak": torch.cuda.max_memory_reserved(),
                      "retries": torch.cuda.memory_stats().get("num_alloc_retries", 0)}
        queue.put({"ok": True, **result})
    except Exception as e:  # reported by the parent, with the configuration's name
        queue.put({"ok": False, "error": f"{type(e).__name__}: {e}"})


def _measure(name, library, conf, steps):
    ctx = multiprocessing.get_context("spawn")
    queue = ctx.Queue()
    process = ctx.Process(target=_run, args=(name, library, conf, steps, queue))
    process.start()
    process.join()
    if queue.empty():
        return {"ok": False, "error": f"the process exited with {process.exitcode} before reporting"}
    return queue.get()


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--library", required=True, help="path to libheadroom_cuda_alloc.so")
    parser.add_argument("--config", action="append", help="a configuration of configs.py (repeatable)")
    parser.add_argument("--conf", default="",
                        help="HEADROOM_ALLOC_CONF for Headroom's run (default: the library's, the headroom preset)")
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--json", help="write the results here")
    args = parser.parse_args(argv)
    if not os.path.isfile(args.library):
        parser.error(f"--library {args.library}: no such file")
    names = args.config or [c["name"] for c in configs.CONFIGS if "cuda" in c["devices"]][:6]
    for name in names:
        configs.by_name(name)  # an unknown name fails before anything runs
    rows = []
    print(f"{'configuration':40} {'torch reserved':>15} {'headroom reserved':>18} {'ratio':>7}")
    for name in names:
        torch_run = _measure(name, None, "", args.steps)
        headroom_run = _measure(name, args.library, args.conf, args.steps)
        rows.append({"config": name, "torch": torch_run, "headroom": headroom_run, "conf": args.conf})
        if torch_run["ok"] and headroom_run["ok"]:
            ratio = headroom_run["reserved_peak"] / torch_run["reserved_peak"]
            print(f"{name:40} {torch_run['reserved_peak'] / 2**20:12.1f} MiB {headroom_run['reserved_peak'] / 2**20:15.1f}"
                  f" MiB {ratio:7.3f}")
        else:
            print(f"{name:40} failed: {torch_run.get('error') or headroom_run.get('error')}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=2)
    return 0 if all(r["torch"]["ok"] and r["headroom"]["ok"] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
