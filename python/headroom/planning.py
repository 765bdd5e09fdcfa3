"""headroom.plan: a live model's training step, planned by Headroom's planner as PyTorch will run it.

The step is traced on fake copies of the model's tensors, on their own device (headroom.trace.trace_model: nothing
is allocated, run or changed), written as Headroom graph JSON, and planned by the `headroom` executable with
`--runner torch-ops`, which keeps only what selective activation checkpointing around the model's blocks can
carry out and evaluates what that runs (Note [Plan runners] in planner/plan.h). The package drives the executable
rather than binding the C++ libraries: one build serves every Python and every PyTorch, and Python sees exactly
what `headroom plan` prints.
"""
import contextlib
import json
import os
import subprocess
import tempfile

import torch

from . import _native
from .applying import AppliedPlan, Region, applied, kv_cache_off
from .envelope import ShapeEnvelope, grown, map_tensors
from .offloading import Offloads
from .trace import trace_model
from .trace.recorder import block_of


class PlanError(RuntimeError):
    """Planning failed: no plan fits, or an argument is at fault; the message is Headroom's."""


def plan(model, example_batch, budget=None, gpu=None, loss_fn=None, strategy=None, optimizer="adamw",
         loop="hand", emulate_host=False, max_shapes=None):
    """Plans `model`'s training step on `example_batch` so that its activations fit.

    example_batch: a dict of keyword arguments (a Hugging Face batch), a tuple of positional ones, or one tensor.
    budget: bytes for activations and gradients ("60%" of the step without a plan, "2GiB", or an int), or
    gpu: a catalog GPU to fit the whole step on ("H100-80GB"), the model's states included.
    loss_fn: output -> scalar loss; default output.loss (Hugging Face, given labels) or the output itself.
    strategy: one of headroom plan's (default: the best plan that fits, hybrid first).
    optimizer: what the fixed state holds with gpu= (adamw, sgd, sgd-momentum, adam8bit, adafactor, lion).
    loop: "hand" when the training loop keeps the model's output through backward, "trainer" when it does not.
    emulate_host: on a CPU, plan offloads too, to host memory mapped apart from PyTorch's allocator, so that a CPU
    measures what a GPU would hold (the copies save nothing on a CPU). On CUDA offloads go to pinned host memory.
    max_shapes: the largest inputs the plan must run on, when they are larger than the example batch's (dynamic
    padding: the longest batch): {input name: shape or tensor}, a shape for a one-input model, or a list of
    batches. The plan is made for the step at the largest of each dimension (the example's values tiled to it)
    and runs on any input within that envelope; a larger input raises PlanMismatch (headroom/envelope.py).
    """
    if (budget is None) == (gpu is None):
        raise ValueError("headroom.plan: give budget= (bytes, '2GiB' or '60%') or gpu= (a catalog name)")
    if emulate_host and _device(model).type != "cpu":
        raise ValueError(f"headroom.plan: emulate_host is for a model on a CPU; this one is on {_device(model)}, "
                         "whose host memory is apart already")
    args, kwargs = _call_arguments(example_batch)
    envelope = ShapeEnvelope.of(model.forward, args, kwargs)
    if max_shapes is not None:
        envelope = envelope.covering(ShapeEnvelope.parse(model.forward, max_shapes))
        args, kwargs = _grown_to(model.forward, args, kwargs, envelope)
    with _without_kv_cache(model):
        graph = trace_model(model, args, kwargs, loss=_loss_of(loss_fn), name=type(model).__name__)
    flags = ["--runner", "torch-ops", "--json", "--optimizer", optimizer, "--loop", loop,
             "--precision", _precision(model), "--kernels", "cpu" if _device(model).type == "cpu" else "cuda",
             "--torch", ".".join(torch.__version__.split("+")[0].split(".")[:2])]
    if emulate_host:
        flags.append("--emulated-host")
    flags += ["--budget", str(budget)] if budget is not None else ["--gpu", gpu]
    if strategy:
        flags += ["--strategy", strategy]
    with tempfile.TemporaryDirectory() as folder:
        path, out = os.path.join(folder, "step.json"), os.path.join(folder, "plan.json")
        with open(path, "w") as f:
            json.dump(graph, f)
        result = subprocess.run([_native.executable(), "plan", "--model", path, "--out", out, *flags],
                                capture_output=True, text=True)
        if result.returncode != 0:
            message = result.stderr.strip().removeprefix("headroom plan: ")
            raise PlanError(message.replace(path, type(model).__name__))
        with open(out) as f:
            plan_file = json.load(f)
    plan_file.pop("tensors", None)  # every tensor's life, for executors; large, and the schedule says it all
    return Plan(type(model).__name__, graph, json.loads(result.stdout), plan_file, flags, envelope)


class Plan:
    """A plan and what it costs as PyTorch runs it.

    strategy, peak_bytes (activations, gradients and temporaries at the peak), host_bytes (the most host memory its
    offloads hold at once; host_peak_measured_bytes after it ran), budget_bytes, store_all_bytes
    (the same without a plan), states_bytes (weights, resident gradients, optimizer state), overhead (extra step
    time over the step without a plan, a fraction; from a GPU roofline), gap (overhead above the lower bound any
    replay plan needs, when one is known), regions (the checkpointed blocks), offloads (the offloaded tensors'
    names, by graph tensor id), envelope (the largest input shapes it runs on; the step was traced at them),
    report (headroom plan's JSON), plan_file (the schedule), graph (the traced step).
    """

    def __init__(self, name, graph, report, plan_file, flags, envelope):
        self.name = name
        self.graph = graph  # the traced step (Headroom graph JSON)
        self.report = report
        self.plan_file = plan_file  # the schedule, as `headroom plan --out` writes it (planner/plan_json.h)
        self.flags = flags  # the `headroom plan` flags it was made with
        self.envelope = envelope
        chosen = report["plans"][0]
        e = chosen["evaluation"]
        self.strategy = chosen["strategy"]
        self.detail = chosen["detail"]
        self.fits = chosen["fits"]
        self.peak_bytes = e["peak_bytes"]
        self.host_bytes = e["host_peak_bytes"]
        self.budget_bytes = report["budget_bytes"]
        self.store_all_bytes = report["store_all"]["peak_bytes"]
        states = report["fixed_bytes"]
        self.states_bytes = states["weights"] + states["gradients"] + states["optimizer_state"]
        self.overhead = (e["step_cost"] - e["base_cost"]) / e["base_cost"] if e["base_cost"] else 0.0
        bound = chosen.get("lower_bound_extra_cost")
        self.gap = (e["extra_cost"] - bound) / e["base_cost"] if bound is not None and e["base_cost"] else None
        modules = _block_modules(graph)
        self.regions = [Region(modules[r["layer"]], r["layer"], r["kinds"], r["policy"]) for r in chosen["regions"]]
        for region, r in zip(self.regions, chosen["regions"]):
            traced = [op["kind"] for op in graph["ops"][r["first_op"]:r["first_op"] + len(r["kinds"])]]
            if traced != r["kinds"]:
                raise PlanError(f"{region.module}: the plan's ops are not the traced ones (headroom executable "
                                "and package out of step?)")
        self._offloads = Offloads(graph, chosen.get("offloads", []))
        self.offloads = self._offloads.names
        self._applied = None

    @property
    def host_peak_measured_bytes(self):
        """The most host memory the offloads held at once over every step run under the plan so far."""
        return self._offloads.host_peak_bytes

    def applied(self, model):
        """`with plan.applied(model): ...` runs the model under the plan, and restores it after."""
        return applied(model, self.regions, self._offloads, self.envelope)

    def apply(self, model):
        """Applies the plan until remove()."""
        self.remove()
        self._applied = AppliedPlan(model, self.regions, self._offloads, self.envelope)
        return self

    def remove(self):
        if self._applied is not None:
            self._applied.remove()
            self._applied = None

    def __str__(self):
        gap = f", {100 * self.gap:+.1f}% above the lower bound" if self.gap is not None else ""
        blocks = ", ".join(r.module for r in self.regions) or "none"
        replayed = sum(1 for r in self.regions for s in r.save if not s)
        return (f"{self.name}: {self.strategy} plan, as PyTorch runs it ({self.detail})\n"
                f"  peak {_mib(self.peak_bytes)} of activations and gradients for a budget of "
                f"{_mib(self.budget_bytes)}{'' if self.fits else ' (does NOT fit)'}; without a plan "
                f"{_mib(self.store_all_bytes)}; weights and optimizer state {_mib(self.states_bytes)}\n"
                f"  step time {100 * self.overhead:+.1f}% over no plan (GPU roofline){gap}\n"
                f"  for inputs up to {self.envelope} (smaller ones run within the peak; larger ones are refused)\n"
                f"  checkpointed blocks: {blocks} ({replayed} ops replayed in backward)"
                + (f"\n  offloaded by saved-tensor hooks: {len(self.offloads)} tensors, "
                   f"{_mib(self.host_bytes)} of host memory at most" if self.offloads else ""))

    __repr__ = __str__


def _mib(n):
    return f"{n / 2**20:.2f} MiB"


def _block_modules(graph):
    """Layer index -> the block's module path, from the traced op names."""
    modules = {}
    for op in graph["ops"]:
        layer = op.get("layer", -1)
        if layer >= 0 and layer not in modules:
            modules[layer] = block_of(op["name"])
    return modules


def _call_arguments(batch):
    if isinstance(batch, dict):
        return (), dict(batch)
    if isinstance(batch, (tuple, list)):
        return tuple(batch), {}
    return (batch,), {}


def _grown_to(forward, args, kwargs, envelope):
    """The example batch with each tensor tiled to its envelope shape, for tracing the step at the envelope."""
    return map_tensors(forward, args, kwargs, lambda name, t: grown(t, envelope.shapes[name]))


def _loss_of(loss_fn):
    def loss(output):
        if loss_fn is not None:
            return loss_fn(output)
        if getattr(output, "loss", None) is not None:
            return output.loss
        if isinstance(output, torch.Tensor) and output.numel() == 1:
            return output
        raise PlanError("the model's output has no .loss and is not a scalar: pass loss_fn=")
    return loss


def _device(model):
    for p in model.parameters():
        return p.device
    return torch.device("cpu")


def _precision(model):
    dtypes = {p.dtype for p in model.parameters() if p.is_floating_point()}
    for dtype, name in ((torch.float32, "fp32"), (torch.bfloat16, "bf16"), (torch.float16, "fp16")):
        if dtypes == {dtype}:
            return name
    return "fp32"


@contextlib.contextmanager
def _without_kv_cache(model):
    """Traced as applied: without a key/value cache (applying.AppliedPlan turns it off)."""
    restore = kv_cache_off(model)
    try:
        yield
    finally:
        restore()
