"""Builds what one configuration runs: the model, its optimizer, a batch, and the step itself.

Models come from Hugging Face transformers (built from a config with random weights, nothing downloaded),
peft for LoRA, and torchvision for CNNs. A configuration is a dict (see configs.py); build() turns it into a
Workload whose step() runs one training step (forward, loss, backward, optimizer step, zero_grad) or one
inference forward, calling phase() at each boundary so the harness can name where the peak happened.
by_name() also knows `lstm`, a recurrent model that no configuration covers (only the allocator's traces use it).
"""
import contextlib
import functools

import torch
import torch.nn.functional as F

from . import configs


class Workload:
    def __init__(self, model, optimizer, batch, step, estimate_model, notes):
        self.model = model
        self.optimizer = optimizer
        self.batch = batch
        self.step = step
        self.estimate_model = estimate_model  # what `headroom estimate --model` reads (a config.json dict)
        self.notes = notes


def _autocast(cfg, device):
    if cfg["precision"] in ("bf16-mixed", "fp16-mixed"):
        dtype = torch.bfloat16 if cfg["precision"] == "bf16-mixed" else torch.float16
        return torch.autocast(device_type=device.type, dtype=dtype)
    return contextlib.nullcontext()


def _optimizer(cfg, params):
    name, impl = cfg["optimizer"], cfg.get("optimizer_impl")
    kw = {}
    if impl == "foreach":
        kw["foreach"] = True
    elif impl == "for-loop":
        kw["foreach"] = False
    elif impl == "fused":
        kw["fused"] = True
    if name == "adamw":
        return torch.optim.AdamW(params, lr=1e-4, weight_decay=0.01, **kw)
    if name == "sgd-momentum":
        return torch.optim.SGD(params, lr=1e-3, momentum=0.9, **kw)
    if name == "adafactor":
        from transformers.optimization import Adafactor
        return Adafactor(params, lr=1e-3, relative_step=False, scale_parameter=False, warmup_init=False)
    raise ValueError(f"unknown optimizer {name!r}")


def _hf_model(cfg, device):
    import transformers
    spec = cfg["model"]
    config = transformers.AutoConfig.for_model(**spec["config"])
    config.architectures = [spec["architecture"]]
    config.use_cache = bool(cfg.get("inference"))
    head = getattr(transformers, spec["architecture"])
    model = head._from_config(config, attn_implementation=cfg.get("attention", "eager"))
    estimate_model = model.config.to_dict()
    estimate_model.pop("_attn_implementation_autoset", None)
    return model, estimate_model


def _selective_checkpoint(model):
    """Checkpoints only eager attention's core (QK^T, softmax, dropout, PV): GPT-2's _attn method before
    transformers 4.48, its module-level eager_attention_forward, which GPT2Attention.forward looks up when it
    runs, after."""
    from torch.utils.checkpoint import checkpoint
    if hasattr(model.transformer.h[0].attn, "_attn"):
        for block in model.transformer.h:
            attn = block.attn
            attn._attn = functools.partial(checkpoint, attn._attn, use_reentrant=False)
        return
    from transformers.models.gpt2 import modeling_gpt2
    core = modeling_gpt2.eager_attention_forward
    modeling_gpt2.eager_attention_forward = functools.partial(checkpoint, core, use_reentrant=False)


def build(cfg, device):
    torch.manual_seed(0)
    spec = cfg["model"]
    notes = []
    if spec["source"] == "transformers":
        model, estimate_model = _hf_model(cfg, device)
    elif spec["source"] == "torchvision":
        import torchvision
        model = getattr(torchvision.models, spec["name"])(num_classes=spec["num_classes"])
        estimate_model = {"architectures": [spec["name"]], "image_size": spec["image_size"],
                          "num_classes": spec["num_classes"]}
    else:
        raise ValueError(f"unknown model source {spec['source']!r}")

    if cfg.get("lora"):
        import peft
        lora = cfg["lora"]
        model = peft.get_peft_model(model, peft.LoraConfig(r=lora["rank"], lora_alpha=lora["alpha"],
                                                           lora_dropout=lora["dropout"],
                                                           target_modules=lora["targets"]))
    if cfg["precision"] == "bf16":
        model = model.to(torch.bfloat16)
    model = model.to(device)

    checkpoint = cfg.get("checkpoint", "none")
    if checkpoint == "full":
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    elif checkpoint == "selective":
        _selective_checkpoint(model)

    inference = cfg.get("inference")
    b = cfg["micro_batch"]
    if spec["source"] == "torchvision":
        s = spec["image_size"]
        x = torch.randn(b, 3, s, s, device=device,
                        dtype=torch.bfloat16 if cfg["precision"] == "bf16" else torch.float32)
        y = torch.randint(0, spec["num_classes"], (b,), device=device)
        batch = {"x": x, "labels": y}

        def forward_loss():
            logits = model(batch["x"])
            return logits, F.cross_entropy(logits, batch["labels"])
    else:
        vocab = estimate_model["vocab_size"]
        ids = torch.randint(0, vocab, (b, cfg["seq"]), device=device)
        batch = {"input_ids": ids} if inference else {"input_ids": ids, "labels": ids.clone()}

        def forward_loss():
            out = model(**batch)
            return out, None if inference else out.loss

    if inference:
        model.eval()

        def step(phase):
            phase("forward")
            with torch.no_grad(), _autocast(cfg, device):
                out = model(**batch, use_cache=True)
            phase("done")
            return out
        return Workload(model, None, batch, step, estimate_model, notes)

    model.train()
    optimizer = _optimizer(cfg, [p for p in model.parameters() if p.requires_grad])
    loop = cfg.get("loop", "hand")

    def step(phase):
        phase("forward")
        if loop == "hand":
            # `out = model(**batch); out.loss.backward()`: out (the logits) lives through backward and the step.
            with _autocast(cfg, device):
                out, loss = forward_loss()
            phase("backward")
            loss.backward()
        else:
            # Hugging Face Trainer: compute_loss returns the loss alone, the outputs die before backward.
            def compute_loss():
                with _autocast(cfg, device):
                    return forward_loss()[1]
            loss = compute_loss()
            phase("backward")
            loss.backward()
            out = None
        del loss
        phase("optimizer")
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        phase("done")
        return out

    return Workload(model, optimizer, batch, step, estimate_model, notes)


class LstmLanguageModel(torch.nn.Module):
    """A 4-layer LSTM language model: hidden 512, vocabulary 8192."""

    def __init__(self, vocab=8192, hidden=512, layers=4):
        super().__init__()
        self.embed = torch.nn.Embedding(vocab, hidden)
        self.lstm = torch.nn.LSTM(hidden, hidden, num_layers=layers, batch_first=True)
        self.head = torch.nn.Linear(hidden, vocab)

    def forward(self, ids):
        out, _ = self.lstm(self.embed(ids))
        return self.head(out)


def build_lstm(device):
    """The LSTM language model trained with AdamW on batches of 16 x 128 random tokens, a fresh batch each step."""
    torch.manual_seed(0)
    model = LstmLanguageModel().to(device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    vocab = model.head.out_features
    batch = {}

    def step(phase):
        phase("forward")
        # Rebinding frees the last step's batch once this one is drawn, as a loop's `ids = ...` does.
        batch["ids"] = torch.randint(0, vocab, (16, 129), device=device)
        ids = batch["ids"]
        logits = model(ids[:, :-1])
        loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), ids[:, 1:].reshape(-1))
        phase("backward")
        loss.backward()
        phase("optimizer")
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        del logits, loss, ids  # the logits live through the optimizer step, as in a loop that logs them
        phase("done")

    return Workload(model, optimizer, batch, step, None, "LSTM language model (not a configuration)")


def by_name(name, device):
    """build() for the configuration of that name (configs.py), or build_lstm() for `lstm`."""
    return build_lstm(device) if name == "lstm" else build(configs.by_name(name), device)


def check_name(name):
    """Raises ValueError, naming it, if `name` is neither a configuration nor `lstm`."""
    if name != "lstm" and name not in {c["name"] for c in configs.CONFIGS}:
        raise ValueError(f"{name}: neither a configuration of configs.py nor lstm")
