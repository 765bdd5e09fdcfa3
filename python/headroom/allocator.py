"""Headroom's caching allocator inside PyTorch, through torch.cuda.memory.CUDAPluggableAllocator.

    headroom.use_allocator("headroom")               # before the first CUDA allocation
    headroom.use_allocator("headroom", conf="expandable_segments:True,layout_plan:/path/plan.json")
    ... train ...
    headroom.allocator_stats()["allocated_bytes_peak"]

PyTorch's own counters (torch.cuda.memory_allocated and friends) do not see a pluggable allocator; the library's
do (allocator/cuda/c_abi/headroom_alloc.h), and allocator_stats() reads them.
"""
import ctypes
import os

from . import _native

_STATS_VERSION = 4  # HEADROOM_STATS_VERSION of allocator/cuda/c_abi/headroom_alloc.h
_INT_FIELDS = ("allocated_bytes", "allocated_bytes_peak", "reserved_bytes", "reserved_bytes_peak", "active_bytes",
               "requested_bytes", "inactive_split_bytes", "allocations", "segments", "num_alloc_retries",
               "num_ooms", "num_device_alloc", "num_device_free")
_LATER_FIELDS = ("num_pages_mapped", "num_pages_unmapped", "num_stitched_blocks", "num_planned_allocs")


class _Stats(ctypes.Structure):
    _fields_ = ([("version", ctypes.c_uint32), ("struct_size", ctypes.c_uint32)]
                + [(n, ctypes.c_int64) for n in _INT_FIELDS]
                + [("largest_free_block_bytes", ctypes.c_uint64), ("external_fragmentation", ctypes.c_double)]
                + [(n, ctypes.c_int64) for n in _LATER_FIELDS])


_library = None


def use_allocator(name="headroom", conf=None):
    """Makes Headroom's allocator PyTorch's CUDA allocator, with the policy `conf` (HEADROOM_ALLOC_CONF's syntax:
    a preset such as "headroom", or PYTORCH_CUDA_ALLOC_CONF-style keys); must come before the first CUDA
    allocation, as PyTorch requires. name: "headroom" (the only allocator here), or "pytorch" to do nothing."""
    global _library
    if name == "pytorch":
        return
    if name != "headroom":
        raise ValueError(f"use_allocator: unknown allocator '{name}' (headroom or pytorch)")
    import torch
    path = _native.allocator_library()
    if conf is not None:
        os.environ["HEADROOM_ALLOC_CONF"] = conf  # read when the library makes its first allocator
    allocator = torch.cuda.memory.CUDAPluggableAllocator(path, "headroom_malloc", "headroom_free")
    torch.cuda.memory.change_current_allocator(allocator)
    _library = ctypes.CDLL(path)
    _library.headroom_last_error.restype = ctypes.c_char_p


def allocator_stats(device=None):
    """The allocator's statistics for `device` (default: the current one) as a dict of bytes and counts."""
    if _library is None:
        raise RuntimeError("allocator_stats: Headroom's allocator is not in use (call headroom.use_allocator first)")
    import torch
    stats = _Stats(version=_STATS_VERSION, struct_size=ctypes.sizeof(_Stats))
    device = torch.cuda.current_device() if device is None else device
    if _library.headroom_get_stats(device, ctypes.byref(stats)) != 0:
        raise RuntimeError(f"headroom_get_stats: {_library.headroom_last_error().decode()}")
    return {n: getattr(stats, n) for n, _ in _Stats._fields_ if n not in ("version", "struct_size")}
