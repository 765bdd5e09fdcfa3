"""headroom-trace: any PyTorch model as Headroom graph JSON, traced without running it.

    from headroom.trace import trace
    graph = trace(model, [x, y], ["images", "targets"], loss=lambda out: F.cross_entropy(out, y))
    json.dump(graph, open("model.json", "w"))   # then: headroom estimate --model model.json

`trace` takes a model and inputs on the meta device (sources.on_meta builds modules there); `trace_model` takes a
live model wherever its parameters are, and traces it on fake copies of them, on their own device. See
recorder.py for how ops and saved tensors are read, and models/GRAPH_FORMAT.md for the format.
"""

import contextlib

import torch
from torch.utils._pytree import tree_flatten, tree_map

from .recorder import GraphRecorder, TraceError

if int(torch.__version__.split(".")[0]) >= 2:
    from torch._subclasses.fake_tensor import DataDependentOutputException, FakeTensor, FakeTensorMode
    from torch.utils._python_dispatch import TorchDispatchMode
else:  # PyTorch 1.13 traces on the meta device only
    DataDependentOutputException = FakeTensor = FakeTensorMode = None
    from torch.utils._python_dispatch import TorchDispatchMode

__all__ = ["trace", "trace_model", "TraceError"]


def trace(module, inputs, input_names=None, loss=None, call=None, name=None):
    """Runs `call(module, inputs)` (default: module(*inputs)) and then `loss(output)` under the recorder, and
    returns the graph as a JSON-ready dict. Without `loss` the graph is a forward (inference) graph."""
    for i, t in enumerate(inputs):
        if not isinstance(t, torch.Tensor) or t.device.type != "meta":
            raise TraceError(f"input {i}: inputs must be tensors on the meta device (torch.empty(..., device='meta'))")
    for pname, p in module.named_parameters():
        if p.device.type != "meta":
            raise TraceError(f"parameter {pname} is on {p.device}; build the model under headroom.trace.sources."
                             "on_meta() or move it with module.to('meta'), or trace it live with trace_model")
    names = input_names or [f"input{i}" for i in range(len(inputs))]
    recorder = GraphRecorder(module, name or type(module).__name__)
    for t, input_name in zip(inputs, names):
        recorder.add_input(t, input_name)
    run = call or (lambda m, xs: m(*xs))
    with _fake_tensors(), _autocast_accepts_meta(), _repeat_interleave_on_meta():
        return _record_step(recorder, lambda: run(module, inputs), loss)


def trace_model(module, args=(), kwargs=None, loss=None, name=None):
    """Traces `module(*args, **kwargs)` and `loss(output)` for a live model, without running it and without
    touching its parameters, its gradients or the random number generators: parameters, buffers and inputs are
    replaced by fake tensors (torch._subclasses.fake_tensor) on their own devices, through
    torch.func.functional_call, so every op dispatches as it will on that device (a CPU takes its flash attention
    kernel, where the meta device takes the math path) and nothing is allocated or computed. Inputs are named by
    keyword, positional ones "input0", "input1", ... Needs PyTorch 2.x."""
    if int(torch.__version__.split(".")[0]) < 2:
        raise TraceError(f"tracing a live model needs PyTorch 2.x fake tensors; this is {torch.__version__}")
    kwargs = dict(kwargs or {})
    mode = FakeTensorMode(allow_non_fake_inputs=True)

    def fake(t):
        return mode.from_tensor(t, static_shapes=True) if isinstance(t, torch.Tensor) else t

    parameters = {n: fake(p) for n, p in module.named_parameters()}
    buffers = {n: fake(b) for n, b in module.named_buffers()}
    fake_args, fake_kwargs = tree_map(fake, tuple(args)), tree_map(fake, kwargs)
    recorder = GraphRecorder(module, name or type(module).__name__, parameters, buffers)
    named = [(f"input{i}", a) for i, a in enumerate(fake_args)] + list(fake_kwargs.items())
    for input_name, value in named:
        for j, t in enumerate(t for t in tree_flatten(value)[0] if isinstance(t, torch.Tensor)):
            recorder.add_input(t, input_name if j == 0 else f"{input_name}.{j}")

    def run():
        return torch.func.functional_call(module, {**parameters, **buffers}, fake_args, fake_kwargs)

    with _FakeUnlessRead(mode):
        return _record_step(recorder, run, loss)


class _FakeUnlessRead(TorchDispatchMode):
    """Runs the step on fake tensors, except the ops that read no fake tensor, draw no random numbers and make at
    most `limit` bytes: those run for real. They are what a model computes from its inputs alone (position ids,
    the checks transformers 5 makes on them before it skips a causal mask or repeats grouped keys), and with real
    values those checks take the branch the real step takes; on fake tensors they would take the one for tracing,
    a different program (a materialized mask, repeated keys and values)."""

    def __init__(self, fake_mode, limit=1 << 20):
        super().__init__()
        self.fake_mode = fake_mode
        self.limit = limit

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        flat = tree_flatten((args, kwargs))[0]
        if any(isinstance(t, FakeTensor) for t in flat) or torch.Tag.nondeterministic_seeded in func.tags:
            with self.fake_mode:
                return func(*args, **kwargs)
        try:
            with self.fake_mode:
                probe = func(*args, **kwargs)  # costs nothing, and tells the result's size
        except DataDependentOutputException:  # .item() and the like: a value, which only the real op knows
            return func(*args, **kwargs)
        made = sum(t.untyped_storage().nbytes() for t in tree_flatten(probe)[0] if isinstance(t, torch.Tensor))
        return probe if made > self.limit else func(*args, **kwargs)


def _record_step(recorder, run, loss):
    """`run()` and then `loss(output)` under the recorder; the module's hooks are removed whatever happens."""
    try:
        with recorder:
            output = run()
            if loss is not None:
                recorder.phase = "loss"
                value = loss(output)
                if not isinstance(value, torch.Tensor) or value.numel() != 1:
                    raise TraceError("the loss must return a one-element tensor")
                if value.grad_fn is None:
                    raise TraceError("the loss does not depend on any trainable parameter (no autograd graph)")
                recorder.mark_loss(value, output)
        return recorder.finish()
    finally:
        recorder.remove_hooks()  # the user's module is left as it was, whatever happened


def _fake_tensors():
    """On PyTorch 2.x the step runs under fake tensors over the meta device: libraries skip their data-dependent
    checks for fake tensors (transformers 5 looks at a mask's values and at packed position ids unless it is
    tracing), where a plain meta tensor fails, having no values. The recorder sits above the fake mode and sees
    every op first. PyTorch 1.13's fake tensors are too young; its meta tensors run as they are."""
    if int(torch.__version__.split(".")[0]) < 2:
        return contextlib.nullcontext()
    from torch._subclasses.fake_tensor import FakeTensorMode
    return FakeTensorMode(allow_non_fake_inputs=True)


@contextlib.contextmanager
def _autocast_accepts_meta():
    """Modules that open `torch.autocast(device_type=x.device.type, enabled=False)` (transformers' rotary
    embeddings) would pass "meta", which autocast rejects; it gets "cpu", whose autocast never touches meta
    tensors."""
    autocast = torch.autocast
    original = autocast.__init__

    def init(self, device_type, *args, **kwargs):
        original(self, "cpu" if device_type == "meta" else device_type, *args, **kwargs)

    autocast.__init__ = init
    try:
        yield
    finally:
        autocast.__init__ = original


@contextlib.contextmanager
def _repeat_interleave_on_meta():
    """torch.repeat_interleave(x, n, dim) with an int n makes a tensor of counts and asks it for the output's size,
    which a meta tensor cannot tell (GPT-J's rotary tables); the size follows from n, so it is passed along."""
    original = torch.repeat_interleave

    def repeat_interleave(input, repeats=None, dim=None, *, output_size=None):
        if repeats is None:
            return original(input, output_size=output_size)
        if isinstance(repeats, int) and output_size is None and input.device.type == "meta":
            output_size = (input.numel() if dim is None else input.shape[dim]) * repeats
        return original(input, repeats, dim, output_size=output_size)

    torch.repeat_interleave = repeat_interleave
    try:
        yield
    finally:
        torch.repeat_interleave = original
