"""Runs a training step on several ranks with torch.distributed and measures every rank.

    python -m headroom_validation.distributed --out validation/fixtures/distributed [NAME ...]

Each configuration (CONFIGS) starts its ranks as processes on this machine (gloo on the loopback address, the
way torchrun would start them on GPUs with NCCL), each with the allocation hook (validation/alloc_hook.c)
counting its own tensor bytes. A rank builds the same small Hugging Face model from the same seed, wraps it as
the layout says (DDP, ZeroRedundancyOptimizer, FSDP2's fully_shard), runs a warm-up step (optimizer state,
buckets, sharded states exist as in any later step) and then the measured one: the bytes live before it, their
peak, the op and phase at the peak, and (in a third step) the bytes its forward saves for backward. The fixture
is an estimate fixture (report/validation_fixture.h) whose `ranks` hold every rank's figures and `measured` rank
0's; its `estimate_args` are the `headroom estimate` flags of one rank of the same layout.
"""
import argparse
import contextlib
import gc
import json
import os
import pathlib
import socket
import sys
import tempfile

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

MICRO_BATCH, SEQ = 2, 256
# The step's setup as `headroom estimate` flags (--torch and --transformers are added from what runs).
STEP_FLAGS = ["--kernels", "cpu", "--micro-batch", str(MICRO_BATCH), "--seq", str(SEQ), "--precision", "fp32",
              "--optimizer", "adamw", "--optimizer-impl", "foreach", "--checkpoint", "none", "--loop", "hand",
              "--attention", "eager"]

# name -> (model config, layout, world size, the layout's headroom flags, description)
CONFIGS = {
    "gpt2-ddp-2": (GPT2, "ddp", 2, ["--gpus", "2"], "DDP (25 MiB buckets, gradients copied into them)"),
    "llama-gqa-ddp-2": (LLAMA, "ddp", 2, ["--gpus", "2"], "DDP (25 MiB buckets, gradients copied into them)"),
    "gpt2-zero1-2": (GPT2, "zero1", 2, ["--gpus", "2", "--zero", "1"],
                     "ZeroRedundancyOptimizer over AdamW (optimizer state sharded), DDP for the gradients"),
    "gpt2-fsdp2-2": (GPT2, "fsdp2", 2, ["--gpus", "2", "--fsdp", "full"],
                     "FSDP2 fully_shard on every block and the root, reshard_after_forward=True"),
    "llama-gqa-fsdp2-2": (LLAMA, "fsdp2", 2, ["--gpus", "2", "--fsdp", "full"],
                          "FSDP2 fully_shard on every block and the root, reshard_after_forward=True"),
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
    adamw = dict(lr=1e-4, foreach=True)
    if layout == "ddp":
        model = torch.nn.parallel.DistributedDataParallel(model)
        return model, torch.optim.AdamW(model.parameters(), **adamw)
    if layout == "zero1":
        from torch.distributed.optim import ZeroRedundancyOptimizer
        model = torch.nn.parallel.DistributedDataParallel(model)
        return model, ZeroRedundancyOptimizer(model.parameters(), optimizer_class=torch.optim.AdamW, **adamw)
    if layout == "fsdp2":
        from torch.distributed.fsdp import fully_shard
        from torch.distributed.device_mesh import init_device_mesh
        mesh = init_device_mesh("cpu", (dist.get_world_size(),))
        for block in _blocks(model):
            fully_shard(block, mesh=mesh, reshard_after_forward=True)
        fully_shard(model, mesh=mesh, reshard_after_forward=True)
        return model, torch.optim.AdamW(model.parameters(), **adamw)
    raise ValueError(f"unknown layout {layout!r}")


def _blocks(model):
    inner = getattr(model, "transformer", None) or getattr(model, "model", None)
    return list(getattr(inner, "h", None) or getattr(inner, "layers"))


def _rank(rank, world, port, name, result_path):
    config, layout, _, _, _ = CONFIGS[name]
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    counters = hooks.CpuHook()
    torch.manual_seed(0)
    model, optimizer = _wrap(_model(config), layout)
    g = torch.Generator().manual_seed(100 + rank)  # each rank its own data, as a DistributedSampler gives
    ids = torch.randint(0, config["vocab_size"], (MICRO_BATCH, SEQ), generator=g)
    batch = {"input_ids": ids, "labels": ids.clone()}

    def step(phase):
        phase("forward")
        out = model(**batch)  # the hand loop: the output lives through backward and the step
        phase("backward")
        out.loss.backward()
        phase("optimizer")
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        phase("done")
        del out

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
    # The same step again, its forward's saved tensors counted (as validation/record does, in a step of its own).
    saved = hooks.SavedTensors()
    forward_hooks = contextlib.ExitStack()

    def saved_phase(name):
        if name == "forward":
            forward_hooks.enter_context(saved.hooks())
        else:
            forward_hooks.close()

    counters.reset_peak()
    step(saved_phase)
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


def fixture(name, ranks):
    import transformers
    config, layout, world, flags, description = CONFIGS[name]
    versions = {"torch": torch.__version__, "transformers": transformers.__version__, "python": sys.version.split()[0]}
    torch_flag = ".".join(torch.__version__.split("+")[0].split(".")[:2])
    tf_flag = ".".join(transformers.__version__.split(".")[:2])
    measured = {k: v for k, v in ranks[0].items() if k != "rank"}
    return {
        "headroom_fixture_version": FIXTURE_VERSION,
        "name": name,
        "description": f"{description}; {world} ranks (gloo, one process each), fp32 on cpu, batch "
                       f"{MICRO_BATCH}x{SEQ} per rank",
        "device": "cpu",
        "versions": versions,
        "model": config,
        "estimate_args": ["--torch", torch_flag, "--transformers", tf_flag, *STEP_FLAGS, *flags],
        "measured": measured,
        "ranks": [{k: v for k, v in r.items() if k != "rank"} for r in ranks],
        "setup": {"layout": layout, "world_size": world},
    }


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=pathlib.Path, help="write one fixture per configuration here")
    parser.add_argument("names", nargs="*", help=f"configurations (default: all): {', '.join(CONFIGS)}")
    args = parser.parse_args(argv)
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
