"""Headroom from Python: plan a live model's activations with Headroom's planner, apply the plan op by op, and
serve CUDA memory through Headroom's allocator.

    import headroom
    plan = headroom.plan(model, example_batch, budget="60%")
    print(plan)
    with plan.applied(model):
        loss = model(**batch).loss
        loss.backward()

headroom.trace (and the headroom-trace command) turns any model into Headroom graph JSON for `headroom estimate`
and `headroom plan`.
"""
from .allocator import allocator_stats, use_allocator
from .applying import PlanMismatch
from .planning import Plan, PlanError, plan
from .trace import TraceError, trace, trace_model

__all__ = ["plan", "Plan", "PlanError", "PlanMismatch", "use_allocator", "allocator_stats", "trace", "trace_model",
           "TraceError"]
