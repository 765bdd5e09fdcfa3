"""Measuring a step's allocations: the LD_PRELOAD hook on CPU, the caching allocator's counters on CUDA.

On CPU, validation/alloc_hook.c (preloaded by validation/record) counts every tensor storage PyTorch's CPU
allocator hands out; this module drives it through ctypes. An OpMarker dispatch mode numbers every ATen op
(forward, backward and optimizer alike) so that the peak can be named.
"""
import contextlib
import ctypes
import json

import torch
from torch.utils._python_dispatch import TorchDispatchMode


class CpuHook:
    """The preloaded hook's counters (bytes of live CPU tensor storage)."""

    def __init__(self):
        lib = ctypes.CDLL(None)
        if not hasattr(lib, "hr_start"):
            raise RuntimeError("the allocation hook is not loaded: run through validation/record "
                               "(it sets LD_PRELOAD=validation/build/libhr_alloc_hook.so)")
        for name in ("hr_live", "hr_peak", "hr_dropped", "hr_events"):
            getattr(lib, name).restype = ctypes.c_ulonglong
        lib.hr_peak_mark.restype = ctypes.c_longlong
        lib.hr_mark.argtypes = [ctypes.c_longlong]
        lib.hr_log_open.argtypes = [ctypes.c_char_p]
        self.lib = lib
        if not lib.hr_start():
            raise RuntimeError("the allocation hook could not allocate its table")

    def live(self):
        return self.lib.hr_live()

    def peak(self):
        return self.lib.hr_peak()

    def reset_peak(self):
        self.lib.hr_reset_peak()

    def mark(self, i):
        self.lib.hr_mark(i)

    def peak_mark(self):
        return self.lib.hr_peak_mark()

    def dropped(self):
        return self.lib.hr_dropped()

    def events(self):
        return self.lib.hr_events()

    @contextlib.contextmanager
    def log(self, path):
        if not self.lib.hr_log_open(str(path).encode()):
            raise RuntimeError(f"cannot write the allocation trace {path}")
        try:
            yield
        finally:
            self.lib.hr_log_close()


class CudaCounters:
    """torch.cuda's allocator statistics, with the same interface as CpuHook."""

    def __init__(self):
        self.seen_peak = 0  # the peak when the last op was marked
        self.raised_by = -1  # the op that last raised it
        self.last_mark = -1

    def live(self):
        torch.cuda.synchronize()
        return torch.cuda.memory_allocated()

    def peak(self):
        torch.cuda.synchronize()
        return torch.cuda.max_memory_allocated()

    def reset_peak(self):
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        self.seen_peak, self.raised_by = torch.cuda.max_memory_allocated(), -1

    def mark(self, i):
        # Called before op i runs: if the peak grew since op i-1 was marked, op i-1 raised it. The sync makes
        # the counters current (a CUDA op allocates when it is enqueued, so this is exact, only slow).
        peak = self.peak()
        if peak > self.seen_peak:
            self.seen_peak, self.raised_by = peak, i - 1
        self.last_mark = i

    def peak_mark(self):
        self.mark(self.last_mark + 1)  # the last op marked may have raised it
        return self.raised_by

    def dropped(self):
        return 0

    def events(self):
        return 0

    @contextlib.contextmanager
    def log(self, path):
        """The step's allocator history as a PyTorch memory snapshot in JSON (`headroom replay` reads it)."""
        # No stack traces (context=None): a replay needs only the actions, and frames would multiply the size.
        torch.cuda.memory._record_memory_history(enabled="all", context=None, max_entries=1000000)
        try:
            yield
        finally:
            snapshot = torch.cuda.memory._snapshot()
            torch.cuda.memory._record_memory_history(enabled=None)
            with open(path, "w") as f:
                json.dump(snapshot, f)


class OpMarker(TorchDispatchMode):
    """Numbers every ATen op and tells the hook which one runs, with the phase it belongs to."""

    def __init__(self, hook):
        super().__init__()
        self.hook = hook
        self.ops = []  # (op name, phase)
        self.live_after = []  # live bytes after each op
        self.phase = "forward"

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.hook.mark(len(self.ops))
        self.ops.append((func.overloadpacket.__name__, self.phase))
        out = func(*args, **(kwargs or {}))
        self.live_after.append((self.hook.live(), self.hook.events()))
        return out


class SavedTensors:
    """Bytes autograd saves for backward, by storage (a storage saved twice counts once)."""

    def __init__(self):
        self.storages = {}

    def pack(self, t):
        for plain in _plain_tensors(t):
            if plain.device.type != "meta":
                s = plain.storage()
                self.storages[s.data_ptr()] = s.nbytes()
        return t

    def hooks(self):
        return torch.autograd.graph.saved_tensors_hooks(self.pack, lambda t: t)

    def forward_phase(self):
        """A phase(name) callback for a step that counts what its forward saves: the hooks are on from the
        "forward" phase to the next one."""
        stack = contextlib.ExitStack()

        def phase(name):
            if name == "forward":
                stack.enter_context(self.hooks())
            else:
                stack.close()
        return phase

    def bytes(self):
        return sum(self.storages.values())


def _plain_tensors(t):
    """The tensors that hold t's bytes: t itself, or for a wrapper subclass (a DTensor, an asynchronous
    collective's result) the tensors inside it."""
    flatten = getattr(t, "__tensor_flatten__", None)
    if flatten is None:
        return [t]
    names, _ = flatten()
    inner = [getattr(t, name) for name in names]
    return [p for i in inner if isinstance(i, torch.Tensor) for p in _plain_tensors(i)]
