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
ranks that shard the states; and Megatron-LM's theoretical memory (_megatron: its activation formula from
Korthikanti et al. 2022 and its model-state bytes per parameter). It runs in validation/.venv, where DeepSpeed
and accelerate are installed.
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


def _flag(flags, name, default=1):
    return int(flags[flags.index(name) + 1]) if name in flags else default


def _megatron(config, model, layout, request):
    """Megatron-LM's theoretical memory for one rank, written from its sources' published figures:

    - activations of one transformer layer (Korthikanti et al. 2022, "Reducing Activation Recomputation in Large
      Transformer Models", Table 2), in bytes, for 16-bit activations and 1-byte dropout masks: sbh(34 + 5as/h)
      without parallelism, sbh(10 + 24/t + 5as/(ht)) under tensor parallelism t, sbh/t (34 + 5as/h) with
      sequence parallelism; with 1F1B the first pipeline stage holds p micro-batches of its L/p layers, so L
      layers' worth (their Section 4.2.3), the stage Megatron reports;
    - model states (Megatron-LM's docs, distributed optimizer): 18 bytes per parameter for 16-bit parameters with
      fp32 gradients, master weights and Adam moments, or 6 + 12/d with its distributed optimizer over d
      data-parallel ranks (taken here for ZeroRedundancyOptimizer and FSDP, its nearest layout); the parameters of
      the most loaded rank: the first stage's (embedding and its layers), divided by t, experts by the
      expert-parallel degree.
    It assumes Megatron's own kernels and 16-bit activations; the fixtures run fp32 on the CPU."""
    flags = request["flags"]
    t, p, e = _flag(flags, "--tp"), _flag(flags, "--pp"), _flag(flags, "--ep")
    sp = "--sp" in flags
    s, b = request["seq"], request["micro_batch"]
    h, a = config.get("hidden_size", config.get("n_embd")), config.get("num_attention_heads", config.get("n_head"))
    layers = config.get("num_hidden_layers", config.get("n_layer"))
    if sp:
        per_layer = s * b * h / t * (34 + 5 * a * s / h)
    elif t > 1:
        per_layer = s * b * h * (10 + 24 / t + 5 * a * s / (h * t))
    else:
        per_layer = s * b * h * (34 + 5 * a * s / h)
    first_stage = 0.0
    for name, parameter in model.named_parameters():
        index = next((int(part) for part in name.split(".") if part.isdigit()), None)
        if index is not None and index >= layers // p:
            continue  # a later stage's layer
        if index is None and p > 1 and "emb" not in name and "wte" not in name and "wpe" not in name:
            continue  # the final norm and the head sit on the last stage
        share = 1 / e if ".experts." in name else 1
        first_stage += parameter.numel() * share / t
    distributed_optimizer = layout == "zero1" or layout.startswith("fsdp") or layout == "hsdp"
    d = request["shard_group"]
    per_parameter = 6 + 12 / d if distributed_optimizer else 18
    optimizer = f"distributed optimizer over {d}" if distributed_optimizer else "18 bytes per parameter"
    return {"bytes": int(first_stage * per_parameter + layers * per_layer),
            "what": f"theoretical memory, first stage: {optimizer}, 16-bit activations (Korthikanti et al. 2022)"}


def distributed_peer_estimates(config, layout, shard_group, request=None):
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
    if request is not None:
        out["megatron"] = _megatron(config, model, layout, request)
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
    json.dump(distributed_peer_estimates(request["model"], request["layout"], request["shard_group"], request),
              sys.stdout)
