"""Where a traced model comes from (a Hugging Face config.json, a torchvision name, a user's constructor), built
on the meta device, with the inputs and the loss a training step gives it."""

import contextlib
import importlib
import inspect
import json
import os
import pathlib
import sys
from dataclasses import dataclass, field
from typing import Callable, List, Optional

import torch
import torch.nn.functional as F

from .recorder import TraceError

_TORCH_DTYPES = {"f32": torch.float32, "bf16": torch.bfloat16, "f16": torch.float16, "f64": torch.float64,
                 "i64": torch.int64, "i32": torch.int32, "bool": torch.bool}


def torch_dtype(name, what):
    try:
        return _TORCH_DTYPES[name]
    except KeyError:
        raise TraceError(f"{what}: unknown dtype '{name}' (one of {', '.join(_TORCH_DTYPES)})") from None


@contextlib.contextmanager
def on_meta():
    """Builds modules without memory: parameters and buffers land on the meta device.

    PyTorch 2.x makes meta the default device. On 1.13 each parameter and buffer is moved to meta as it is
    registered, before its module initializes it, so a 70B model costs no memory and no init time."""
    if hasattr(torch.device("meta"), "__enter__"):
        with torch.device("meta"):
            yield
        return
    module_cls = torch.nn.Module
    register_parameter, register_buffer = module_cls.register_parameter, module_cls.register_buffer

    def parameter_on_meta(self, name, param):
        register_parameter(self, name, param)
        if param is not None and param.device.type != "meta":
            self._parameters[name] = torch.nn.Parameter(param.to("meta"), requires_grad=param.requires_grad)

    def buffer_on_meta(self, name, tensor, persistent=True):
        register_buffer(self, name, tensor, persistent)
        if tensor is not None and tensor.device.type != "meta":
            self._buffers[name] = tensor.to("meta")

    module_cls.register_parameter, module_cls.register_buffer = parameter_on_meta, buffer_on_meta
    try:
        yield
    finally:
        module_cls.register_parameter, module_cls.register_buffer = register_parameter, register_buffer


@dataclass
class Workload:
    """A module on the meta device, its named inputs, and how to get a loss from its output."""
    name: str
    module: torch.nn.Module
    inputs: List[torch.Tensor]
    input_names: List[str]
    call: Callable  # (module, inputs) -> output
    loss: Optional[Callable]  # output -> scalar loss; None traces the forward only
    extra: dict = field(default_factory=dict)


def _meta(shape, dtype):
    return torch.empty(shape, dtype=dtype, device="meta")


def hugging_face(config_path, batch, seq, dtype=None, inference=False, attention="eager", target_seq=None,
                 images=1):
    """A transformers model from its config.json (a file or a snapshot folder), random weights, nothing
    downloaded. Inputs follow the model's main input: token ids of `seq` (and `target_seq` decoder tokens for
    encoder-decoders), images of the config's image_size, or Whisper's log-mel frames; LLaVA takes `seq` tokens,
    image tokens included, and `images` images per sequence. Causal LMs are trained on next-token cross-entropy
    (the model's own loss function where it has one), CLIP and SigLIP on their contrastive losses, every other
    head on cross-entropy over its logits."""
    path = pathlib.Path(config_path)
    if path.is_dir():
        path = path / "config.json"
    try:
        document = json.loads(path.read_text())
    except (OSError, ValueError) as error:
        raise TraceError(f"{path}: cannot read the config: {error}") from None
    if not isinstance(document, dict) or "model_type" not in document:
        raise TraceError(f"{path}: model_type: field is required")
    model_type = document.pop("model_type")
    try:
        import transformers
    except ImportError:
        raise TraceError("--hf-config needs the transformers package (pip install transformers)") from None
    try:
        config = transformers.AutoConfig.for_model(model_type, **document)
    except (ValueError, KeyError) as error:
        raise TraceError(f"{path}: model_type '{model_type}': {error}") from None
    architectures = document.get("architectures") or []
    cls = getattr(transformers, architectures[0], None) if architectures else None
    if cls is None:
        cls = transformers.AutoModelForCausalLM
    with on_meta():
        try:
            model = (cls.from_config(config, attn_implementation=attention) if cls is transformers.AutoModelForCausalLM
                     else cls._from_config(config, attn_implementation=attention))
        except (ValueError, TypeError) as error:
            raise TraceError(f"{path}: transformers cannot build {cls.__name__}: {error}") from None
    if dtype is not None:
        model = model.to(torch_dtype(dtype, "--dtype"))
    model.train(not inference)
    name = cls.__name__
    if model.config.model_type == "llava":
        return _llava(model, name, batch, seq, images, inference)
    params = inspect.signature(model.forward).parameters
    named = _hf_inputs(model, params, batch, seq, target_seq or seq)
    input_names = list(named)
    causal = "use_cache" in params and not model.config.is_encoder_decoder

    def call(m, xs):
        kwargs = dict(zip(input_names, xs))
        if "use_cache" in params:
            kwargs["use_cache"] = inference  # inference fills a KV cache
        return m(**kwargs)

    if inference:
        return Workload(name, model, list(named.values()), input_names, _without_grad(call), None)

    if model.config.model_type in ("clip", "siglip"):
        loss = _contrastive_loss if model.config.model_type == "clip" else _sigmoid_pair_loss
        return Workload(name, model, list(named.values()), input_names, call, loss)
    if causal:
        labels = _meta((batch, seq), torch.int64)
        if hasattr(model, "loss_function"):
            loss = lambda out: model.loss_function(_logits(out, name), labels, model.config.vocab_size)  # noqa: E731
        else:
            loss = lambda out: _causal_lm_loss(_logits(out, name), labels)  # noqa: E731
    else:
        # Every other head predicts a class per position (masked LMs, seq2seq decoders) or per sample
        # (classifiers): cross-entropy against labels of the logits' leading shape.
        if name.endswith("ForSequenceClassification") or named.get("pixel_values") is not None:
            labels = _meta((batch,), torch.int64)
        elif model.config.is_encoder_decoder:
            labels = _meta((batch, target_seq or seq), torch.int64)
        else:
            labels = _meta((batch, seq), torch.int64)
        loss = lambda out: F.cross_entropy(_logits(out, name).flatten(0, -2), labels.flatten())  # noqa: E731
    return Workload(name, model, list(named.values()) + [labels], input_names + ["labels"], call, loss)


def _hf_inputs(model, params, batch, seq, target_seq):
    """The batch a transformers model takes, on meta, by its main input (token ids, images, log-mel frames)."""
    config = model.config
    main = getattr(model, "main_input_name", "input_ids")
    inputs = {}
    dtype = next(model.parameters()).dtype
    if main == "pixel_values" or "pixel_values" in params:
        vision = getattr(config, "vision_config", config)
        size = vision.image_size if isinstance(vision.image_size, int) else vision.image_size[0]
        inputs["pixel_values"] = _meta((batch, getattr(vision, "num_channels", 3), size, size), dtype)
    if main == "input_features":  # Whisper: log-mel frames, twice the encoder's positions (a stride-2 conv)
        inputs["input_features"] = _meta((batch, config.num_mel_bins, 2 * config.max_source_positions), dtype)
    if "input_ids" in params and main != "pixel_values":
        inputs["input_ids"] = _meta((batch, seq), torch.int64)
        if "use_cache" not in params or config.is_encoder_decoder:
            # The padding mask a batch comes with; without one, encoders look for padding in the token values,
            # which meta tensors do not have. Causal LMs make their mask from the positions.
            inputs["attention_mask"] = _meta((batch, seq), torch.int64)
    if config.is_encoder_decoder:
        inputs["decoder_input_ids"] = _meta((batch, target_seq), torch.int64)
    return {k: v for k, v in inputs.items() if k in params}


def _llava(model, name, batch, seq, images, inference):
    """LlavaForConditionalGeneration.forward (transformers 4.46), replayed from its own parts: on meta tensors its
    checks that read token values (`.item()`, the legacy-processing test) cannot run. input_ids hold the image
    tokens the processor expands (seq counts them); the image features are masked_scatter'ed into the token
    embeddings as the non-legacy path does, and the loss is LLaVA's: shifted logits, no f32 upcast."""
    config = model.config
    vision = config.vision_config
    if images < 0:
        raise TraceError(f"--images must not be negative, got {images}")
    ids = _meta((batch, seq), torch.int64)
    inputs, input_names = [ids], ["input_ids"]
    if images:
        dtype = next(model.parameters()).dtype
        inputs.append(_meta((batch * images, vision.num_channels, vision.image_size, vision.image_size), dtype))
        input_names.append("pixel_values")

    if hasattr(model, "lm_head"):
        return _llava_model(model, name, inputs, input_names, batch, seq, inference)

    def forward(m, xs):
        embeds = m.get_input_embeddings()(xs[0])
        features = None
        if len(xs) > 1:
            features = m.get_image_features(xs[1], config.vision_feature_layer, config.vision_feature_select_strategy)
            mask = (xs[0] == config.image_token_index).unsqueeze(-1).expand_as(embeds)
            embeds = embeds.masked_scatter(mask, features.to(embeds.device, embeds.dtype))
        out = m.language_model(inputs_embeds=embeds, use_cache=inference)
        return out.logits, features  # the output's logits and image_hidden_states

    if inference:
        return Workload(name, model, inputs, input_names, _without_grad(forward), None)
    labels = _meta((batch, seq), torch.int64)

    def loss(output):
        logits = output[0]
        shift_logits = logits[..., :-1, :].contiguous()
        shift_labels = labels[..., 1:].contiguous()
        return F.cross_entropy(shift_logits.view(-1, shift_logits.size(-1)), shift_labels.view(-1))

    return Workload(name, model, inputs + [labels], input_names + ["labels"], forward, loss)


def _llava_model(model, name, inputs, input_names, batch, seq, inference):
    """LLaVA from transformers 4.52 on (LlavaModel under model., the head beside it) runs its own forward: its one
    data-dependent check, that the image tokens match the features, is a torch_compilable_check, which
    TRANSFORMERS_DISABLE_TORCH_CHECK=1 turns off (for the call only). The loss is the model's loss_function, as its
    forward computes it."""
    def forward(m, xs):
        previous = os.environ.get("TRANSFORMERS_DISABLE_TORCH_CHECK")
        os.environ["TRANSFORMERS_DISABLE_TORCH_CHECK"] = "1"
        try:
            return m(**dict(zip(input_names, xs)), use_cache=inference).logits
        finally:
            if previous is None:
                del os.environ["TRANSFORMERS_DISABLE_TORCH_CHECK"]
            else:
                os.environ["TRANSFORMERS_DISABLE_TORCH_CHECK"] = previous

    if inference:
        return Workload(name, model, inputs, input_names, _without_grad(forward), None)
    labels = _meta((batch, seq), torch.int64)
    vocab = model.config.text_config.vocab_size
    return Workload(name, model, inputs + [labels], input_names + ["labels"], forward,
                    lambda logits: model.loss_function(logits, labels, vocab))


def freeze(module, prefixes):
    """requires_grad_(False) on the parameters whose names start with any of `prefixes` (a frozen tower, as
    LLaVA's vision_tower. in its fine-tuning stage); each prefix must name at least one parameter."""
    for prefix in prefixes:
        matched = [p for n, p in module.named_parameters() if n.startswith(prefix)]
        if not matched:
            raise TraceError(f"--freeze '{prefix}': no parameter's name starts with it")
        for p in matched:
            p.requires_grad_(False)


def _contrastive_loss(output):
    # CLIP: cross-entropy over the batch, text to image and image to text.
    logits = output.logits_per_text
    targets = torch.arange(logits.shape[0], device=logits.device)
    return (F.cross_entropy(logits, targets) + F.cross_entropy(logits.t(), targets)) / 2


def _sigmoid_pair_loss(output):
    # SigLIP: every text-image pair is a binary decision, +1 on the diagonal.
    logits = output.logits_per_text
    n = logits.shape[0]
    signs = 2 * torch.eye(n, device=logits.device) - 1
    return -F.logsigmoid(signs * logits).sum() / n


def _logits(output, name):
    logits = getattr(output, "logits", None)
    if logits is None:
        raise TraceError(f"{name} returns no logits to train on: trace a model with a head (*ForCausalLM, "
                         "*ForMaskedLM, *ForSequenceClassification) or pass --inference")
    return logits


def _causal_lm_loss(logits, labels):
    # What transformers' causal LMs did before their loss_function: upcast, shift, cross-entropy.
    logits = logits.float()
    shifted = logits[..., :-1, :].contiguous()
    targets = labels[..., 1:].contiguous()
    return F.cross_entropy(shifted.view(-1, shifted.shape[-1]), targets.view(-1))


def torchvision_model(name, batch, image_size, num_classes=1000, dtype=None, inference=False):
    """A torchvision classification model by name, trained on cross-entropy over its classes."""
    try:
        import torchvision
    except ImportError:
        raise TraceError("--torchvision needs the torchvision package") from None
    available = torchvision.models.list_models(module=torchvision.models)
    if name not in available:
        close = [n for n in available if name.lower() in n or n in name.lower()][:5]
        hint = f"; did you mean: {', '.join(close)}?" if close else f"; available: {', '.join(available)}"
        raise TraceError(f"--torchvision: unknown model '{name}'{hint}")
    with on_meta():
        model = torchvision.models.get_model(name, weights=None, num_classes=num_classes)
    images = _meta((batch, 3, image_size, image_size), torch.float32)
    if dtype is not None:
        model = model.to(torch_dtype(dtype, "--dtype"))
        images = images.to(torch_dtype(dtype, "--dtype"))
    model.train(not inference)
    if inference:
        return Workload(name, model, [images], ["images"], _no_grad_call, None)
    targets = _meta((batch,), torch.int64)
    return Workload(name, model, [images, targets], ["images", "targets"], lambda m, x: m(x[0]),
                    lambda out: F.cross_entropy(out, targets))


def _without_grad(call):
    """`call(m, inputs)` under torch.no_grad(): an inference step, which saves nothing for backward."""
    def no_grad_call(m, inputs):
        with torch.no_grad():
            return call(m, inputs)
    return no_grad_call


_no_grad_call = _without_grad(lambda m, inputs: m(*inputs))


def parse_input(spec):
    """'8x3x224x224' or '8x3x224x224:bf16' -> (shape, dtype)."""
    shape_text, _, dtype = spec.partition(":")
    try:
        shape = [int(d) for d in shape_text.split("x")]
    except ValueError:
        raise TraceError(f"--input '{spec}': a shape is sizes joined by 'x', e.g. 8x3x224x224:f32") from None
    if not shape or any(d < 0 for d in shape):
        raise TraceError(f"--input '{spec}': sizes must be non-negative")
    return shape, torch_dtype(dtype or "f32", f"--input '{spec}'")


def user_module(target, kwargs, input_specs, loss="mean", dtype=None, inference=False):
    """`package.module:callable` called with `kwargs` (a module class or a function returning a module); its
    inputs are meta tensors of the given shapes. The loss is the mean of the first output, or cross-entropy
    against random classes over the output's last dimension."""
    module_name, _, attr = target.partition(":")
    if not module_name or not attr:
        raise TraceError(f"--module '{target}': expected package.module:callable")
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())  # as `python -m` would: the user's own package, run from its folder
    try:
        factory = getattr(importlib.import_module(module_name), attr)
    except (ImportError, AttributeError) as error:
        raise TraceError(f"--module '{target}': {error}") from None
    with on_meta():
        model = factory(**kwargs)
    if not isinstance(model, torch.nn.Module):
        raise TraceError(f"--module '{target}': returned {type(model).__name__}, not a torch.nn.Module")
    if not input_specs:
        raise TraceError(f"--module '{target}': give its inputs with --input SHAPE[:DTYPE]")
    inputs = [_meta(*parse_input(spec)) for spec in input_specs]
    names = [f"input{i}" for i in range(len(inputs))]
    if dtype is not None:
        model = model.to(torch_dtype(dtype, "--dtype"))
    model.train(not inference)
    if inference or loss == "none":
        return Workload(attr, model, inputs, names, _no_grad_call if inference else lambda m, x: m(*x), None)

    def first(out):
        if isinstance(out, torch.Tensor):
            return out
        for value in (out.values() if isinstance(out, dict) else out):
            if isinstance(value, torch.Tensor):
                return value
        raise TraceError(f"--module '{target}': the output holds no tensor to take a loss of")

    if loss == "mean":
        loss_fn = lambda out: first(out).float().mean()  # noqa: E731
    elif loss == "cross-entropy":
        def loss_fn(out):
            logits = first(out)
            targets = _meta(logits.shape[:-1], torch.int64)
            return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))
    else:
        raise TraceError(f"--loss '{loss}': one of mean, cross-entropy, none")
    return Workload(attr, model, inputs, names, lambda m, x: m(*x), loss_fn)
