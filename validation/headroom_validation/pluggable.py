"""Headroom's allocator inside PyTorch, against PyTorch's own, on the same training steps (needs a GPU).

    python -m headroom_validation.pluggable --library build/allocator/cuda/c_abi/libheadroom_cuda_alloc.so \
        [--config gpt2-fp32-adamw ... | --config lstm] [--conf expandable_segments:True] \
        [--torch-conf expandable_segments:True] [--steps 3] [--jobs 4] [--json out.json]

Each configuration of configs.py (or `lstm`, the recurrent model of the allocator's traces) runs twice, each time
in a fresh process (an allocator must be chosen before the first CUDA allocation): once with PyTorch's caching
allocator (PYTORCH_CUDA_ALLOC_CONF from --torch-conf; unset, PyTorch's default), once with
libheadroom_cuda_alloc.so loaded through torch.cuda.memory.CUDAPluggableAllocator (policy from --conf, as
HEADROOM_ALLOC_CONF; unset, the library's default, Headroom's own policy). Both run the harness's workload
(workloads.by_name) for a warm-up step and --steps more, and report the peak allocated and reserved bytes:
torch.cuda.max_memory_allocated / max_memory_reserved for PyTorch, headroom_get_stats for Headroom (PyTorch's own
counters do not see a pluggable allocator). For Headroom it also reports the pages mapped and unmapped per step
after the first two (as bench/allocator_replay_bench counts a replay's), so a real GPU shows whether a steady loop
still maps pages. --jobs runs that many configurations at once, each in processes of its own; a process's peaks
are its own, whatever runs beside it.
"""
import argparse
import concurrent.futures
import ctypes
import json
import multiprocessing
import os
import sys

from . import configs, workloads

WARM_UP_STEPS = 2  # steps before the steady ones, as bench/allocator_replay_bench counts them


class HeadroomStats(ctypes.Structure):  # allocator/cuda/c_abi/headroom_alloc.h, HEADROOM_STATS_VERSION 3
    _fields_ = [("version", ctypes.c_uint32), ("struct_size", ctypes.c_uint32)] + [
        (name, ctypes.c_int64)
        for name in ("allocated_bytes", "allocated_bytes_peak", "reserved_bytes", "reserved_bytes_peak",
                     "active_bytes", "requested_bytes", "inactive_split_bytes", "allocations", "segments",
                     "num_alloc_retries", "num_ooms", "num_device_alloc", "num_device_free")
    ] + [("largest_free_block_bytes", ctypes.c_uint64), ("external_fragmentation", ctypes.c_double),
         ("num_pages_mapped", ctypes.c_int64), ("num_pages_unmapped", ctypes.c_int64),
         ("num_stitched_blocks", ctypes.c_int64)]


def _headroom_stats(lib, device):
    stats = HeadroomStats(version=3, struct_size=ctypes.sizeof(HeadroomStats))
    if lib.headroom_get_stats(device, ctypes.byref(stats)) != 0:
        lib.headroom_last_error.restype = ctypes.c_char_p
        raise RuntimeError(f"headroom_get_stats failed: {lib.headroom_last_error().decode()}")
    return stats


def _run(name, library, conf, torch_conf, steps, queue):
    try:
        if torch_conf and not library:
            os.environ["PYTORCH_CUDA_ALLOC_CONF"] = torch_conf  # read at torch's first CUDA allocation
        import torch

        if library:
            if conf:
                os.environ["HEADROOM_ALLOC_CONF"] = conf
            allocator = torch.cuda.memory.CUDAPluggableAllocator(library, "headroom_malloc", "headroom_free")
            torch.cuda.memory.change_current_allocator(allocator)
        device = torch.device("cuda")
        work = workloads.by_name(name, device)
        lib = ctypes.CDLL(library) if library else None
        warm = None
        for done in range(1, 2 + steps):
            work.step(lambda phase: None)
            if lib and done == WARM_UP_STEPS:
                torch.cuda.synchronize()
                warm = _headroom_stats(lib, torch.cuda.current_device())
        torch.cuda.synchronize()
        if lib:
            stats = _headroom_stats(lib, torch.cuda.current_device())
            result = {"allocated_peak": stats.allocated_bytes_peak, "reserved_peak": stats.reserved_bytes_peak,
                      "retries": stats.num_alloc_retries, "pages_mapped": stats.num_pages_mapped,
                      "pages_unmapped": stats.num_pages_unmapped, "stitched": stats.num_stitched_blocks}
            steady = 1 + steps - WARM_UP_STEPS
            if warm is not None and steady > 0:
                result["steady_maps_per_step"] = (stats.num_pages_mapped - warm.num_pages_mapped) / steady
                result["steady_unmaps_per_step"] = (stats.num_pages_unmapped - warm.num_pages_unmapped) / steady
        else:
            result = {"allocated_peak": torch.cuda.max_memory_allocated(),
                      "reserved_peak": torch.cuda.max_memory_reserved(),
                      "retries": torch.cuda.memory_stats().get("num_alloc_retries", 0)}
        queue.put({"ok": True, **result})
    except Exception as e:  # reported by the parent, with the configuration's name
        queue.put({"ok": False, "error": f"{type(e).__name__}: {e}"})


def _measure(name, library, conf, torch_conf, steps):
    ctx = multiprocessing.get_context("spawn")
    queue = ctx.Queue()
    process = ctx.Process(target=_run, args=(name, library, conf, torch_conf, steps, queue))
    process.start()
    process.join()
    if queue.empty():
        return {"ok": False, "error": f"the process exited with {process.exitcode} before reporting"}
    return queue.get()


def _compare(name, args):
    return {"config": name, "conf": args.conf, "torch_conf": args.torch_conf,
            "torch": _measure(name, None, "", args.torch_conf, args.steps),
            "headroom": _measure(name, args.library, args.conf, "", args.steps)}


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--library", required=True, help="path to libheadroom_cuda_alloc.so")
    parser.add_argument("--config", action="append", help="a configuration of configs.py, or lstm (repeatable)")
    parser.add_argument("--conf", default="",
                        help="HEADROOM_ALLOC_CONF for Headroom's run (default: the library's, the headroom preset)")
    parser.add_argument("--torch-conf", default="",
                        help="PYTORCH_CUDA_ALLOC_CONF for PyTorch's run (default: unset, PyTorch's default policy)")
    parser.add_argument("--steps", type=int, default=3, help="steps after the warm-up step (at least 1)")
    parser.add_argument("--jobs", type=int, default=1, help="configurations run at once")
    parser.add_argument("--json", help="write the results here")
    args = parser.parse_args(argv)
    if not os.path.isfile(args.library):
        parser.error(f"--library {args.library}: no such file")
    if args.steps < 1:
        parser.error(f"--steps {args.steps}: at least 1")
    if args.jobs < 1:
        parser.error(f"--jobs {args.jobs}: at least 1")
    names = args.config or [c["name"] for c in configs.CONFIGS if "cuda" in c["devices"]][:6]
    for name in names:
        try:
            workloads.check_name(name)  # an unknown name fails before anything runs
        except ValueError as e:
            parser.error(f"--config {e}")
    with concurrent.futures.ThreadPoolExecutor(max_workers=args.jobs) as pool:
        rows = list(pool.map(lambda name: _compare(name, args), names))
    torch_label = f"torch ({args.torch_conf})" if args.torch_conf else "torch reserved"
    print(f"{'configuration':32} {torch_label:>22} {'headroom reserved':>18} {'ratio':>7} {'maps/step':>10}")
    for row in rows:
        torch_run, headroom_run = row["torch"], row["headroom"]
        if torch_run["ok"] and headroom_run["ok"]:
            ratio = headroom_run["reserved_peak"] / torch_run["reserved_peak"]
            maps = headroom_run.get("steady_maps_per_step")
            print(f"{row['config']:32} {torch_run['reserved_peak'] / 2**20:18.1f} MiB"
                  f" {headroom_run['reserved_peak'] / 2**20:14.1f} MiB {ratio:7.3f}"
                  f" {'' if maps is None else f'{maps:10.1f}'}")
        else:
            print(f"{row['config']:32} failed: {torch_run.get('error') or headroom_run.get('error')}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=2)
    return 0 if all(r["torch"]["ok"] and r["headroom"]["ok"] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
