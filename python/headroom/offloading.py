"""A plan's offloads, carried out by saved-tensor hooks around the model's forward.

What the planner realized (Note [Offload through saved-tensor hooks] in planner/selective_checkpoint.h): each
offloaded storage is copied to host memory when autograd saves it, outside the checkpointed blocks, and its device
storage goes when the forward lets it go; it comes back when backward first unpacks another named storage (the
plan's prefetch) or, failing that, itself. The host copy is released once the tensor is back.

Which storage autograd is saving is read from the trace the plan was made from: the forward runs under a dispatch
mode that follows the traced ops one by one and names every storage an op makes by its graph tensor, and a model
whose ops differ from the trace is refused by name (PlanMismatch), as the checkpointed blocks are.

Host memory: pinned memory on CUDA, copied on side streams. On a CPU (headroom.plan(emulate_host=True)) a mapping
of its own, outside PyTorch's allocator, so what PyTorch allocates is what a GPU would hold; the copies save no
memory there, they only let a CPU measure a GPU's plan.
"""
import mmap

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

from .applying import PlanMismatch
from .trace.recorder import op_kind

# Ops whose count differs between a trace and a run: autograd detaches what it saves its own way under hooks, and
# metadata queries (prim) are not recorded.
_UNCOUNTED = {"detach"}


class Offloads:
    """The plan's offloads for one model: the storages by graph tensor id, and the traced forward they are
    recognized by."""

    def __init__(self, graph, offloads):
        tensors = graph["tensors"]
        self.ops = []  # (kind, base tensor id of each output or None for a view)
        for op in graph["ops"]:
            if op["kind"] in _UNCOUNTED:
                continue
            bases = [None if "view_of" in tensors[t] else t for t in op["outputs"]]
            self.ops.append((op["kind"], bases))
        self.names = {o["tensor"]: o["name"] for o in offloads}
        self.prefetch_on = {}  # storage id -> the offloaded ids its first unpack brings back
        for o in offloads:
            if o["prefetch_on_unpack_of"] is not None:
                self.prefetch_on.setdefault(o["prefetch_on_unpack_of"], []).append(o["tensor"])
        self.host_peak_bytes = 0  # the most host memory held at once, over every step run so far

    def __bool__(self):
        return bool(self.names)

    def step(self, module_path):
        """The state of one forward and its backward."""
        return _Step(self, module_path)


class _Step:
    def __init__(self, offloads, module_path):
        self.plan = offloads
        self.module_path = module_path
        self.tracker = _StorageTracker(offloads.ops, module_path)
        self.copies = {}  # storage id -> _HostCopy
        self.unpacked = set()  # storage ids backward has unpacked
        self.host_bytes = 0
        self.streams = None

    def hooks(self):
        return torch.autograd.graph.saved_tensors_hooks(self.pack, self.unpack)

    def pack(self, t):
        storage = t.untyped_storage()
        base = self.tracker.base_of_pointer.get(storage.data_ptr()) if storage.nbytes() else None
        if base is None:
            return t
        if base in self.plan.names:
            copy = self.copies.get(base)
            if copy is None:
                self.tracker.paused = True  # the copy's own ops are not the model's
                try:
                    copy = self.copies[base] = _HostCopy(self, base, storage)
                finally:
                    self.tracker.paused = False
            copy.packs += 1
            return _Packed(self, base, t.dtype, t.storage_offset(), t.size(), t.stride())
        if base in self.plan.prefetch_on:
            return _Watched(self, base, t)
        return t

    def unpack(self, packed):
        if isinstance(packed, torch.Tensor):
            return packed
        self._first_unpack_of(packed.base)
        return packed.value()

    def _first_unpack_of(self, base):
        if base in self.unpacked:
            return
        self.unpacked.add(base)
        for other in self.plan.prefetch_on.get(base, ()):
            if other in self.copies:
                self.copies[other].load()

    def finish(self):
        """After the forward: every planned offload must have been saved, or the model ran another program."""
        missing = [self.plan.names[t] for t in self.plan.names if t not in self.copies]
        if missing:
            raise PlanMismatch(f"{self.module_path or 'the model'}: autograd never saved {', '.join(missing[:3])}, "
                               "which the plan offloads; make the plan again with headroom.plan")

    def held(self, nbytes):
        self.host_bytes += nbytes
        self.plan.host_peak_bytes = max(self.plan.host_peak_bytes, self.host_bytes)

    def copy_streams(self, device):
        if self.streams is None:
            self.streams = (torch.cuda.Stream(device), torch.cuda.Stream(device))  # device-to-host, host-to-device
        return self.streams


class _Packed:
    """One saved view of an offloaded storage."""

    def __init__(self, step, base, dtype, offset, size, stride):
        self.step, self.base = step, base
        self.dtype, self.offset, self.size, self.stride = dtype, offset, size, stride

    def value(self):
        copy = self.step.copies[self.base]
        storage = copy.take()
        return torch.empty(0, dtype=self.dtype, device=copy.device).set_(storage, self.offset, self.size, self.stride)


class _Watched:
    """A saved tensor kept as autograd would keep it, whose first unpack issues the plan's prefetches."""

    def __init__(self, step, base, t):
        self.step, self.base, self.t = step, base, t

    def value(self):
        t, self.t = self.t, None
        return t


class _HostCopy:
    """An offloaded storage: its host copy until it is back, then its device copy until its last unpack."""

    def __init__(self, step, base, storage):
        self.step, self.base, self.device = step, base, storage.device
        self.nbytes = storage.nbytes()
        self.packs = 0
        self.loaded = None
        source = torch.empty(0, dtype=torch.uint8, device=self.device).set_(storage)
        if self.device.type == "cuda":
            self.host = torch.empty(self.nbytes, dtype=torch.uint8, pin_memory=True)
            out_stream = step.copy_streams(self.device)[0]
            out_stream.wait_stream(torch.cuda.current_stream(self.device))
            with torch.cuda.stream(out_stream):
                self.host.copy_(source, non_blocking=True)
            source.record_stream(out_stream)  # the storage is not reused before the copy has read it
            self.copied_out = out_stream.record_event()
        else:
            self.mapping = mmap.mmap(-1, self.nbytes)  # outside PyTorch's allocator: host, not device, memory
            self.host = torch.frombuffer(self.mapping, dtype=torch.uint8)
            self.host.copy_(source)
        step.held(self.nbytes)

    def load(self):
        """Issues the copy back (the plan's prefetch); the host copy is released."""
        if self.loaded is not None:
            return
        if self.host is None:
            raise RuntimeError(f"headroom: {self.step.plan.names[self.base]} was unpacked again after its last use; "
                               "an offloading plan runs one backward per forward (no retain_graph)")
        device_copy = torch.empty(self.nbytes, dtype=torch.uint8, device=self.device)
        if self.device.type == "cuda":
            in_stream = self.step.copy_streams(self.device)[1]
            in_stream.wait_event(self.copied_out)
            in_stream.wait_stream(torch.cuda.current_stream(self.device))  # the device copy's memory is free
            with torch.cuda.stream(in_stream):
                device_copy.copy_(self.host, non_blocking=True)
            self.copied_in = in_stream.record_event()
            device_copy.record_stream(in_stream)
            self.loaded = device_copy.untyped_storage()
            self.host_in_flight = self.host  # released when the copy is waited for
        else:
            device_copy.copy_(self.host)
            self.loaded = device_copy.untyped_storage()
            del device_copy
            self.mapping = None
        self.host = None
        self.step.host_bytes -= self.nbytes

    def take(self):
        """The device storage for one unpack; the last unpack lets it go with autograd's use of it."""
        self.load()
        if self.device.type == "cuda" and getattr(self, "host_in_flight", None) is not None:
            torch.cuda.current_stream(self.device).wait_event(self.copied_in)
            self.host_in_flight = None
        storage = self.loaded
        self.packs -= 1
        if self.packs == 0:
            self.loaded = None
        return storage


class _StorageTracker(TorchDispatchMode):
    """Follows the traced forward op by op, naming each storage an op makes by its graph tensor."""

    def __init__(self, ops, module_path):
        super().__init__()
        self.ops = ops
        self.module_path = module_path
        self.position = 0
        self.base_of_pointer = {}
        self.paused = False

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if self.paused or func.namespace == "prim":
            return out
        kind = op_kind(func)
        if kind in _UNCOUNTED:
            return out
        i = self.position
        if i >= len(self.ops) or self.ops[i][0] != kind:
            expected = self.ops[i][0] if i < len(self.ops) else "nothing (the traced step ends there)"
            raise PlanMismatch(f"{self.module_path or 'the model'}: op {i} of the forward is aten.{kind}, but the "
                               f"plan was made for {expected}; the model runs other ops than it was traced with: "
                               "make the plan again with headroom.plan")
        self.position += 1
        outs = [o for o in tree_flatten(out)[0] if isinstance(o, torch.Tensor)]
        for t, base in zip(outs, self.ops[i][1]):
            if base is not None and t.untyped_storage().nbytes():
                self.base_of_pointer[t.untyped_storage().data_ptr()] = base
        return out
