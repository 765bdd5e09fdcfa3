"""A plan's shape envelope: the largest input shapes it was made for.

A plan is made from the trace of one step at one set of input shapes. On smaller inputs (a shorter sequence, a
smaller batch: dynamic padding makes every batch its own length) the model runs the same ops on smaller tensors,
so every tensor the plan keeps, replays or offloads is at most as large as it was traced and the printed peak
bounds what runs; the op-by-op check (applying.Region) still refuses a smaller input whose ops differ. On a larger
input the same decisions hold more bytes than the plan printed: an out-of-memory error waiting for the longest
batch. So a plan runs on any input within its envelope, each dimension at most its traced size, and refuses the
rest by input and dimension.

    envelope = ShapeEnvelope.of(model.forward, args, kwargs)       # the traced batch's shapes
    envelope = envelope.covering(ShapeEnvelope.parse(model.forward, {"input_ids": (8, 512)}))
    envelope.check(model.forward, args, kwargs)                    # PlanMismatch past it

Inputs are named as the forward's signature names them (a positional argument by its parameter), a tensor inside
a tuple, list or dict argument by its place in it (`past[0]`, `batch["mask"]`); inputs that are not tensors are
not part of the envelope.
"""
import inspect
import math

import torch


class PlanMismatch(RuntimeError):
    """The model ran outside what the plan was made for (other ops, or larger inputs); the message names where."""


class ShapeEnvelope:
    """Input name -> the largest shape, dimension by dimension, that a plan runs on."""

    def __init__(self, shapes):
        self.shapes = {name: tuple(int(d) for d in shape) for name, shape in shapes.items()}

    @classmethod
    def of(cls, forward, args, kwargs):
        """The shapes of the tensors a call of `forward` passes."""
        return cls({name: tuple(t.shape) for name, t in named_tensors(forward, args, kwargs).items()})

    @classmethod
    def parse(cls, forward, max_shapes):
        """headroom.plan's max_shapes: {input name: shape or tensor}, one shape (or tensor) for a one-input model,
        or a list of either (a list of batches), whose elementwise largest is taken."""
        if isinstance(max_shapes, list):
            envelopes = [cls.parse(forward, m) for m in max_shapes]
            if not envelopes:
                raise ValueError("max_shapes: an empty list")
            out = envelopes[0]
            for e in envelopes[1:]:
                out = out.covering(e)
            return out
        if isinstance(max_shapes, dict):
            shapes = {}
            for name, shape in max_shapes.items():
                if isinstance(shape, torch.Tensor):
                    shape = tuple(shape.shape)
                shapes[name] = _shape(shape, f"max_shapes[{name!r}]")
            return cls(shapes)
        if isinstance(max_shapes, torch.Tensor):
            max_shapes = tuple(max_shapes.shape)
        parameters = [p for p in inspect.signature(forward).parameters.values()
                      if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
        name = parameters[0].name if parameters else "args[0]"
        return cls({name: _shape(max_shapes, "max_shapes")})

    def covering(self, other):
        """The envelope of both: each input's dimensions at the larger of the two. An input of `other` that this
        one does not have, or with another number of dimensions, is refused (ValueError) by name."""
        shapes = dict(self.shapes)
        for name, shape in other.shapes.items():
            if name not in shapes:
                known = ", ".join(self.shapes) or "none"
                raise ValueError(f"max_shapes: {name!r} is not an input of the example batch (its inputs: {known})")
            if len(shape) != len(shapes[name]):
                raise ValueError(f"max_shapes: {name!r} has {len(shape)} dimensions, the example batch's "
                                 f"{len(shapes[name])} ({_text(shapes[name])})")
            shapes[name] = tuple(max(a, b) for a, b in zip(shapes[name], shape))
        return ShapeEnvelope(shapes)

    def check(self, forward, args, kwargs):
        """Raises PlanMismatch naming the first input outside the envelope."""
        for name, tensor in named_tensors(forward, args, kwargs).items():
            largest = self.shapes.get(name)
            if largest is None:
                raise PlanMismatch(f"input {name!r}: the plan was made without this input (its inputs: {self}); "
                                   "make the plan again with headroom.plan on a batch that has it")
            shape = tuple(tensor.shape)
            if len(shape) != len(largest):
                raise PlanMismatch(f"input {name!r} has shape {_text(shape)}, {len(shape)} dimensions where the "
                                   f"plan was made for {len(largest)} ({_text(largest)})")
            for dim, (size, most) in enumerate(zip(shape, largest)):
                if size > most:
                    raise PlanMismatch(f"input {name!r}: dimension {dim} is {size}, larger than the {most} the plan "
                                       f"was made for (shape {_text(shape)}, envelope {self}); its peak would be "
                                       "past the printed one: make the plan with headroom.plan(..., max_shapes=) "
                                       "covering the largest batch")

    def __str__(self):
        return ", ".join(f"{name} {_text(shape)}" for name, shape in self.shapes.items()) or "no tensor inputs"


def grown(value, shape):
    """`value` tiled along each dimension and cut to `shape`: a batch of the envelope's size whose values are
    the example's (token ids stay token ids, labels stay labels), for tracing the step at the envelope."""
    if tuple(value.shape) == tuple(shape):
        return value
    if any(d == 0 for d in value.shape):
        raise ValueError(f"max_shapes: cannot grow an input of shape {_text(value.shape)} (a dimension of 0)")
    repeats = [math.ceil(want / have) for want, have in zip(shape, value.shape)]
    return value.repeat(*repeats)[tuple(slice(0, s) for s in shape)]


def named_tensors(forward, args, kwargs):
    """The tensors of a call of `forward`, by the names the envelope uses."""
    out = {}
    map_tensors(forward, args, kwargs, lambda name, t: out.setdefault(name, t))
    return out


def map_tensors(forward, args, kwargs, fn):
    """(args, kwargs) with each tensor replaced by fn(its name, it), named as the envelope names inputs."""
    try:
        signature = inspect.signature(forward)
        bound = signature.bind(*args, **kwargs)
    except (TypeError, ValueError):  # no signature, or one the call does not fit: positions and keywords
        return (tuple(_mapped(f"args[{i}]", a, fn) for i, a in enumerate(args)),
                {k: _mapped(k, v, fn) for k, v in kwargs.items()})
    for name, value in bound.arguments.items():
        kind = signature.parameters[name].kind
        if kind is inspect.Parameter.VAR_KEYWORD:
            bound.arguments[name] = {k: _mapped(k, v, fn) for k, v in value.items()}
        elif kind is inspect.Parameter.VAR_POSITIONAL:
            bound.arguments[name] = tuple(_mapped(f"{name}[{i}]", v, fn) for i, v in enumerate(value))
        else:
            bound.arguments[name] = _mapped(name, value, fn)
    return bound.args, bound.kwargs


def _mapped(name, value, fn):
    if isinstance(value, torch.Tensor):
        return fn(name, value)
    if isinstance(value, (tuple, list)):
        return type(value)(_mapped(f"{name}[{i}]", v, fn) for i, v in enumerate(value))
    if isinstance(value, dict):
        return {k: _mapped(f"{name}[{k!r}]", v, fn) for k, v in value.items()}
    return value


def _shape(shape, where):
    if isinstance(shape, torch.Size):
        shape = tuple(shape)
    if not isinstance(shape, (tuple, list)) or not all(isinstance(d, int) and not isinstance(d, bool)
                                                        for d in shape):
        raise ValueError(f"{where}: expected a shape (a tuple of ints) or a tensor, got {shape!r}")
    if any(d <= 0 for d in shape):
        raise ValueError(f"{where}: every dimension must be positive, got {tuple(shape)}")
    return tuple(shape)


def _text(shape):
    return "x".join(str(d) for d in shape) if len(shape) else "scalar"
