"""Carrying a plan out in PyTorch, op by op.

Each checkpointed region of a plan is one block of the model (`model.layers.3`): its forward runs under
torch.utils.checkpoint (non-reentrant) with a selective-checkpoint policy that, for the i-th ATen op the block
dispatches, returns the plan's decision for the i-th op of the block in the trace the plan was made from: save
(MUST_SAVE: the output is cached for backward) or recompute (PREFER_RECOMPUTE: replayed when backward first needs
the block). What that runs, and what it keeps, is what the planner evaluated (Note [Selective checkpoint
semantics] in planner/selective_checkpoint.h), so the plan's figures are those of this code.

The model's inputs are checked against the plan's shape envelope at every step (envelope.py): smaller ones run,
within the printed peak; a larger one is refused by input and dimension. The op a block dispatches is checked
against the traced one at every step: a model whose ops differ from its trace (an input shape that takes another
code path, another attention implementation, a changed forward) is refused by name, never run with a policy
meant for other ops. A plan's offloads are carried by saved-tensor hooks around the whole model's forward
(offloading.py).
"""
import contextlib
import functools

import torch

from .envelope import PlanMismatch
from .trace.recorder import op_kind


def _ignored_kinds():
    """Ops the selective-checkpoint policy never sees (they run in any case): detach, and metadata queries."""
    from torch.utils.checkpoint import SAC_IGNORED_OPS
    return {op_kind(op) for op in SAC_IGNORED_OPS if hasattr(op, "overloadpacket")} | {"detach"}


class Region:
    """One checkpointed block: its module path, the kinds of the ops it dispatches, and their policy."""

    def __init__(self, module, layer, kinds, policy):
        if len(kinds) != len(policy):
            raise ValueError(f"{module}: {len(kinds)} ops but {len(policy)} decisions")
        ignored = _ignored_kinds()
        keep = [i for i, k in enumerate(kinds) if k not in ignored]
        self.module = module
        self.layer = layer
        self.kinds = [kinds[i] for i in keep]
        self.save = [policy[i] == "s" for i in keep]

    def policy_function(self):
        """A fresh policy for one call of the block (the counter starts at its first op)."""
        from torch.utils.checkpoint import CheckpointPolicy
        position = {False: 0, True: 0}  # earlier PyTorch 2.x also asks during the replay (is_recompute)

        def policy(ctx, func, *args, **kwargs):
            i = position[ctx.is_recompute]
            position[ctx.is_recompute] += 1
            kind = op_kind(func)
            if i >= len(self.kinds) or self.kinds[i] != kind:
                expected = self.kinds[i] if i < len(self.kinds) else "nothing (the traced block ends there)"
                raise PlanMismatch(f"{self.module}: op {i} is aten.{kind}, but the plan was made for {expected}; "
                                   "the model runs other ops than it was traced with (an input shape that takes "
                                   "another code path, attention implementation, code): make the plan again with "
                                   "headroom.plan")
            return CheckpointPolicy.MUST_SAVE if self.save[i] else CheckpointPolicy.PREFER_RECOMPUTE

        policy.ops_seen = lambda: position[False]
        return policy


class AppliedPlan:
    """The regions of a plan wrapped around a model's blocks until remove(); its inputs checked against the
    plan's shape envelope when one is given."""

    def __init__(self, model, regions, offloads=None, envelope=None):
        _require_selective_checkpointing()
        self._restore = []
        signature = model.forward  # names the inputs, as the envelope was made (before any wrapper of ours)
        try:
            for region in regions:
                self._wrap(model, region)
            if offloads:
                self._hook_saved_tensors(model, offloads)
            if envelope is not None:
                self._check_inputs(model, envelope, signature)  # outermost: nothing runs on a refused input
            # A key/value cache the replay would extend twice; Hugging Face turns it off under gradient
            # checkpointing too, and the plan was traced without it.
            self._restore.append(kv_cache_off(model))
        except Exception:
            self.remove()
            raise

    def _wrap(self, model, region):
        from torch.utils.checkpoint import checkpoint, create_selective_checkpoint_contexts
        try:
            block = model.get_submodule(region.module)
        except AttributeError:
            raise PlanMismatch(f"{region.module}: the plan checkpoints this block, which the model does not "
                               "have") from None
        original = block.forward

        def forward(*args, **kwargs):
            if not torch.is_grad_enabled():
                return original(*args, **kwargs)
            policy = region.policy_function()
            out = checkpoint(original, *args, use_reentrant=False, preserve_rng_state=True,
                             context_fn=functools.partial(create_selective_checkpoint_contexts, policy,
                                                          allow_cache_entry_mutation=True), **kwargs)
            if policy.ops_seen() != len(region.kinds):
                raise PlanMismatch(f"{region.module}: ran {policy.ops_seen()} ops where the plan was made for "
                                   f"{len(region.kinds)}; make the plan again with headroom.plan")
            return out

        self._replace_forward(block, forward, original)

    def _hook_saved_tensors(self, model, offloads):
        original = model.forward

        def forward(*args, **kwargs):
            if not torch.is_grad_enabled():
                return original(*args, **kwargs)
            step = offloads.step(type(model).__name__)
            with step.tracker, step.hooks():
                out = original(*args, **kwargs)
            step.finish()
            return out

        self._replace_forward(model, forward, original)

    def _check_inputs(self, model, envelope, signature):
        original = model.forward

        def forward(*args, **kwargs):
            if torch.is_grad_enabled():  # without gradients the plan does not apply (see _wrap)
                envelope.check(signature, args, kwargs)
            return original(*args, **kwargs)

        self._replace_forward(model, forward, original)

    def _replace_forward(self, module, forward, original):
        had_own = "forward" in module.__dict__  # an instance attribute someone else set: put it back as it was
        module.forward = forward
        self._restore.append(lambda: setattr(module, "forward", original) if had_own
                             else module.__dict__.pop("forward", None))

    def remove(self):
        """Restores the model's blocks as they were; safe to call twice."""
        while self._restore:
            self._restore.pop()()


def kv_cache_off(model):
    """Turns off the key/value cache of every config the model's modules hold (T5's decoder has its own copy);
    returns what turns them back on."""
    configs = {id(c): c for m in model.modules() for c in [getattr(m, "config", None)]
               if getattr(c, "use_cache", None)}
    for c in configs.values():
        c.use_cache = False

    def restore():
        for c in configs.values():
            c.use_cache = True
    return restore


def _require_selective_checkpointing():
    try:
        from torch.utils.checkpoint import create_selective_checkpoint_contexts  # noqa: F401  (PyTorch >= 2.4)
    except ImportError:
        raise RuntimeError(f"applying a plan needs PyTorch's selective activation checkpointing (2.4 or later); "
                           f"this is {torch.__version__}") from None


@contextlib.contextmanager
def applied(model, regions, offloads=None, envelope=None):
    plan = AppliedPlan(model, regions, offloads, envelope)
    try:
        yield model
    finally:
        plan.remove()
