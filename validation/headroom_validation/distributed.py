"""Runs a training step on several ranks with torch.distributed and measures every rank.

    python -m headroom_validation.distributed --out validation/fixtures/distributed [NAME ...]

Each configuration (CONFIGS) starts its ranks as processes on this machine (gloo on the loopback address, the
way torchrun would start them on GPUs with NCCL), each with the allocation hook (validation/alloc_hook.c)
counting its own tensor bytes. A rank builds the same small Hugging Face model from the same seed, wraps it as
the layout says (DDP, ZeroRedundancyOptimizer, FSDP2's fully_shard, FSDP1, DTensor tensor parallelism, a
pipeline stage under torch.distributed.pipelining), runs a warm-up step (optimizer state,
buckets, sharded states exist as in any later step) and then the measured one: the bytes live before it, their
peak, the op and phase at the peak, and (in a third step) the bytes its forward saves for backward. The fixture
is an estimate fixture (report/validation_fixture.h) whose `ranks` hold every rank's figures and `measured` rank
0's; its `estimate_args` are the `headroom estimate` flags of one rank of the same layout, its `peers` other
tools' figures for one rank (headroom_validation.peers, run in validation/.venv).
"""
import argparse
import contextlib
import gc
import json
import os
import pathlib
import socket
import subprocess
import sys
import tempfile
import types

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from headroom_validation import hook as hooks

FIXTURE_VERSION = 1

# A GPT-2 small enough for several ranks on two cores, large enough that its weights and activations are
# megabytes. Dropout off: ranks compare nothing, but the bytes should not depend on masks.
GPT2 = {"architectures": ["GPT2LMHeadModel"], "model_type": "gpt2", "vocab_size": 4096, "n_embd": 256,
        "n_layer": 4, "n_head": 8, "n_positions": 512, "resid_pdrop": 0.0, "embd_pdrop": 0.0, "attn_pdrop": 0.0,
        "bos_token_id": 0, "eos_token_id": 0, "use_cache": False}
LLAMA = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "vocab_size": 4096, "hidden_size": 256,
         "intermediate_size": 688, "num_hidden_layers": 4, "num_attention_heads": 8, "num_key_value_heads": 2,
         "max_position_embeddings": 512, "tie_word_embeddings": False, "use_cache": False}
# Mixtral's layout, small: 4 experts, top-2 routing (transformers 5 runs them stacked, through grouped_mm); a
# vocabulary small enough that the step peaks in the experts' backward, not at the loss.
MIXTRAL = {"architectures": ["MixtralForCausalLM"], "model_type": "mixtral", "vocab_size": 512, "hidden_size": 256,
           "intermediate_size": 512, "num_hidden_layers": 2, "num_attention_heads": 8, "num_key_value_heads": 2,
           "max_position_embeddings": 512, "num_local_experts": 4, "num_experts_per_tok": 2,
           "tie_word_embeddings": False, "use_cache": False}
# Qwen2-MoE's: 8 routed experts of 256, top-2, and a gated shared expert of 512.
QWEN2_MOE = {"architectures": ["Qwen2MoeForCausalLM"], "model_type": "qwen2_moe", "vocab_size": 4096,
             "hidden_size": 256, "intermediate_size": 688, "moe_intermediate_size": 256,
             "shared_expert_intermediate_size": 512, "num_experts": 8, "num_experts_per_tok": 2,
             "num_hidden_layers": 2, "num_attention_heads": 8, "num_key_value_heads": 2,
             "max_position_embeddings": 512, "tie_word_embeddings": False, "use_cache": False}

MICRO_BATCH, SEQ = 2, 256
PIPELINE_MICRO_BATCHES = 4
ACCUMULATED = 2  # micro-batches per step of the no_sync configuration
# The step's setup as `headroom estimate` flags (--torch and --transformers are added from what runs).
STEP_FLAGS = ["--kernels", "cpu", "--micro-batch", str(MICRO_BATCH), "--seq", str(SEQ), "--precision", "fp32",
              "--optimizer", "adamw", "--checkpoint", "none", "--loop", "hand",
              "--attention", "eager"]

# The layout as torch.distributed runs it, not Megatron-LM or DeepSpeed: transformers' modules as written,
# PyTorch's gradients, ZeRO-1 by ZeroRedundancyOptimizer.
TORCH_DISTRIBUTED = ["--torch-parallel"]

# name -> (model config, layout, world size, the layout's headroom flags, description)
CONFIGS = {
    "gpt2-ddp-2": (GPT2, "ddp", 2, ["--gpus", "2"], "DDP (25 MiB buckets, gradients copied into them)"),
    "gpt2-ddp-4": (GPT2, "ddp", 4, ["--gpus", "4"], "DDP (25 MiB buckets, gradients copied into them)"),
    "gpt2-ddp-bucket-view-2": (GPT2, "ddp-bucket-view", 2, ["--gpus", "2"],
                               "DDP with gradient_as_bucket_view=True (gradients are views of the buckets)"),
    "llama-gqa-ddp-2": (LLAMA, "ddp", 2, ["--gpus", "2"], "DDP (25 MiB buckets, gradients copied into them)"),
    "gpt2-zero1-2": (GPT2, "zero1", 2, ["--gpus", "2", "--zero", "1", *TORCH_DISTRIBUTED],
                     "ZeroRedundancyOptimizer over AdamW (optimizer state sharded), DDP for the gradients"),
    "gpt2-fsdp2-2": (GPT2, "fsdp2", 2, ["--gpus", "2", "--fsdp", "full"],
                     "FSDP2 fully_shard on every block and the root, reshard_after_forward=True"),
    "llama-gqa-fsdp2-2": (LLAMA, "fsdp2", 2, ["--gpus", "2", "--fsdp", "full"],
                          "FSDP2 fully_shard on every block and the root, reshard_after_forward=True"),
    "llama-gqa-tp-2": (LLAMA, "tp", 2, ["--gpus", "2", "--tp", "2", *TORCH_DISTRIBUTED],
                       "tensor parallel with DTensor (parallelize_module: q/k/v, gate/up, lm_head colwise; o, "
                       "down, the embedding rowwise; the loss under loss_parallel, as Megatron's vocabulary-parallel "
                       "head)"),
    "llama-gqa-pp-1f1b-2": (LLAMA, "pp-1f1b", 2, ["--gpus", "2", "--pp", "2", "--grad-accum",
                                                 str(PIPELINE_MICRO_BATCHES), *TORCH_DISTRIBUTED],
                            f"pipelining, 1F1B over {PIPELINE_MICRO_BATCHES} micro-batches, one stage per rank"),
    "llama-gqa-pp-gpipe-2": (LLAMA, "pp-gpipe", 2, ["--gpus", "2", "--pp", "2", "--pp-schedule", "gpipe",
                                                   "--grad-accum", str(PIPELINE_MICRO_BATCHES), *TORCH_DISTRIBUTED],
                             f"pipelining, GPipe over {PIPELINE_MICRO_BATCHES} micro-batches, one stage per rank"),
    "gpt2-fsdp2-keep-2": (GPT2, "fsdp2-keep", 2, ["--gpus", "2", "--fsdp", "grad-op"],
                          "FSDP2 fully_shard on every block and the root, reshard_after_forward=False"),
    "gpt2-fsdp1-full-2": (GPT2, "fsdp1-full", 2, ["--gpus", "2", "--fsdp", "full"],
                          "FSDP1 FULL_SHARD, one unit per block (transformer auto-wrap) and the root"),
    "gpt2-fsdp1-grad-op-2": (GPT2, "fsdp1-grad-op", 2, ["--gpus", "2", "--fsdp", "grad-op"],
                             "FSDP1 SHARD_GRAD_OP, one unit per block (transformer auto-wrap) and the root"),
    "gpt2-ddp-no-sync-2": (GPT2, "ddp-no-sync", 2, ["--gpus", "2", "--grad-accum", str(ACCUMULATED)],
                           f"DDP, {ACCUMULATED} micro-batches per step, all but the last under no_sync()"),
    "llama-gqa-tp-sp-2": (LLAMA, "tp-sp", 2, ["--gpus", "2", "--tp", "2", "--sp", *TORCH_DISTRIBUTED],
                          "tensor parallel with sequence parallelism (the plan of llama-gqa-tp-2, the norms and "
                          "residual stream sharded by sequence: SequenceParallel norms, the attention's and MLP's "
                          "inputs gathered, their outputs reduce-scattered)"),
    "llama-gqa-fsdp-tp-4": (LLAMA, "fsdp-tp", 4, ["--gpus", "4", "--tp", "2", "--fsdp", "full", *TORCH_DISTRIBUTED],
                            "FSDP2 over tensor parallelism on a 2x2 mesh: the tensor-parallel plan of llama-gqa-tp-2 "
                            "within each pair of ranks, fully_shard on every block and the root across the pairs"),
    "mixtral-ddp-2": (MIXTRAL, "ddp", 2, ["--gpus", "2"], "DDP (25 MiB buckets, gradients copied into them)"),
    "mixtral-ep-2": (MIXTRAL, "ep", 2, ["--gpus", "2", "--ep", "2", *TORCH_DISTRIBUTED],
                     "expert parallel as transformers 5 runs it (AllToAllEP: each rank holds 2 of the 4 experts, "
                     "the routed tokens sent to their experts' rank and back by all-to-all), DDP over the rest; "
                     "routing made even"),
    "qwen2-moe-ddp-2": (QWEN2_MOE, "ddp", 2, ["--gpus", "2"], "DDP (25 MiB buckets, gradients copied into them)"),
    "gpt2-hsdp-4": (GPT2, "hsdp", 4, ["--gpus", "4", "--fsdp", "hybrid", "--shard-group", "2"],
                    "FSDP2 fully_shard on a 2x2 mesh (replicated across 2 groups, sharded within each of 2 ranks: "
                    "HYBRID_SHARD), every block and the root"),
}


def _model(config):
    import transformers
    document = dict(config)
    model_type = document.pop("model_type")
    hf_config = transformers.AutoConfig.for_model(model_type, **document)
    cls = getattr(transformers, config["architectures"][0])
    return cls._from_config(hf_config, attn_implementation="eager").train()


def _wrap(model, layout):
    """The model and its optimizer as the layout runs them."""
    adamw = dict(lr=1e-4, foreach=_foreach(layout))
    if layout in ("ddp", "ddp-bucket-view", "ddp-no-sync"):
        model = torch.nn.parallel.DistributedDataParallel(model,
                                                          gradient_as_bucket_view=layout == "ddp-bucket-view")
        return model, torch.optim.AdamW(model.parameters(), **adamw)
    if layout == "zero1":
        from torch.distributed.optim import ZeroRedundancyOptimizer
        model = torch.nn.parallel.DistributedDataParallel(model)
        return model, ZeroRedundancyOptimizer(model.parameters(), optimizer_class=torch.optim.AdamW, **adamw)
    if layout in ("fsdp2", "fsdp2-keep", "hsdp"):
        from torch.distributed.fsdp import fully_shard
        from torch.distributed.device_mesh import init_device_mesh
        world = dist.get_world_size()
        # HSDP: a 2-D mesh, the parameters replicated along its first dimension and sharded along its second.
        if layout == "hsdp":
            mesh = init_device_mesh("cpu", (world // 2, 2), mesh_dim_names=("replicate", "shard"))
        else:
            mesh = init_device_mesh("cpu", (world,))
        reshard = layout != "fsdp2-keep"
        for block in _blocks(model):
            fully_shard(block, mesh=mesh, reshard_after_forward=reshard)
        fully_shard(model, mesh=mesh, reshard_after_forward=reshard)
        return model, torch.optim.AdamW(model.parameters(), **adamw)
    if layout in ("fsdp1-full", "fsdp1-grad-op"):
        from torch.distributed.fsdp import FullyShardedDataParallel, ShardingStrategy
        from torch.distributed.fsdp.wrap import ModuleWrapPolicy
        strategy = ShardingStrategy.FULL_SHARD if layout == "fsdp1-full" else ShardingStrategy.SHARD_GRAD_OP
        model = FullyShardedDataParallel(model, sharding_strategy=strategy, device_id=torch.device("cpu"),
                                         auto_wrap_policy=ModuleWrapPolicy({type(_blocks(model)[0])}),
                                         use_orig_params=True)
        return model, torch.optim.AdamW(model.parameters(), **adamw)
    if layout in ("tp", "tp-sp"):
        from torch.distributed.device_mesh import init_device_mesh
        mesh = init_device_mesh("cpu", (dist.get_world_size(),))
        return (_tensor_parallel(model, mesh, sequence_parallel=layout == "tp-sp"),
                torch.optim.AdamW(model.parameters(), **adamw))
    if layout == "fsdp-tp":
        from torch.distributed.fsdp import fully_shard
        from torch.distributed.device_mesh import init_device_mesh
        mesh = init_device_mesh("cpu", (dist.get_world_size() // 2, 2), mesh_dim_names=("dp", "tp"))
        model = _tensor_parallel(model, mesh["tp"])
        for block in _blocks(model):
            fully_shard(block, mesh=mesh["dp"])
        fully_shard(model, mesh=mesh["dp"])
        return model, torch.optim.AdamW(model.parameters(), **adamw)
    if layout == "ep":
        return _expert_parallel(model), torch.optim.AdamW(model.parameters(), **adamw)
    raise ValueError(f"unknown layout {layout!r}")


def _expert_parallel(model):
    """transformers 5's own expert parallelism (transformers.distributed.expert_parallel, the model's
    base_model_ep_plan): each rank keeps its slice of the stacked experts (Shard(0)), and AllToAllEP sends every
    (token, expert) pair to its expert's rank and the output back with two all-to-alls. DDP reduces the dense
    gradients; with one rank per expert slice the experts' gradients have nothing to be reduced with, and DDP
    leaves them out (as DeepSpeed-MoE reduces expert gradients only within their expert-data-parallel group)."""
    from torch.distributed.device_mesh import init_device_mesh
    from transformers.distributed.expert_parallel import apply_expert_parallelism
    mesh = init_device_mesh("cpu", (dist.get_world_size(), 1), mesh_dim_names=("ep", "tp"))
    plan, experts = {}, []
    for i, block in enumerate(_blocks(model)):
        prefix = f"model.layers.{i}.mlp.experts"
        plan.update({f"{prefix}.gate_up_proj": "grouped_gemm", f"{prefix}.down_proj": "grouped_gemm",
                     prefix: "ep_dispatch_experts"})
        experts += [f"{prefix}.gate_up_proj", f"{prefix}.down_proj"]
    for block in _blocks(model):
        block.mlp.gate.forward = types.MethodType(_balanced_routing, block.mlp.gate)
    apply_expert_parallelism(model, mesh["ep"], mesh["tp"], plan, ep_implementation="all_to_all")
    torch.nn.parallel.DistributedDataParallel._set_params_and_buffers_to_ignore_for_model(model, experts)
    return torch.nn.parallel.DistributedDataParallel(model)


def _balanced_routing(router, hidden_states):
    """MixtralTopKRouter's forward with its choice made even: token t goes to experts t, t + 1, ... (mod E), each
    weighed by its softmax probability, renormalized. Every expert, so every expert-parallel rank, gets the same
    rows, the balance Headroom assumes (Note [MoE routing] in models/builders.h); a random router's skew would
    otherwise decide which rank peaks. The tensors it keeps are topk's: the f32 probabilities and an int64 index."""
    hidden_states = hidden_states.reshape(-1, router.hidden_dim)
    logits = torch.nn.functional.linear(hidden_states, router.weight)
    probs = torch.nn.functional.softmax(logits.float(), dim=-1)
    token = torch.arange(hidden_states.size(0)).unsqueeze(-1)
    indices = (token + torch.arange(router.top_k)) % router.num_experts
    weights = probs.gather(1, indices)
    weights /= weights.sum(dim=-1, keepdim=True)
    return logits, weights, indices


def _foreach(layout):
    """torch.optim's foreach kernels take no mix of DTensor and plain parameters, which tensor parallelism and
    expert parallelism leave (embeddings, norms): there AdamW runs its for-loop."""
    return not layout.startswith("tp") and layout != "ep"


def _tensor_parallel(model, mesh, sequence_parallel=False):
    """Megatron's split of a Llama with DTensor: column-wise q/k/v and gate/up, row-wise o and down, so each rank
    holds half the heads and half the MLP; the embedding and the head split by vocabulary, the loss computed on
    the vocabulary shards (loss_parallel), as Megatron's vocabulary-parallel head and cross-entropy do.

    With sequence_parallel, Korthikanti et al.'s sequence parallelism as torchtitan writes it for its own Llama:
    the residual stream is a DTensor sharded by sequence; each norm runs on its shard; the attention's and MLP's
    inputs are gathered to the whole sequence and their row-wise outputs reduce-scattered back. The embedding's
    output stays a DTensor, so transformers' Llama takes the sequence's global length for its positions and
    rotary tables."""
    from torch.distributed.tensor import Replicate, Shard
    from torch.distributed.tensor.parallel import (ColwiseParallel, PrepareModuleInput, RowwiseParallel,
                                                   SequenceParallel, parallelize_module)
    block_plan = {
        "self_attn.q_proj": ColwiseParallel(), "self_attn.k_proj": ColwiseParallel(),
        "self_attn.v_proj": ColwiseParallel(), "self_attn.o_proj": RowwiseParallel(),
        "mlp.gate_proj": ColwiseParallel(), "mlp.up_proj": ColwiseParallel(), "mlp.down_proj": RowwiseParallel()}
    model_plan = {
        "model.embed_tokens": RowwiseParallel(input_layouts=Replicate(), output_layouts=Replicate()),
        "lm_head": ColwiseParallel(output_layouts=Shard(-1), use_local_output=False)}
    if sequence_parallel:
        block_plan.update({
            "input_layernorm": SequenceParallel(),
            "self_attn": PrepareModuleInput(input_kwarg_layouts={"hidden_states": Shard(1)},
                                            desired_input_kwarg_layouts={"hidden_states": Replicate()}),
            "self_attn.o_proj": RowwiseParallel(output_layouts=Shard(1), use_local_output=False),
            "post_attention_layernorm": SequenceParallel(),
            "mlp": PrepareModuleInput(input_layouts=(Shard(1),), desired_input_layouts=(Replicate(),)),
            "mlp.down_proj": RowwiseParallel(output_layouts=Shard(1), use_local_output=False)})
        model_plan.update({
            "model.embed_tokens": RowwiseParallel(input_layouts=Replicate(), output_layouts=Shard(1),
                                                  use_local_output=False),
            "model.norm": SequenceParallel(),
            "lm_head": ColwiseParallel(input_layouts=Shard(1), output_layouts=Shard(-1), use_local_output=False)})
    for block in model.model.layers:
        parallelize_module(block, mesh, block_plan)
    parallelize_module(model, mesh, model_plan)
    return model


def _blocks(model):
    inner = getattr(model, "transformer", None) or getattr(model, "model", None)
    return list(getattr(inner, "h", None) or getattr(inner, "layers"))


def _step(config, layout, rank, world):
    """One training step of the wrapped model on this rank's batch; phase(name) marks forward, backward, ..."""
    model, optimizer = _wrap(_model(config), layout)
    # Each data-parallel rank its own data, as a DistributedSampler gives; the ranks of a tensor-parallel
    # pair (2x2 mesh, rank = 2 * dp + tp) the same.
    g = torch.Generator().manual_seed(100 + (rank // 2 if layout == "fsdp-tp" else rank))
    ids = torch.randint(0, config["vocab_size"], (MICRO_BATCH, SEQ), generator=g)
    batch = {"input_ids": ids, "labels": ids.clone()}

    # Tensor parallelism computes the loss on the head's vocabulary shards: forward and backward under
    # loss_parallel, as its documentation asks.
    if layout in ("tp", "tp-sp", "fsdp-tp"):
        from torch.distributed.tensor.parallel import loss_parallel
        sharded_loss = loss_parallel
    else:
        sharded_loss = contextlib.nullcontext

    micro_batches = ACCUMULATED if layout == "ddp-no-sync" else 1

    def step(phase):
        # The usual accumulation loop: every micro-batch but the last skips DDP's all-reduce (no_sync), and each
        # output is dropped when the next forward's replaces it; the hand loop keeps the last one through
        # backward and the optimizer step.
        for i in range(micro_batches):
            phase("forward")
            sync = model.no_sync() if i < micro_batches - 1 else contextlib.nullcontext()
            with sync, sharded_loss():
                out = model(**batch)
                phase("backward")
                (out.loss if micro_batches == 1 else out.loss / micro_batches).backward()
        phase("optimizer")
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        phase("done")
        del out
    return step


class _LlamaStage(torch.nn.Module):
    """The layers of one pipeline stage of a Llama: the first also embeds the tokens, the last also normalizes
    and projects to the vocabulary. What the other stages hold is dropped."""

    def __init__(self, model, stage, stages):
        super().__init__()
        layers = list(model.model.layers)
        per = len(layers) // stages
        self.first, self.last = stage == 0, stage == stages - 1
        model.model.layers = torch.nn.ModuleList(layers[stage * per:(stage + 1) * per])
        if not self.first:
            model.model.embed_tokens = None
        if not self.last:
            model.model.norm = torch.nn.Identity()
            model.lm_head = None
        self.model = model

    def forward(self, x):
        if self.first:
            hidden = self.model.model(input_ids=x).last_hidden_state
        else:
            hidden = self.model.model(inputs_embeds=x).last_hidden_state
        return self.model.lm_head(hidden) if self.last else hidden


def _causal_lm_loss(logits, labels):
    """transformers' ForCausalLMLoss: fp32 logits, labels shifted left by one, mean cross-entropy."""
    labels = torch.nn.functional.pad(labels, (0, 1), value=-100)[..., 1:].contiguous()
    logits = logits.float()
    return torch.nn.functional.cross_entropy(logits.view(-1, logits.size(-1)), labels.view(-1), ignore_index=-100)


def _pipeline_step(config, layout, rank, world):
    """torch.distributed.pipelining: one stage per rank, PIPELINE_MICRO_BATCHES micro-batches per step under
    GPipe (every forward, then every backward) or 1F1B (at most stages - stage micro-batches in flight)."""
    from torch.distributed.pipelining import PipelineStage, Schedule1F1B, ScheduleGPipe
    stage = _LlamaStage(_model(config), rank, world)
    pipeline = PipelineStage(stage, rank, world, torch.device("cpu"))
    schedule_class = {"pp-1f1b": Schedule1F1B, "pp-gpipe": ScheduleGPipe}[layout]
    schedule = schedule_class(pipeline, n_microbatches=PIPELINE_MICRO_BATCHES, loss_fn=_causal_lm_loss)
    optimizer = torch.optim.AdamW(stage.parameters(), lr=1e-4, foreach=True)
    g = torch.Generator().manual_seed(100)  # one batch enters the first stage; the last one scores it
    ids = torch.randint(0, config["vocab_size"], (MICRO_BATCH * PIPELINE_MICRO_BATCHES, SEQ), generator=g)

    def step(phase):
        phase("forward")  # forwards and backwards interleave: the peak's phase is not recorded
        if stage.first:
            schedule.step(ids)
        elif stage.last:
            # The default (return_outputs=True) keeps every micro-batch's logits until the step returns them.
            schedule.step(target=ids, losses=[], return_outputs=False)
        else:
            schedule.step()
        phase("optimizer")
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        phase("done")
    return step


def _rank(rank, world, port, name, result_path):
    config, layout, _, _, _ = CONFIGS[name]
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    counters = hooks.CpuHook()
    torch.manual_seed(0)
    step = (_pipeline_step if layout.startswith("pp-") else _step)(config, layout, rank, world)

    step(lambda phase: None)
    gc.collect()
    dist.barrier()
    marker = hooks.OpMarker(counters)

    def phase(name):
        marker.phase = name

    baseline = counters.live()
    counters.reset_peak()
    with marker:
        step(phase)
    peak = counters.peak()
    if counters.dropped():
        raise RuntimeError(f"rank {rank}: the allocation hook's table overflowed")
    measured = {"rank": rank, "baseline_bytes": baseline, "peak_allocated_bytes": peak, "ops": len(marker.ops)}
    i = counters.peak_mark()
    if 0 <= i < len(marker.ops):
        measured["peak_op"], measured["peak_phase"] = marker.ops[i]
        if layout.startswith("pp-") and measured["peak_phase"] == "forward":
            del measured["peak_phase"]  # the schedule's forwards and backwards are not told apart
    # The same step again, its forward's saved tensors counted (as validation/record does, in a step of its own).
    saved = hooks.SavedTensors()
    counters.reset_peak()
    step(saved.forward_phase())
    measured["repeat_peak_allocated_bytes"] = counters.peak()
    measured["saved_for_backward_bytes"] = saved.bytes()
    with open(result_path, "w") as f:
        json.dump(measured, f)
    dist.barrier()
    dist.destroy_process_group()


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run(name):
    """Runs the configuration on its ranks; returns each rank's measurement."""
    world = CONFIGS[name][2]
    with tempfile.TemporaryDirectory() as folder:
        paths = [os.path.join(folder, f"rank{r}.json") for r in range(world)]
        context = mp.start_processes(_rank_entry, args=(world, _free_port(), name, folder), nprocs=world,
                                     join=False, start_method="spawn")
        while not context.join():
            pass
        ranks = []
        for path in paths:
            with open(path) as f:
                ranks.append(json.load(f))
    return ranks


def _rank_entry(rank, world, port, name, folder):
    torch.set_num_threads(1)  # ranks share the machine's cores
    _rank(rank, world, port, name, os.path.join(folder, f"rank{rank}.json"))


def _shard_group(layout, world):
    """The ranks that shard the model states: two in a 2x2 mesh, all of them otherwise."""
    return 2 if layout in ("hsdp", "fsdp-tp") else world


def peer_estimates(name):
    """Other tools' figures for one rank (headroom_validation.peers), computed in validation/.venv, where
    DeepSpeed and accelerate are installed (validation/setup makes it)."""
    config, layout, world, flags, _ = CONFIGS[name]
    python = pathlib.Path(__file__).resolve().parents[1] / ".venv" / "bin" / "python"
    request = {"model": config, "layout": layout, "shard_group": _shard_group(layout, world), "world": world,
               "flags": flags, "micro_batch": MICRO_BATCH, "seq": SEQ}
    done = subprocess.run([str(python), "-m", "headroom_validation.peers"], input=json.dumps(request),
                          capture_output=True, text=True, check=True, cwd=pathlib.Path(__file__).resolve().parents[1],
                          env={k: v for k, v in os.environ.items() if k != "LD_PRELOAD"})
    return json.loads(done.stdout.strip().splitlines()[-1])  # DeepSpeed logs to stdout before it


def estimate_args(name, versions):
    _, layout, _, flags, _ = CONFIGS[name]
    torch_flag = ".".join(versions["torch"].split("+")[0].split(".")[:2])
    tf_flag = ".".join(versions["transformers"].split(".")[:2])
    return ["--torch", torch_flag, "--transformers", tf_flag, *STEP_FLAGS, "--optimizer-impl",
            "foreach" if _foreach(layout) else "for-loop", *flags]


def fixture(name, ranks):
    import transformers
    config, layout, world, _, description = CONFIGS[name]
    versions = {"torch": torch.__version__, "transformers": transformers.__version__, "python": sys.version.split()[0]}
    measured = {k: v for k, v in ranks[0].items() if k != "rank"}
    return {
        "headroom_fixture_version": FIXTURE_VERSION,
        "name": name,
        "description": f"{description}; {world} ranks (gloo, one process each), fp32 on cpu, batch "
                       f"{MICRO_BATCH}x{SEQ} per rank",
        "device": "cpu",
        "versions": versions,
        "model": config,
        "estimate_args": estimate_args(name, versions),
        "measured": measured,
        "ranks": [{k: v for k, v in r.items() if k != "rank"} for r in ranks],
        "setup": {"layout": layout, "world_size": world},
        "peers": peer_estimates(name),
    }


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=pathlib.Path, help="write one fixture per configuration here")
    parser.add_argument("--rewrite-args", action="store_true",
                        help="rewrite the estimate_args and peers of the fixtures in --out; measure nothing")
    parser.add_argument("names", nargs="*", help=f"configurations (default: all): {', '.join(CONFIGS)}")
    args = parser.parse_args(argv)
    if args.rewrite_args:
        for path in sorted(args.out.glob("*.json")):
            document = json.loads(path.read_text())
            document["estimate_args"] = estimate_args(document["name"], document["versions"])
            document["peers"] = peer_estimates(document["name"])
            path.write_text(json.dumps(document, indent=1) + "\n")
        return
    for name in args.names:
        if name not in CONFIGS:
            parser.error(f"unknown configuration {name!r} (known: {', '.join(CONFIGS)})")
    for name in args.names or CONFIGS:
        ranks = run(name)
        peaks = ", ".join(f"rank {r['rank']} {r['peak_allocated_bytes'] / 2**20:.2f} MiB "
                          f"({r.get('peak_phase', '?')}: {r.get('peak_op', '?')})" for r in ranks)
        print(f"{name}: {peaks}", flush=True)
        if args.out:
            args.out.mkdir(parents=True, exist_ok=True)
            with open(args.out / f"{name}.json", "w") as f:
                json.dump(fixture(name, ranks), f, indent=1)
                f.write("\n")


if __name__ == "__main__":
    main()
