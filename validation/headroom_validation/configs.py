"""The configurations the harness measures, and the `headroom estimate` flags that describe each.

Sizes are reduced so that a step runs in seconds on a CPU, but keep the real models' proportions
(a vocabulary tens of times the hidden size, an MLP 2.7-4x it), so the same tensors dominate.
"""

LLAMA = {"model_type": "llama", "hidden_size": 256, "intermediate_size": 688, "num_hidden_layers": 4,
         "num_attention_heads": 8, "num_key_value_heads": 8, "vocab_size": 8192, "max_position_embeddings": 1024,
         "tie_word_embeddings": False}
LLAMA_GQA = dict(LLAMA, num_key_value_heads=2)
QWEN2 = {"model_type": "qwen2", "hidden_size": 256, "intermediate_size": 704, "num_hidden_layers": 4,
         "num_attention_heads": 8, "num_key_value_heads": 2, "vocab_size": 12288,
         "max_position_embeddings": 1024, "tie_word_embeddings": True, "use_sliding_window": False}
MISTRAL = {"model_type": "mistral", "hidden_size": 256, "intermediate_size": 896, "num_hidden_layers": 4,
           "num_attention_heads": 8, "num_key_value_heads": 2, "vocab_size": 8192,
           "max_position_embeddings": 1024, "sliding_window": 4096, "tie_word_embeddings": False}
GPT2 = {"model_type": "gpt2", "n_embd": 256, "n_layer": 4, "n_head": 8, "vocab_size": 8192, "n_positions": 1024}
BERT = {"model_type": "bert", "hidden_size": 256, "num_hidden_layers": 4, "num_attention_heads": 8,
        "intermediate_size": 1024, "vocab_size": 8192, "max_position_embeddings": 512}
# Gemma 2 with a decoupled head_dim (4 x 128 != 256), soft-capping and a window shorter than the sequence.
GEMMA2 = {"model_type": "gemma2", "hidden_size": 256, "intermediate_size": 768, "num_hidden_layers": 4,
          "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 128, "vocab_size": 12288,
          "max_position_embeddings": 1024, "sliding_window": 128, "query_pre_attn_scalar": 128,
          "attn_logit_softcapping": 50.0, "final_logit_softcapping": 30.0, "hidden_activation": "gelu_pytorch_tanh"}
GEMMA = {"model_type": "gemma", "hidden_size": 256, "intermediate_size": 1024, "num_hidden_layers": 4,
         "num_attention_heads": 4, "num_key_value_heads": 1, "head_dim": 128, "vocab_size": 12288,
         "max_position_embeddings": 1024, "hidden_activation": "gelu_pytorch_tanh"}
PHI3 = {"model_type": "phi3", "hidden_size": 256, "intermediate_size": 688, "num_hidden_layers": 4,
        "num_attention_heads": 8, "num_key_value_heads": 4, "vocab_size": 8192, "max_position_embeddings": 1024,
        "resid_pdrop": 0.1, "tie_word_embeddings": False, "pad_token_id": 0}
QWEN2_MOE = {"model_type": "qwen2_moe", "hidden_size": 256, "intermediate_size": 704, "num_hidden_layers": 2,
             "num_attention_heads": 8, "num_key_value_heads": 2, "vocab_size": 8192,
             "max_position_embeddings": 1024, "num_experts": 8, "num_experts_per_tok": 2,
             "moe_intermediate_size": 128, "shared_expert_intermediate_size": 512, "tie_word_embeddings": False,
             "use_sliding_window": False}
MIXTRAL = {"model_type": "mixtral", "hidden_size": 256, "intermediate_size": 512, "num_hidden_layers": 2,
           "num_attention_heads": 8, "num_key_value_heads": 2, "vocab_size": 8192,
           "max_position_embeddings": 1024, "num_local_experts": 4, "num_experts_per_tok": 2,
           "tie_word_embeddings": False}
# T5 v1.1 / Flan-T5's layout: gated GELU feed-forward, untied head, four encoder and four decoder blocks.
T5 = {"model_type": "t5", "d_model": 256, "d_ff": 704, "d_kv": 32, "num_layers": 4, "num_decoder_layers": 4,
      "num_heads": 8, "vocab_size": 8192, "feed_forward_proj": "gated-gelu", "tie_word_embeddings": False,
      "decoder_start_token_id": 0, "pad_token_id": 0}


def hf(architecture, config):
    return {"source": "transformers", "architecture": architecture, "config": config}


def tv(name, image_size, num_classes):
    return {"source": "torchvision", "name": name, "image_size": image_size, "num_classes": num_classes}


def cfg(name, description, model, devices=("cpu", "cuda"), **setup):
    base = {"micro_batch": 2, "seq": 256, "precision": "fp32", "optimizer": "adamw", "optimizer_impl": "for-loop",
            "checkpoint": "none", "attention": "eager", "loop": "hand"}
    base.update(setup)
    return dict(base, name=name, description=description, model=model, devices=list(devices))


CONFIGS = [
    cfg("llama-mha-fp32-adamw-loop", "Llama (MHA), fp32, AdamW for-loop", hf("LlamaForCausalLM", LLAMA)),
    cfg("llama-gqa-fp32-adamw-foreach", "Llama (GQA), fp32, AdamW foreach", hf("LlamaForCausalLM", LLAMA_GQA),
        optimizer_impl="foreach"),
    cfg("llama-gqa-fp32-trainer", "Llama (GQA), fp32, AdamW, Trainer-style loop (logits not held)",
        hf("LlamaForCausalLM", LLAMA_GQA), loop="trainer"),
    cfg("llama-gqa-fp32-ckpt-full", "Llama (GQA), fp32, AdamW, full checkpointing",
        hf("LlamaForCausalLM", LLAMA_GQA), checkpoint="full", micro_batch=4),
    cfg("llama-gqa-bf16-autocast", "Llama (GQA), bf16 autocast over fp32, AdamW", hf("LlamaForCausalLM", LLAMA_GQA),
        precision="bf16-mixed"),
    cfg("llama-gqa-bf16-pure", "Llama (GQA), pure bf16, AdamW", hf("LlamaForCausalLM", LLAMA_GQA),
        precision="bf16"),
    cfg("llama-gqa-fp32-sgd", "Llama (GQA), fp32, SGD with momentum", hf("LlamaForCausalLM", LLAMA_GQA),
        optimizer="sgd-momentum"),
    cfg("llama-gqa-fp32-adafactor", "Llama (GQA), fp32, Adafactor", hf("LlamaForCausalLM", LLAMA_GQA),
        optimizer="adafactor", optimizer_impl=None),
    cfg("llama-gqa-fp32-lora", "Llama (GQA), fp32, LoRA r=8 on q,v (peft), AdamW",
        hf("LlamaForCausalLM", LLAMA_GQA),
        lora={"rank": 8, "alpha": 16, "dropout": 0.0, "targets": ["q_proj", "v_proj"]}),
    cfg("llama-gqa-fp32-inference", "Llama (GQA), fp32 prefill of 512 tokens with a KV cache",
        hf("LlamaForCausalLM", LLAMA_GQA), inference=True, seq=512, optimizer=None, optimizer_impl=None),
    cfg("qwen2-fp32-adamw", "Qwen2 (GQA, qkv bias, tied embeddings), fp32, AdamW", hf("Qwen2ForCausalLM", QWEN2)),
    cfg("qwen2-bf16-autocast-ckpt", "Qwen2, bf16 autocast, full checkpointing", hf("Qwen2ForCausalLM", QWEN2),
        precision="bf16-mixed", checkpoint="full"),
    cfg("mistral-fp32-adamw-foreach", "Mistral (GQA), fp32, AdamW foreach", hf("MistralForCausalLM", MISTRAL),
        optimizer_impl="foreach"),
    cfg("gpt2-fp32-adamw", "GPT-2 (dropout 0.1, tied head), fp32, AdamW", hf("GPT2LMHeadModel", GPT2)),
    cfg("gpt2-fp32-ckpt-full", "GPT-2, fp32, full checkpointing", hf("GPT2LMHeadModel", GPT2), checkpoint="full",
        micro_batch=4),
    cfg("gpt2-fp32-ckpt-selective", "GPT-2, fp32, attention core checkpointed", hf("GPT2LMHeadModel", GPT2),
        checkpoint="selective"),
    cfg("gpt2-bf16-autocast", "GPT-2, bf16 autocast, AdamW foreach", hf("GPT2LMHeadModel", GPT2),
        precision="bf16-mixed", optimizer_impl="foreach"),
    cfg("gpt2-fp32-inference", "GPT-2, fp32 prefill of 512 tokens with a KV cache", hf("GPT2LMHeadModel", GPT2),
        inference=True, seq=512, optimizer=None, optimizer_impl=None),
    cfg("bert-fp32-mlm", "BERT masked LM, fp32, AdamW", hf("BertForMaskedLM", BERT), seq=128, micro_batch=4),
    # PyTorch 1.13's CPU autocast fails in BERT's prediction head (a bf16/fp32 layer_norm mismatch).
    cfg("bert-bf16-autocast", "BERT masked LM, bf16 autocast, AdamW", hf("BertForMaskedLM", BERT), seq=128,
        micro_batch=4, precision="bf16-mixed", devices=("cuda",)),
    # CUDA only: SDPA attention needs PyTorch 2, fused AdamW a GPU.
    cfg("llama-gqa-bf16-autocast-sdpa", "Llama (GQA), bf16 autocast, SDPA attention, AdamW fused",
        hf("LlamaForCausalLM", LLAMA_GQA), precision="bf16-mixed", attention="sdpa", optimizer_impl="fused",
        devices=("cuda",)),
    cfg("gpt2-bf16-autocast-sdpa-ckpt", "GPT-2, bf16 autocast, SDPA attention, full checkpointing, AdamW foreach",
        hf("GPT2LMHeadModel", GPT2), precision="bf16-mixed", attention="sdpa", checkpoint="full",
        optimizer_impl="foreach", devices=("cuda",)),
    # CUDA only: the caching allocator with expandable segments (PYTORCH_CUDA_ALLOC_CONF, as --alloc-conf).
    cfg("llama-gqa-fp32-adamw-expandable", "Llama (GQA), fp32, AdamW foreach, expandable segments",
        hf("LlamaForCausalLM", LLAMA_GQA), optimizer_impl="foreach", devices=("cuda",),
        env={"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True"}),
    cfg("gpt2-fp32-adamw-expandable", "GPT-2, fp32, AdamW, expandable segments", hf("GPT2LMHeadModel", GPT2),
        devices=("cuda",), env={"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True"}),
    cfg("mixtral-fp32-adamw", "Mixtral (4 experts, top-2), fp32, AdamW", hf("MixtralForCausalLM", MIXTRAL)),
    cfg("gemma2-fp32-adamw", "Gemma 2 (sandwich norms, soft-capping, sliding window), fp32, AdamW",
        hf("Gemma2ForCausalLM", GEMMA2)),
    cfg("gemma2-bf16-autocast-ckpt", "Gemma 2, bf16 autocast, full checkpointing", hf("Gemma2ForCausalLM", GEMMA2),
        precision="bf16-mixed", checkpoint="full"),
    cfg("phi3-fp32-adamw", "Phi-3 (fused qkv and gate/up projections, residual dropout), fp32, AdamW",
        hf("Phi3ForCausalLM", PHI3)),
    cfg("qwen2-moe-fp32-adamw", "Qwen2-MoE (8 experts, top-2, gated shared expert), fp32, AdamW",
        hf("Qwen2MoeForCausalLM", QWEN2_MOE)),
    cfg("gemma-fp32-adamw", "Gemma (MQA, (1 + w) RMSNorm, scaled embeddings), fp32, AdamW",
        hf("GemmaForCausalLM", GEMMA)),
    cfg("t5-fp32-adamw", "T5 v1.1 (encoder-decoder, gated GELU, untied head), fp32, AdamW",
        hf("T5ForConditionalGeneration", T5)),
    cfg("resnet50-fp32-sgd", "ResNet-50 at 64x64, 100 classes, fp32, SGD with momentum",
        tv("resnet50", 64, 100), micro_batch=8, optimizer="sgd-momentum", seq=None),
    # The same step with oneDNN held to AVX2 (as on a CPU without AVX-512): its backward-weights kernel for the
    # 3x3 convolutions on layer4's 2x2 maps takes four weight-sized buffers per thread, which Headroom does not
    # model (README, "Known misses").
    cfg("resnet50-fp32-sgd-avx2", "ResNet-50 as above, oneDNN held to AVX2 (ONEDNN_MAX_CPU_ISA=AVX2)",
        tv("resnet50", 64, 100), devices=("cpu",), micro_batch=8, optimizer="sgd-momentum", seq=None,
        env={"ONEDNN_MAX_CPU_ISA": "AVX2"}),
    cfg("vgg16-fp32-sgd", "VGG-16 at 64x64, 100 classes, fp32, SGD with momentum", tv("vgg16", 64, 100),
        micro_batch=4, optimizer="sgd-momentum", seq=None),
]


def by_name(name):
    for c in CONFIGS:
        if c["name"] == name:
            return c
    raise KeyError(name)


def estimate_args(c, device, versions):
    """The `headroom estimate` flags for configuration `c` run on `device` ("cpu" or "cuda") by the fixture's
    `versions` of PyTorch and transformers (the model comes from the fixture's "model")."""
    def major_minor(version):
        return ".".join(version.split("+")[0].split(".")[:2])

    args = ["--torch", major_minor(versions["torch"]), "--kernels", "cpu" if device == "cpu" else "cuda"]
    if c["model"]["source"] == "transformers":
        args += ["--transformers", major_minor(versions["transformers"])]
    args += ["--micro-batch", str(c["micro_batch"])]
    if c.get("seq"):
        args += ["--seq", str(c["seq"])]
    if c.get("inference"):
        # transformers' DynamicCache: contiguous, filled as the forward runs (--kv-block-size 0).
        args += ["--inference", "--context", str(c["seq"]), "--kv-block-size", "0", "--precision", c["precision"]]
    else:
        args += ["--precision", c["precision"], "--optimizer", c["optimizer"]]
        if c.get("optimizer_impl"):
            args += ["--optimizer-impl", c["optimizer_impl"]]
        args += ["--checkpoint", c["checkpoint"], "--loop", c["loop"]]
        if c.get("lora"):
            lora = c["lora"]
            args += ["--lora-rank", str(lora["rank"]), "--lora-alpha", str(lora["alpha"]),
                     "--lora-targets", ",".join(lora["targets"])]
    args += ["--attention", "eager" if c["attention"] == "eager" else "flash"]
    if "PYTORCH_CUDA_ALLOC_CONF" in c.get("env", {}):
        args += ["--alloc-conf", c["env"]["PYTORCH_CUDA_ALLOC_CONF"]]
    return args
