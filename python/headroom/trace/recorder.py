"""Records one forward and loss of a torch.nn.Module as Headroom graph JSON (models/GRAPH_FORMAT.md).

How it works. The module runs on the meta device (no memory, no data), under a TorchDispatchMode that sees every
ATen op below autograd, in execution order. Each op becomes a graph op; each tensor it reads or writes becomes a
graph tensor, a view when it shares an earlier tensor's storage. What autograd keeps for an op's backward is read
from the autograd graph itself, not guessed: once the op has returned, autograd has attached its node (grad_fn)
to the outputs and packed what that node saves, so when the next op starts the recorder reads the node's saved
tensors (`_saved_*` attributes, `saved_tensors` for custom Functions) and matches them by storage. Reading the
node then, rather than at the end, matters for in-place ops, which replace a tensor's grad_fn.

Backward and the optimizer step are not traced: Headroom derives them from the forward graph (graph/autograd.h),
so a traced graph can be planned with checkpointing or offload like a built one.

Semantics follow the device traced on. On the meta device PyTorch takes its non-CUDA paths where it branches on
the device: dropout keeps a mask in the input's dtype (CUDA's fused dropout keeps a 1-byte one), and
scaled_dot_product_attention runs its math path (the CUDA flash kernel saves q, k, v, the output and a logsumexp).
"""

import re

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

GRAPH_VERSION = 1


class TraceError(RuntimeError):
    """A model, input or op the tracer cannot record; the message names it."""


_DTYPES = {
    torch.float64: "f64",
    torch.float32: "f32",
    torch.bfloat16: "bf16",
    torch.float16: "f16",
    torch.int64: "i64",
    torch.int32: "i32",
    torch.int8: "i8",
    torch.uint8: "u8",
    torch.bool: "bool",
}
for _name, _code in (("float8_e4m3fn", "f8e4m3"), ("float8_e5m2", "f8e5m2")):
    if hasattr(torch, _name):
        _DTYPES[getattr(torch, _name)] = _code

# ATen names Headroom's backward rules know under another name (graph/autograd.h, Note [Backward families]).
_KINDS = {
    "_to_copy": "cast",
    "_scaled_dot_product_flash_attention": "sdpa_flash",
    "_scaled_dot_product_flash_attention_for_cpu": "sdpa_flash",
    "_scaled_dot_product_efficient_attention": "sdpa_efficient",
    "_scaled_dot_product_cudnn_attention": "sdpa_cudnn",
    "_flash_attention_forward": "flash_attention",
}


def op_kind(func):
    """The graph's kind of an ATen op (its overload packet's name, or the name Headroom's rules know it by)."""
    packet = func.overloadpacket.__name__
    return _KINDS.get(packet, packet)


def dtype_name(dtype, what):
    try:
        return _DTYPES[dtype]
    except KeyError:
        if dtype in _COMPLEX:
            return _DTYPES[_COMPLEX[dtype]]
        raise TraceError(f"{what}: dtype {dtype} has no Headroom equivalent "
                         f"(supported: {', '.join(str(d) for d in _DTYPES)})") from None


# A complex tensor is recorded as torch.view_as_real lays it out, its real dtype with a trailing dimension of 2:
# the same bytes (Llama 4 rotates q and k as complex numbers).
_COMPLEX = {torch.complex64: torch.float32, torch.complex128: torch.float64}


def shape_of(t):
    return list(t.shape) + [2] if t.dtype in _COMPLEX else list(t.shape)


def storage_key(t):
    """Identifies a tensor's storage; views share their base's."""
    if hasattr(t, "untyped_storage"):  # PyTorch 2.x
        return t.untyped_storage()._cdata
    return t.storage()._cdata  # PyTorch 1.13


def _numel(shape):
    n = 1
    for d in shape:
        n *= d
    return n


def _gemm_flops(kind, args, out):
    """A multiply-add counts 2."""
    if kind in ("mm", "bmm", "addmm", "baddbmm"):
        a = args[1] if kind in ("addmm", "baddbmm") else args[0]
        return 2.0 * _numel(out.shape) * a.shape[-1]
    if kind == "convolution":  # input, weight, ...: each output element sums C_in/groups * kernel products
        weight = args[1]
        return 2.0 * _numel(out.shape) * _numel(weight.shape[1:])
    return float(_numel(out.shape))


def block_prefixes(module):
    """Repeated blocks in definition order: the module path up to its first numeric component
    ("model.layers.3", "layer2.0", "features.7"), each given the next block index."""
    index = {}
    for name, _ in module.named_modules():
        prefix = block_of(name)
        if prefix is not None and prefix not in index:
            index[prefix] = len(index)
    return index


def block_of(path):
    parts = path.split(".")
    for i, part in enumerate(parts):
        if part.isdigit():
            return ".".join(parts[: i + 1])
    return None


class GraphRecorder(TorchDispatchMode):
    """Use as a context manager around the forward (and, with `phase = "loss"`, the loss)."""

    def __init__(self, module, name, parameters=None, buffers=None):
        """`parameters` and `buffers` (name -> tensor) stand in for the module's own when the step runs on other
        tensors than the module holds (torch.func.functional_call over fake copies); by default the module's."""
        super().__init__()
        self.name = name
        self.phase = "forward"
        self.tensors = []  # graph tensors, in id order
        self.ops = []
        self._ids = {}  # id(python tensor) -> graph tensor id
        self._keep = []  # every tensor seen, so that ids and storages are never reused
        self._base_of_storage = {}  # storage key -> graph id of the tensor that owns it
        self._module_path = [""]
        self._blocks = block_prefixes(module)
        self._pending = None  # (op, output tensors) whose autograd node is read when the next op starts
        self._hooks = []
        for path, sub in module.named_modules():
            if path:
                self._hooks.append(sub.register_forward_pre_hook(self._enter(path)))
                self._hooks.append(sub.register_forward_hook(self._leave))
        for pname, p in (parameters if parameters is not None else dict(module.named_parameters())).items():
            self._leaf(p, pname, "parameter", trainable=p.requires_grad)
        for bname, b in (buffers if buffers is not None else dict(module.named_buffers())).items():
            self._leaf(b, bname, "buffer")

    # -- the module being run, for op names and block indices

    def _enter(self, path):
        def hook(_module, _inputs):
            self._module_path.append(path)
        return hook

    def _leave(self, _module, _inputs, _output):
        self._module_path.pop()

    def _layer(self, path):
        prefix = block_of(path)
        return self._blocks.get(prefix, -1) if prefix is not None else -1

    # -- tensors

    def add_input(self, t, name):
        return self._leaf(t, name, "input")

    def _leaf(self, t, name, role, trainable=True):
        if id(t) in self._ids:
            return self._ids[id(t)]
        entry = {"name": name, "shape": shape_of(t), "dtype": dtype_name(t.dtype, name), "role": role}
        layer = self._layer(name)
        if layer >= 0:
            entry["layer"] = layer
        if role == "parameter" and not trainable:
            entry["trainable"] = False
        key = storage_key(t)
        base = self._base_of_storage.get(key)
        if base is not None:
            entry["view_of"] = base
        return self._add(t, entry, key)

    def _add(self, t, entry, key):
        tid = len(self.tensors)
        entry["id"] = tid
        self.tensors.append(entry)
        self._ids[id(t)] = tid
        self._keep.append(t)
        if "view_of" not in entry:
            self._base_of_storage.setdefault(key, tid)
        return tid

    def _input_id(self, t, op_name):
        tid = self._ids.get(id(t))
        if tid is not None:
            return tid
        # A tensor made outside the trace (a Python attribute, a cached table): resident, like a buffer.
        return self._leaf(t, f"{op_name}.constant{len(self.tensors)}", "buffer")

    def _output_id(self, t, name, layer, alias_of=None):
        key = storage_key(t)
        entry = {"name": name, "shape": shape_of(t), "dtype": dtype_name(t.dtype, name), "role": "activation"}
        if layer >= 0:
            entry["layer"] = layer
        base = self._base_of_storage.get(key)
        if base is None and alias_of is not None:
            # A view the schema declares (t, view, expand): under fake tensors a parameter's view lands on the
            # fake copy's storage, not the parameter's, so the schema says what storage ties cannot.
            base = self.tensors[alias_of].get("view_of", alias_of)
            self._base_of_storage[key] = base
        if base is not None:
            entry["view_of"] = base
        return self._add(t, entry, key)

    # -- ops

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func.namespace == "prim":
            # Metadata queries (prim.device: fake tensors ask it while autograd saves an op's tensors) move no
            # data; reading the pending node here would come before the node exists.
            return func(*args, **kwargs)
        if func is torch.ops.aten.detach.default:
            # Autograd detaches an output it saves (softmax's, rsqrt's) while saving it, after the op returned
            # and before the node holds it: the previous op stays pending. A detach is a view; it saves nothing.
            pending = self._pending
            out = func(*args, **kwargs)
            self._record(func, args, kwargs, out)
            self._pending = pending
            return out
        self._read_pending_node()
        out = func(*args, **kwargs)
        self._record(func, args, kwargs, out)
        return out

    def _record(self, func, args, kwargs, out):
        kind = op_kind(func)
        path = self._module_path[-1]
        name = f"{path}.{kind}" if path else kind
        layer = self._layer(path)
        ins = [a for a in tree_flatten((args, kwargs))[0] if isinstance(a, torch.Tensor)]
        outs = [o for o in tree_flatten(out)[0] if isinstance(o, torch.Tensor)]
        op = {"kind": kind, "name": name, "inputs": [], "outputs": [], "phase": self.phase}
        if layer >= 0:
            op["layer"] = layer
        for t in ins:
            tid = self._input_id(t, name)
            if tid not in op["inputs"]:
                op["inputs"].append(tid)
        mutable = func._schema.is_mutable
        for i, t in enumerate(outs):
            if mutable and i == 0 and ins and storage_key(t) == storage_key(ins[0]):
                op["inplace"] = True
            suffix = "" if len(outs) == 1 else str(i)
            alias = _aliased_argument(func, args, i)
            op["outputs"].append(self._output_id(t, f"{name}.out{suffix}", layer,
                                                 None if alias is None else self._input_id(alias, name)))
        op["compute_dtype"] = dtype_name(outs[0].dtype, name) if outs else "f32"
        # A view (t, view, expand, detach, ...) moves no data: it costs its dispatch only.
        pure_view = bool(outs) and all(_aliased_argument(func, args, i) is not None for i in range(len(outs)))
        op["flops"] = _gemm_flops(kind, args, outs[0]) if outs and not pure_view else 0.0
        op["bytes_read"] = 0 if pure_view else sum(_numel(t.shape) * t.element_size() for t in ins)
        op["bytes_written"] = 0 if pure_view else sum(_numel(t.shape) * t.element_size() for t in outs)
        op["id"] = len(self.ops)
        self.ops.append(op)
        self._pending = (op, outs)

    def _read_pending_node(self):
        """What autograd saved for the previous op: its outputs' nodes are attached by now."""
        if self._pending is None:
            return
        op, outs = self._pending
        self._pending = None
        nodes = []
        for t in outs:
            node = t.grad_fn
            if node is not None and node not in nodes:
                nodes.append(node)
        saved = []
        for node in nodes:
            for t in saved_tensors(node):
                tid = self._saved_id(op, t)
                if tid is not None and tid not in saved:
                    saved.append(tid)
        if saved:
            op["saved"] = saved

    def _saved_id(self, op, t):
        """The op's own input or output that the saved tensor shares storage with (autograd saves outputs as
        shallow copies); one of the same shape first."""
        key = storage_key(t)
        candidates = [tid for tid in op["inputs"] + op["outputs"] if self._storage_of(tid) == key]
        for tid in candidates:
            if self.tensors[tid]["shape"] == shape_of(t):
                return tid
        if candidates:
            return candidates[0]
        if t.dim() == 0:
            return None  # a Python number autograd wrapped as a tensor (div's divisor): not a graph tensor
        # Saved but neither read nor written by this op (a custom Function's context): the op reads it.
        tid = self._input_id(t, op["name"])
        op["inputs"].append(tid)
        return tid

    def _storage_of(self, tid):
        t = self._keep[tid]
        return storage_key(t)

    def remove_hooks(self):
        for h in self._hooks:
            h.remove()
        self._hooks = []

    def mark_loss(self, value, output):
        """`value` is the step's loss and `output` what the model returned. A model that computes its loss inside
        its forward (Hugging Face's, given labels) leaves no op in the loss phase: the ops after the last one that
        made a returned tensor (the logits) compute the loss, as they would in a loss function of their own. The
        loop then holds the returned tensors through backward (Note [Training loop] in job/job_spec.h)."""
        if any(op["phase"] == "loss" for op in self.ops):
            return
        loss_id = self._ids.get(id(value))
        returned = {self._ids.get(id(t)) for t in _tensors_in(output)} - {loss_id, None}
        last_output = max((i for i, op in enumerate(self.ops) if returned & set(op["outputs"])), default=None)
        if last_output is not None and last_output + 1 < len(self.ops):
            for op in self.ops[last_output + 1:]:
                op["phase"] = "loss"
            return
        for op in reversed(self.ops):
            if loss_id is not None and loss_id in op["outputs"]:
                op["phase"] = "loss"
                return
        raise TraceError("the loss is not a tensor any traced op made")

    def finish(self):
        self._read_pending_node()
        self.remove_hooks()
        return {"headroom_graph_version": GRAPH_VERSION, "name": self.name, "tensors": self.tensors, "ops": self.ops}


def _tensors_in(output):
    """The tensors of a model's output: nested tuples, lists and dicts, and Hugging Face's ModelOutput (a dict)."""
    if isinstance(output, torch.Tensor):
        return [output]
    if isinstance(output, dict):
        output = list(output.values())
    if isinstance(output, (list, tuple)):
        return [t for item in output for t in _tensors_in(item)]
    return []


def _aliased_argument(func, args, i):
    """The tensor argument that output `i` is a view of, by the op's schema ("Tensor(a) self -> Tensor(a)"), if
    the output is a pure view (not an in-place write)."""
    returns = func._schema.returns
    alias = returns[i].alias_info if i < len(returns) else None
    if alias is None or alias.is_write:
        return None
    for argument, value in zip(func._schema.arguments, args):
        if (isinstance(value, torch.Tensor) and argument.alias_info is not None
                and argument.alias_info.before_set == alias.before_set):
            return value
    return None


_SAVED = re.compile(r"^_saved_\w+$")


def saved_tensors(node):
    """The tensors an autograd node keeps: `_saved_<name>` attributes (built-in formulas, tensors or lists of
    them) and `saved_tensors` (custom autograd Functions)."""
    found = []
    for attr in dir(node):
        if not _SAVED.match(attr):
            continue
        try:
            value = getattr(node, attr)
        except RuntimeError:  # released, or an undefined optional tensor
            continue
        values = value if isinstance(value, (list, tuple)) else [value]
        found.extend(v for v in values if isinstance(v, torch.Tensor))
    if hasattr(node, "saved_tensors"):
        try:
            found.extend(t for t in node.saved_tensors if isinstance(t, torch.Tensor))
        except RuntimeError:
            pass
    return found
