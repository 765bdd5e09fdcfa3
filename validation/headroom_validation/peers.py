"""Other tools' estimates for a fixture's configuration, recorded beside the measurement.

- accelerate's `accelerate estimate-memory` (gather_data, as its command runs it): for training, the largest
  of its "Training using Adam" stages for the run's dtype; for inference, the model's size in that dtype.
- DeepSpeed's ZeRO-2 model-state estimator (estimate_zero2_model_states_mem_needs, one GPU, no offload):
  the GPU bytes it gives for the model's parameters; training only.
Both see only the model's parameters (no batch, sequence or activations), which is what they are.

For a configuration on several ranks (headroom_validation.distributed), `python -m headroom_validation.peers`
reads {"model", "layout", "shard_group"} on stdin and prints the tools' figures for one rank: accelerate's as
above (it knows no layout), and DeepSpeed's estimator for the ZeRO stage nearest the layout, as a user of
that layout would reach for it: ZeRO-2's for ZeroRedundancyOptimizer (DeepSpeed has no ZeRO-1 estimator),
ZeRO-3's for FSDP (estimate_zero3_model_states_mem_needs, with the largest module's own parameters), over the
ranks that shard the states. It runs in validation/.venv, where DeepSpeed and accelerate are installed.
"""
import json
import sys


def _accelerate(fixture):
    # gather_data's own steps, without its Hub lookup (the config is local): create_empty_model builds
    # AutoModel.from_config under init_empty_weights, then calculate_maximum_sizes and estimate_training_usage.
    import transformers
    from accelerate import init_empty_weights
    from accelerate.commands.estimate import estimate_training_usage
    from accelerate.utils import calculate_maximum_sizes
    setup = fixture["setup"]
    dtype = "float32" if setup["precision"] == "fp32" else "bfloat16"
    config = transformers.AutoConfig.for_model(**fixture["model"])
    with init_empty_weights():
        model = transformers.AutoModel.from_config(config)
    total_size, _ = calculate_maximum_sizes(model)
    if setup.get("inference"):
        size = total_size / 2 if dtype == "bfloat16" else total_size
        return {"bytes": int(size), "what": f"model size in {dtype}"}
    training = estimate_training_usage(total_size, dtype)
    return {"bytes": int(max(training.values())), "what": f"training using Adam, {dtype} (largest stage)"}


def _deepspeed(fixture, parameters):
    from deepspeed.runtime.zero.stage_1_and_2 import estimate_zero2_model_states_mem_needs
    _, gpu = estimate_zero2_model_states_mem_needs(parameters, num_gpus_per_node=1, num_nodes=1, cpu_offload=False)
    return {"bytes": int(gpu), "what": "ZeRO-2 model states on 1 GPU, no offload"}


def peer_estimates(fixture, parameters):
    """{tool: {"bytes", "what"}} for `fixture` (a model of `parameters` parameters); tools that do not apply
    (torchvision CNNs for accelerate, inference for DeepSpeed) are left out."""
    tools = []
    if fixture["model"].get("model_type"):  # a transformers config
        tools.append(("accelerate", lambda: _accelerate(fixture)))
    if not fixture["setup"].get("inference"):
        tools.append(("deepspeed", lambda: _deepspeed(fixture, parameters)))
    out = {}
    for name, estimate in tools:
        try:
            out[name] = estimate()
        except ImportError:  # not installed here (a GPU machine brings its own packages)
            fixture["notes"].append(f"{name} is not installed: no estimate from it")
    return out


def _largest_module_parameters(model):
    return max(sum(p.numel() for p in m.parameters(recurse=False)) for m in model.modules())


def distributed_peer_estimates(config, layout, shard_group):
    """{tool: {"bytes", "what"}} for one rank of `layout` (distributed.CONFIGS' names) on a model of `config`."""
    import transformers
    from accelerate import init_empty_weights
    document = dict(config)
    model_type = document.pop("model_type")
    hf_config = transformers.AutoConfig.for_model(model_type, **document)
    with init_empty_weights():
        model = getattr(transformers, config["architectures"][0])(hf_config)
    parameters = sum(p.numel() for p in model.parameters())
    out = {"accelerate": _accelerate({"setup": {"precision": "fp32"}, "model": config})}
    if layout == "zero1":
        from deepspeed.runtime.zero.stage_1_and_2 import estimate_zero2_model_states_mem_needs
        _, gpu = estimate_zero2_model_states_mem_needs(parameters, num_gpus_per_node=shard_group, num_nodes=1,
                                                       cpu_offload=False)
        out["deepspeed"] = {"bytes": int(gpu), "what": f"ZeRO-2 model states over {shard_group} GPUs"}
    elif layout.startswith("fsdp") or layout == "hsdp":
        from deepspeed.runtime.zero.stage3 import estimate_zero3_model_states_mem_needs
        _, gpu, _ = estimate_zero3_model_states_mem_needs(parameters, _largest_module_parameters(model),
                                                          num_gpus_per_node=shard_group, num_nodes=1,
                                                          cpu_offload=False, cpu_offload_params=False)
        out["deepspeed"] = {"bytes": int(gpu), "what": f"ZeRO-3 model states over {shard_group} GPUs"}
    return out


if __name__ == "__main__":
    request = json.load(sys.stdin)
    json.dump(distributed_peer_estimates(request["model"], request["layout"], request["shard_group"]), sys.stdout)
