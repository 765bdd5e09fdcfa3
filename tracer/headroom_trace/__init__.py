"""headroom-trace: any PyTorch model as Headroom graph JSON, traced on the meta device.

    from headroom_trace import trace
    graph = trace(model, [x, y], ["images", "targets"], loss=lambda out: F.cross_entropy(out, y))
    json.dump(graph, open("model.json", "w"))   # then: headroom estimate --model model.json

`model` and the inputs live on the meta device (sources.on_meta builds modules there). See recorder.py for how
ops and saved tensors are read, and models/GRAPH_FORMAT.md for the format.
"""

import contextlib

import torch

from .recorder import GraphRecorder, TraceError

__all__ = ["trace", "TraceError"]


def trace(module, inputs, input_names=None, loss=None, call=None, name=None):
    """Runs `call(module, inputs)` (default: module(*inputs)) and then `loss(output)` under the recorder, and
    returns the graph as a JSON-ready dict. Without `loss` the graph is a forward (inference) graph."""
    for i, t in enumerate(inputs):
        if not isinstance(t, torch.Tensor) or t.device.type != "meta":
            raise TraceError(f"input {i}: inputs must be tensors on the meta device (torch.empty(..., device='meta'))")
    for pname, p in module.named_parameters():
        if p.device.type != "meta":
            raise TraceError(f"parameter {pname} is on {p.device}; build the model under headroom_trace.sources."
                             "on_meta() or move it with module.to('meta')")
    names = input_names or [f"input{i}" for i in range(len(inputs))]
    recorder = GraphRecorder(module, name or type(module).__name__)
    for t, input_name in zip(inputs, names):
        recorder.add_input(t, input_name)
    run = call or (lambda m, xs: m(*xs))
    try:
        with _fake_tensors(), _autocast_accepts_meta(), _repeat_interleave_on_meta(), recorder:
            output = run(module, inputs)
            if loss is not None:
                recorder.phase = "loss"
                value = loss(output)
                if not isinstance(value, torch.Tensor) or value.numel() != 1:
                    raise TraceError("the loss must return a one-element tensor")
                if value.grad_fn is None:
                    raise TraceError("the loss does not depend on any trainable parameter (no autograd graph)")
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
