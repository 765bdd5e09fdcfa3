"""Checks `headroom estimate --engine vllm|sglang` against the engines' own KV-cache sizing code, on a CPU.

    python -m headroom_validation.serving_reference [--headroom BIN] [--engine vllm|sglang] [--list] [-k SUBSTRING]

For each case (every preset in data/models at three budgets, plus cases for flags: fp8 KV cache, block size,
tensor and pipeline parallelism, long max_model_len on small GPUs) it runs
`$HEADROOM_BIN estimate --engine ENGINE --model PRESET ... --json`, takes from Headroom's JSON only the inputs of
the engine's KV sizing (per GPU: "kv_layers" and "kv_cache_bytes", the bytes the engine hands to KV sizing; the
scheduler settings at the top level), builds the engine's own objects from them and calls the engine's own
functions, then compares the engine's answers with Headroom's:

  vLLM 0.34.0, in the order EngineCore._initialize_kv_caches (vllm/v1/engine/core.py) runs them:
  get_global_kv_cache_groups -> get_kv_cache_configs (null block, enough-memory check with its ValueError,
  bytes per block, num_blocks, min over pipeline stages) -> generate_scheduler_kv_cache_config ->
  update_kv_cache_capacity. Compared: gpu_blocks, kv_cache_tokens, max_concurrency (to 1e-9), starts, the error
  text exactly, max_model_len_that_fits (vLLM's _estimate_max_model_len_from_groups on the memory its check
  uses), and per GPU kv_block_bytes, gpu_blocks (the stage's own bytes // bytes per block, before the minimum)
  and max_model_len_that_fits. The only stand-in is the VllmConfig object (the attributes the planning code
  reads; its max_in_flight_tokens / max_concurrent_batches / num_prefill_lookahead_tokens properties are vLLM's
  own, re-bound); CacheConfig is vLLM's.

  SGLang 0.5.23: DefaultPoolConfigurator._compute_cell_size / calculate_pool_sizes, MemoryPoolConfig's "Not
  enough memory" error, HybridSWAPoolConfigurator for models SGLang's is_hybrid_swa_model calls hybrid (its
  sliding layers get an SWA pool; otherwise SGLang gives them full KV), KVCacheConfigurator.resolve_max_num_reqs.
  SGLang's runtime context (get_parallel/get_schedule/get_memory) is replaced by namespaces holding Headroom's
  settings. Compared: cell_bytes, max_total_num_tokens (per GPU and the minimum), max_running_requests, starts,
  error.

Not covered (they need a GPU or a profile run): how many bytes KV sizing gets (kv_cache_bytes is taken from
Headroom as is), and the errors raised before KV sizing (vLLM's max_model_len and requested-memory checks,
SGLang's mem_fraction_static check); a case that stops at one of those is printed as 'unchecked'.

A case Headroom refuses (non-zero exit with a one-line message, e.g. an image model) is printed as 'refused' and
is not a failure. One line per case, then 'N passed, M failed'; exits 1 on any mismatch (or when nothing could
be compared), 77 when vLLM is not installed in this Python (validation/setup-torch2 installs it from
validation/requirements-serving.txt).
"""
import argparse
import contextlib
import io
import json
import logging
import math
import os
import pathlib
import re
import subprocess
import sys
import types
import warnings
from concurrent.futures import ThreadPoolExecutor
from functools import partial

REPO = pathlib.Path(__file__).resolve().parents[2]
SKIP = 77

BUDGETS = [["--gpu", "H100-80GB"], ["--gpu", "L4"], ["--budget", "200GiB"]]

# Errors an engine raises before it sizes the KV cache; the reference cannot produce them from KV inputs.
PRE_KV_ERRORS = (
    "User-specified max_model_len",            # vLLM config/model.py: _get_and_verify_max_len
    "Free memory on device",                   # vLLM v1/worker/utils.py: request_memory
    "Externally held weights",                 # idem
    "Invalid kv_cache_dtype",                  # vLLM config/cache.py
    "Loaded weights leave no GPU memory",      # SGLang KVCacheConfigurator._profile_available_bytes
    "Warning: User-specified context_length",  # SGLang _derive_context_length
    "CUDA out of memory",                      # the weights themselves do not fit
    "torch.OutOfMemoryError",                  # idem, as vLLM's loader raises it
)


def presets():
    return sorted(p.stem for p in (REPO / "data" / "models").glob("*.json")) + ["resnet50", "vgg16"]


def cases(engine_filter=None):
    """(engine, model, flags) for every case."""
    out = []
    for engine in ("vllm", "sglang"):
        for model in presets():
            for budget in BUDGETS:
                out.append((engine, model, list(budget)))
    vllm_extra = [
        # long contexts on a 24 GB GPU: some do not start (vLLM's estimated maximum model length)
        ("deepseek-v2-lite", ["--gpu", "L4", "--max-model-len", "131072"]),
        ("gpt-oss-20b", ["--gpu", "L4", "--max-model-len", "131072"]),
        ("qwen2-7b", ["--gpu", "L4", "--max-model-len", "131072"]),
        ("mistral-7b", ["--gpu", "L4", "--max-model-len", "32768"]),
        ("qwen3-8b", ["--gpu", "L4", "--max-model-len", "40960"]),
        ("llama-4-scout-17b-16e", ["--budget", "200GiB", "--max-model-len", "262144"]),
        # KV dtype, block size
        ("llama-3-8b", ["--gpu", "L4", "--kv-cache-dtype", "fp8"]),
        ("qwen3-8b", ["--gpu", "L4", "--kv-cache-dtype", "fp8", "--max-model-len", "40960"]),
        ("deepseek-v2-lite", ["--gpu", "L4", "--kv-cache-dtype", "fp8"]),
        ("llama-3-8b", ["--gpu", "H100-80GB", "--block-size", "16"]),
        ("gemma-2-9b", ["--gpu", "L4", "--block-size", "16"]),
        ("gpt-oss-20b", ["--gpu", "H100-80GB", "--block-size", "16"]),
        # sliding window, sliding/full hybrids, MLA
        ("mistral-7b", ["--gpu", "H100-80GB", "--max-model-len", "32768"]),
        ("gemma-2-9b", ["--gpu", "L4", "--max-model-len", "8192"]),
        ("gemma-3-1b", ["--gpu", "L4", "--max-model-len", "32768"]),
        ("deepseek-v2-lite", ["--gpu", "H100-80GB", "--max-model-len", "163840"]),
        ("gpt-oss-20b", ["--gpu", "H100-80GB", "--max-model-len", "131072"]),
        # tensor parallel (KV heads per rank; MLA replicated)
        ("llama-3-8b", ["--gpu", "L4", "--tensor-parallel-size", "2"]),
        ("qwen3-8b", ["--gpu", "L4", "--tensor-parallel-size", "2", "--max-model-len", "40960"]),
        ("mixtral-8x7b", ["--gpu", "H100-80GB", "--tensor-parallel-size", "2"]),
        ("deepseek-v2-lite", ["--gpu", "L4", "--tensor-parallel-size", "2", "--max-model-len", "131072"]),
        ("llama-2-70b", ["--gpu", "H100-80GB", "--tensor-parallel-size", "2"]),
        # pipeline parallel (one worker per stage, the minimum of their blocks)
        ("llama-3-8b", ["--gpu", "L4", "--pipeline-parallel-size", "2"]),
        ("gemma-2-9b", ["--gpu", "L4", "--pipeline-parallel-size", "2"]),
        ("gpt-oss-20b", ["--gpu", "L4", "--pipeline-parallel-size", "2", "--max-model-len", "131072"]),
        ("llama-2-70b", ["--gpu", "H100-80GB", "--pipeline-parallel-size", "2"]),
        ("mistral-7b", ["--gpu", "L4", "--pipeline-parallel-size", "2", "--tensor-parallel-size", "2"]),
    ]
    out += [("vllm", m, f) for m, f in vllm_extra]
    sglang_extra = [
        ("llama-3-8b", ["--gpu", "L4", "--kv-cache-dtype", "fp8_e4m3"]),
        ("deepseek-v2-lite", ["--gpu", "L4", "--kv-cache-dtype", "fp8_e4m3"]),
        ("llama-3-8b", ["--gpu", "L4", "--tensor-parallel-size", "2"]),
        ("deepseek-v2-lite", ["--gpu", "L4", "--tensor-parallel-size", "2"]),
        ("mixtral-8x7b", ["--gpu", "H100-80GB", "--tensor-parallel-size", "2"]),
    ]
    out += [("sglang", m, f) for m, f in sglang_extra]
    if engine_filter:
        out = [c for c in out if c[0] == engine_filter]
    return out


def case_name(engine, model, flags):
    return " ".join([engine, model] + flags)


def run_headroom(headroom, engine, model, flags):
    """('ok', json) | ('refused', message) | ('crash', text)."""
    cmd = [headroom, "estimate", "--engine", engine, "--model", model, "--json"] + flags
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    if p.returncode == 0:
        try:
            return "ok", json.loads(p.stdout)
        except json.JSONDecodeError as e:
            return "crash", f"exit 0 but stdout is not JSON ({e}): {p.stdout[:200]!r}"
    err = (p.stderr.strip() or p.stdout.strip())
    if p.returncode > 0 and err and "\n" not in err:
        return "refused", err
    return "crash", f"exit {p.returncode}: {err[-600:]!r}"


def _quiet_import():
    """Context: silence the engines' import-time chatter (stdout and warnings)."""
    warnings.filterwarnings("ignore")
    return contextlib.redirect_stdout(io.StringIO())


# ------------------------------------------------------------------------------------------------------------
# vLLM


class VllmReference:
    def __init__(self):
        os.environ.setdefault("VLLM_LOGGING_LEVEL", "INFO")
        os.environ.setdefault("VLLM_CONFIGURE_LOGGING", "1")
        logging.disable(logging.WARNING)  # torch's and vLLM's import-time warnings
        with _quiet_import():
            import torch
            import vllm
            import vllm.logger
            from vllm.config.cache import CacheConfig
            from vllm.config.vllm import VllmConfig
            from vllm.utils.torch_utils import STR_DTYPE_TO_TORCH_DTYPE
            from vllm.v1.core import kv_cache_planning
            from vllm.v1.core import kv_cache_utils
            from vllm.v1 import kv_cache_interface
        logging.disable(logging.NOTSET)
        self.torch, self.vllm, self.vllm_logger = torch, vllm, vllm.logger
        self.CacheConfig, self.STR_DTYPE = CacheConfig, STR_DTYPE_TO_TORCH_DTYPE
        self.P, self.U, self.I = kv_cache_planning, kv_cache_utils, kv_cache_interface
        # Minimal VllmConfig stand-in; its properties are vLLM's own, re-bound.
        self.Config = type("ReferenceVllmConfig", (), {
            "max_concurrent_batches": VllmConfig.max_concurrent_batches,
            "max_in_flight_tokens": VllmConfig.max_in_flight_tokens,
            "num_prefill_lookahead_tokens": VllmConfig.num_prefill_lookahead_tokens,
        })
        # vLLM logs through the "vllm" logger; keep it off the output (the *_once caches are cleared per case).
        vlog = logging.getLogger("vllm")
        for h in list(vlog.handlers):
            vlog.removeHandler(h)
        vlog.addHandler(logging.NullHandler())
        vlog.propagate = False

    def config(self, h):
        cc = self.CacheConfig(block_size=int(h["block_size"]))
        cc.num_gpu_blocks_override = None
        cc.kv_cache_layout = "LBNHC"
        cc.mamba_cache_mode = "none"
        cc.enable_extensible_kv_cache = bool(h.get("extensible_kv_cache", False))
        if h.get("gpu_memory_utilization") is not None:
            cc.gpu_memory_utilization = float(h["gpu_memory_utilization"])
        cfg = self.Config()
        cfg.cache_config = cc
        cfg.model_config = types.SimpleNamespace(max_model_len=int(h["max_model_len"]),
                                                 original_max_model_len=int(h["max_model_len"]),
                                                 supports_kv_cache_grouping=False)
        cfg.scheduler_config = types.SimpleNamespace(
            max_num_batched_tokens=int(h["max_num_batched_tokens"]), max_num_seqs=int(h["max_num_seqs"]),
            async_scheduling=bool(h.get("async_scheduling", True)), disable_hybrid_kv_cache_manager=False,
            enable_chunked_prefill=True)
        cfg.parallel_config = types.SimpleNamespace(
            tensor_parallel_size=int(h.get("tensor_parallel_size", 1)),
            pipeline_parallel_size=int(h.get("pipeline_parallel_size", 1)), decode_context_parallel_size=1)
        cfg.attention_config = types.SimpleNamespace(hisparse_config=None)
        cfg.speculative_config = None
        cfg.device_config = types.SimpleNamespace(device_type="cuda")
        return cfg

    def dtype(self, nbytes, kv_cache_dtype):
        t = self.torch
        if nbytes == 4:
            return t.float32
        if nbytes == 2:
            return t.float16 if kv_cache_dtype in ("float16", "half") else t.bfloat16
        if nbytes == 1:
            return self.STR_DTYPE.get(kv_cache_dtype, t.uint8)
        raise ValueError(f"dtype_bytes {nbytes}")

    def spec(self, layer, kv_cache_dtype):
        I = self.I
        kind = layer["kind"]
        bs = int(layer["block_size"])
        if kind == "mamba":
            # The whole state of one request as one uint8 tensor: vLLM's page is exactly state_bytes.
            return I.MambaSpec(block_size=bs, shapes=((int(layer["state_bytes"]),),), dtypes=(self.torch.uint8,))
        common = dict(block_size=bs, num_kv_heads=int(layer["num_kv_heads"]), head_size=int(layer["head_size"]),
                      dtype=self.dtype(int(layer["dtype_bytes"]), kv_cache_dtype),
                      kv_quant_mode=I.get_kv_quant_mode(kv_cache_dtype or "auto"))
        if kind == "mla":  # latent + rope per token, one "head", replicated on every TP rank
            common["num_kv_heads"] = 1
            return I.MLAAttentionSpec(cache_dtype_str=kv_cache_dtype, **common)
        if kind == "chunked_local":
            return I.ChunkedLocalAttentionSpec(attention_chunk_size=int(layer["window"]), **common)
        if layer.get("head_size_v") is not None:
            common["head_size_v"] = int(layer["head_size_v"])
        if kind == "full":
            return I.FullAttentionSpec(**common)
        if kind == "sliding":
            return I.SlidingWindowSpec(sliding_window=int(layer["window"]), **common)
        raise ValueError(f"unknown kv_layers kind {kind!r}")

    def workers(self, h):
        """One worker per pipeline stage: ({layer name: spec}, available bytes, the GPU's entry)."""
        stages = {}
        for g in h["gpus"]:
            stages.setdefault(int(g.get("stage", 0)), g)
        kvd = h.get("kv_cache_dtype") or "auto"
        per_stage = []
        for stage in sorted(stages):
            g = stages[stage]
            layers = sorted((int(i), kl) for kl in g["kv_layers"] for i in kl["layers"])
            per_stage.append((g, layers))
        # Layer names as the model's: model.layers.<index>.attn, numbered across stages (renumbered only if
        # Headroom numbered each stage from 0).
        seen = [i for _, layers in per_stage for i, _ in layers]
        renumber = len(seen) != len(set(seen))
        out, n = [], 0
        for g, layers in per_stage:
            specs = {}
            for i, kl in layers:
                specs[f"model.layers.{n if renumber else i}.attn"] = self.spec(kl, kvd)
                n += 1
            out.append((specs, int(g["kv_cache_bytes"]), g))
        return out

    def run(self, h):
        P, U = self.P, self.U
        cfg = self.config(h)
        workers = self.workers(h)
        specs = [s for s, _, _ in workers]
        available = [a for _, a, _ in workers]
        for n in ("_print_debug_once", "_print_info_once", "_print_warning_once", "_print_error_once"):
            getattr(self.vllm_logger, n).cache_clear()
        ref = {"workers": []}
        groups = P.get_global_kv_cache_groups(cfg, specs)
        builder = P.get_kv_cache_config_builder(cfg)
        hint = P._more_kv_cache_memory_hint(cfg)
        max_len = cfg.model_config.max_model_len
        for s, avail in zip(specs, available):
            projected = P._project_kv_cache_groups_to_worker(groups, s)
            w = {}
            if projected:
                bpb = P._pool_bytes_per_block_from_builder(builder, cfg, projected)
                check = avail - bpb  # the null block, as get_kv_cache_configs reserves it
                w["kv_block_bytes"] = bpb
                w["gpu_blocks"] = avail // bpb
                w["max_model_len_that_fits"] = P._estimate_max_model_len_from_groups(builder, cfg, projected,
                                                                                     check)
                try:  # this stage on its own
                    P._check_enough_kv_cache_memory(
                        check, partial(P._max_memory_usage_bytes_from_groups, builder, cfg, projected), max_len,
                        partial(P._estimate_max_model_len_from_groups, builder, cfg, projected), hint)
                    w["error"] = None
                except ValueError as e:
                    w["error"] = str(e)
            ref["workers"].append(w)
        fits = [w["max_model_len_that_fits"] for w in ref["workers"] if "max_model_len_that_fits" in w]
        ref["max_model_len_that_fits"] = min(fits) if fits else max_len
        try:  # the sequence of EngineCore._initialize_kv_caches
            configs = P.get_kv_cache_configs(cfg, specs, available, groups)
            sched = U.generate_scheduler_kv_cache_config(configs)
            cfg.cache_config.num_gpu_blocks = sched.num_blocks
            if sched.kv_cache_groups:
                sizes = [g.kv_cache_spec.block_size for g in sched.kv_cache_groups if g.kv_cache_spec.prefix_cacheable]
                cfg.cache_config.block_size = min(sizes or [g.kv_cache_spec.block_size for g in sched.kv_cache_groups])
                U.update_kv_cache_capacity(cfg, sched)
            ref.update(starts=True, error=None, gpu_blocks=sched.num_blocks,
                       kv_cache_tokens=cfg.cache_config.kv_cache_size_tokens,
                       max_concurrency=cfg.cache_config.kv_cache_max_concurrency)
        except ValueError as e:
            ref.update(starts=False, error=str(e))
            m = re.search(r"the estimated maximum model length is (\d+)\. ", str(e))
            if m and int(m.group(1)) != ref["max_model_len_that_fits"]:  # cannot happen: same function
                ref["max_model_len_that_fits_in_error"] = int(m.group(1))
        return ref

    def compare(self, h, ref):
        diffs = []

        def eq(field, got, want):
            if got != want:
                diffs.append(f"{field}: headroom {got!r} vllm {want!r}")

        eq("starts", h.get("starts"), ref["starts"])
        eq("error", h.get("error"), ref["error"])
        eq("max_model_len_that_fits", h.get("max_model_len_that_fits"), ref["max_model_len_that_fits"])
        if "max_model_len_that_fits_in_error" in ref:
            diffs.append(f"vLLM's error names {ref['max_model_len_that_fits_in_error']} as the estimated length")
        if ref["starts"]:
            eq("gpu_blocks", h.get("gpu_blocks"), ref["gpu_blocks"])
            eq("kv_cache_tokens", h.get("kv_cache_tokens"), ref["kv_cache_tokens"])
            got = h.get("max_concurrency")
            if not isinstance(got, (int, float)) or not math.isclose(got, ref["max_concurrency"], rel_tol=1e-9,
                                                                     abs_tol=1e-9):
                diffs.append(f"max_concurrency: headroom {got!r} vllm {ref['max_concurrency']!r}")
        stages = {}
        for g in h["gpus"]:
            stages.setdefault(int(g.get("stage", 0)), g)
        for (stage, g), w in zip(sorted(stages.items()), ref["workers"]):
            for f in ("kv_block_bytes", "gpu_blocks", "max_model_len_that_fits"):
                if f in w and f in g:
                    eq(f"gpus[stage {stage}].{f}", g[f], w[f])
            if "error" in w and "error" in g:
                eq(f"gpus[stage {stage}].error", g["error"], w["error"])
        return diffs


# ------------------------------------------------------------------------------------------------------------
# SGLang


class SglangReference:
    def __init__(self):
        logging.disable(logging.WARNING)
        with _quiet_import():
            import torch
            import sglang
            from sglang.srt.configs import model_config
            from sglang.srt.mem_cache import kv_cache_configurator
            from sglang.srt.model_executor import pool_configurator
            import sglang.srt.layers.cp.utils as cp_utils
        logging.disable(logging.NOTSET)
        self.torch, self.sglang = torch, sglang
        self.MC, self.KC, self.PC, self.CPU = model_config, kv_cache_configurator, pool_configurator, cp_utils

    def kv_dtype(self, nbytes, name):
        t = self.torch
        if nbytes == 1:
            return t.float8_e5m2 if "e5m2" in (name or "") else t.float8_e4m3fn
        if nbytes == 2:
            return t.float16 if name in ("float16", "half") else t.bfloat16
        return t.float32

    def preset_config(self, model):
        path = REPO / "data" / "models" / f"{model}.json"
        cfg = json.loads(path.read_text()) if path.exists() else {}
        text = cfg.get("text_config") or cfg
        return cfg.get("architectures") or [], types.SimpleNamespace(**text)

    def run(self, h, model):
        PC, KC, CPU, MC = self.PC, self.KC, self.CPU, self.MC
        page = int(h.get("page_size", 1))
        par = types.SimpleNamespace(attn_tp_size=1, attn_dcp_size=1, attn_cp_size=1, pp_size=1, tp_size=1,
                                    launch_world_size=1)  # kv_layers already hold one rank's heads
        ratio = float(h.get("swa_full_tokens_ratio", 0.8))
        sched = types.SimpleNamespace(max_total_tokens=None, max_running_requests=None, swa_full_tokens_ratio=ratio,
                                      page_size=page, mem_fraction_static=h.get("mem_fraction_static"))
        mem = types.SimpleNamespace(enable_unified_memory=False, enable_hisparse=False)
        for mod in (PC, KC, CPU):
            if hasattr(mod, "get_parallel"):
                mod.get_parallel = lambda: par
            if hasattr(mod, "get_schedule"):
                mod.get_schedule = lambda: sched
            if hasattr(mod, "get_memory"):
                mod.get_memory = lambda: mem
        CPU.is_glm_dsa_cache_layer_split_enabled = lambda kvc: False
        archs, text_config = self.preset_config(model)
        hybrid_swa = MC.is_hybrid_swa_model(archs, text_config)
        ref = {"gpus": []}
        for g in h["gpus"]:
            ref["gpus"].append(self.run_gpu(g, h, archs, hybrid_swa, page, sched, text_config))
        errors = [r["error"] for r in ref["gpus"] if r.get("error")]
        ref["starts"] = not errors
        ref["error"] = errors[0] if errors else None
        if ref["starts"]:
            ref["max_total_num_tokens"] = min(r["max_total_num_tokens"] for r in ref["gpus"])
            kvc = ref["gpus"][0]["kvc"]
            ref["max_running_requests"] = KC.KVCacheConfigurator.resolve_max_num_reqs(kvc, ref["max_total_num_tokens"])
        return ref

    def run_gpu(self, g, h, archs, hybrid_swa, page, sched, text_config):
        PC, MC = self.PC, self.MC
        layers = g["kv_layers"]
        kinds = {kl["kind"] for kl in layers}
        if kinds - {"full", "sliding", "mla"}:
            raise NotImplementedError(f"kv_layers kinds {sorted(kinds)}")
        full = [kl for kl in layers if kl["kind"] in ("full", "mla") or (kl["kind"] == "sliding" and not hybrid_swa)]
        swa = [kl for kl in layers if kl["kind"] == "sliding" and hybrid_swa]
        if hybrid_swa and not swa:
            raise AssertionError(f"SGLang sizes {archs} as hybrid SWA but Headroom's kv_layers have no sliding layers")
        first = (full or swa)[0]
        n_full = sum(len(kl["layers"]) for kl in full)
        kv_dtype = self.kv_dtype(int(first["dtype_bytes"]), h.get("kv_cache_dtype"))
        mla = first["kind"] == "mla"
        rope = int(getattr(text_config, "qk_rope_head_dim", 0) or 0) if mla else 0
        hf = types.SimpleNamespace(architectures=archs, model_type=getattr(text_config, "model_type", ""))
        mc = types.SimpleNamespace(
            hf_config=hf, hf_text_config=hf, head_dim=int(first["head_size"]),
            v_head_dim=int(first.get("head_size_v") or first["head_size"]),
            kv_lora_rank=int(first["head_size"]) - rope if mla else None, qk_rope_head_dim=rope if mla else None,
            context_len=int(h["context_length"]), is_draft_model=False,
            attention_arch=PC.AttentionArch.MLA if mla else PC.AttentionArch.MHA, quantization=None)
        heads = int(first["num_kv_heads"])
        mc.get_total_num_kv_heads = lambda: heads
        mc.get_num_kv_heads = lambda tp, dcp=1: MC.ModelConfig.get_num_kv_heads(mc, tp, dcp)
        if swa:
            mc.swa_head_dim = int(swa[0]["head_size"])
            mc.swa_v_head_dim = int(swa[0].get("head_size_v") or swa[0]["head_size"])
            swa_heads = int(swa[0]["num_kv_heads"])
            mc.get_swa_num_kv_heads = lambda tp: max(1, swa_heads // tp)
        kvc = types.SimpleNamespace(model_config=mc, kv_cache_dtype=kv_dtype,
                                    kv_cache_dtype_str=h.get("kv_cache_dtype") or "auto",
                                    use_mla_backend=mla, server_args=types.SimpleNamespace(enable_hisparse=False),
                                    is_draft_worker=False, page_size=page,
                                    sliding_window_size=int(swa[0]["window"]) if swa else None, attn_dp_size=1,
                                    mambaish_config=None)
        out = {"kvc": kvc}
        avail = int(g["kv_cache_bytes"])
        try:
            if swa:
                conf = object.__new__(PC.HybridSWAPoolConfigurator)
                conf.kv_cache_dtype_str = kvc.kv_cache_dtype_str
                conf._full_layers_num = n_full
                conf._swa_layers_num = sum(len(kl["layers"]) for kl in swa)
                conf._swa_full_tokens_ratio = sched.swa_full_tokens_ratio
                conf._sliding_window_size = kvc.sliding_window_size
                conf._page_size = page
                conf._enable_unified_memory = False
                ks = self.torch._utils._element_size(kv_dtype)
                conf._full_per_token = mc.get_num_kv_heads(1) * (mc.head_dim + mc.v_head_dim) * ks if full else 0
                conf._swa_per_token = mc.get_swa_num_kv_heads(1) * (mc.swa_head_dim + mc.swa_v_head_dim) * ks
                conf._draft_full_layers_num = conf._draft_swa_layers_num = conf._draft_swa_full_layers_num = 0
                conf._draft_cell_size = 0
                conf._fused_full_entry = conf._fused_swa_entry = None
                conf._recompute_cell_size()
                out["cell_bytes"] = conf._cell_size
                cfg = conf.calculate_pool_sizes(avail, page)
                out["max_total_num_tokens"] = cfg.full_max_total_num_tokens
                out["swa_max_total_num_tokens"] = cfg.swa_max_total_num_tokens
            else:
                conf = object.__new__(PC.DefaultPoolConfigurator)
                conf.kv_cache_dtype_str = kvc.kv_cache_dtype_str
                conf._cell_size = PC.DefaultPoolConfigurator._compute_cell_size(conf, kvc, n_full)
                conf._fixed_overhead_bytes = 0
                conf._zero_kv_max_tokens = mc.context_len
                out["cell_bytes"] = conf._cell_size
                cfg = conf.calculate_pool_sizes(avail, page)
                out["max_total_num_tokens"] = cfg.max_total_num_tokens
            out["error"] = None
        except (RuntimeError, ValueError) as e:
            out["error"] = str(e)
        return out

    def compare(self, h, ref):
        diffs = []

        def eq(field, got, want):
            if got != want:
                diffs.append(f"{field}: headroom {got!r} sglang {want!r}")

        eq("starts", h.get("starts"), ref["starts"])
        eq("error", h.get("error"), ref["error"])
        if ref["starts"]:
            got = h.get("max_total_num_tokens", min((g.get("max_total_num_tokens") for g in h["gpus"]), default=None))
            eq("max_total_num_tokens", got, ref["max_total_num_tokens"])
            eq("max_running_requests", h.get("max_running_requests"), ref["max_running_requests"])
        for i, (g, r) in enumerate(zip(h["gpus"], ref["gpus"])):
            for f in ("cell_bytes", "max_total_num_tokens", "swa_max_total_num_tokens"):
                if f in r and (f in g or f != "swa_max_total_num_tokens"):
                    if r.get("error") and f != "cell_bytes":
                        continue
                    eq(f"gpus[{i}].{f}", g.get(f), r[f])
        return diffs


# ------------------------------------------------------------------------------------------------------------


def check(refs, engine, model, h):
    """('ok'|'MISMATCH'|'unchecked', detail)."""
    err = h.get("error")
    if err and err.startswith(PRE_KV_ERRORS):
        return "unchecked", f"stops before KV sizing: {err[:120]}"
    ref_engine = refs.get(engine)
    if ref_engine is None:
        return "unchecked", f"{engine} is not installed in this Python"
    try:
        ref = ref_engine.run(h) if engine == "vllm" else ref_engine.run(h, model)
        diffs = ref_engine.compare(h, ref)
    except (KeyError, TypeError, ValueError, AssertionError, NotImplementedError) as e:
        return "MISMATCH", f"cannot build the {engine} reference from Headroom's JSON: {type(e).__name__}: {e}"
    if diffs:
        return "MISMATCH", "; ".join(diffs)
    if ref["starts"]:
        if engine == "vllm":
            return "ok", (f"blocks {ref['gpu_blocks']}, tokens {ref['kv_cache_tokens']}, "
                          f"concurrency {ref['max_concurrency']:.4f}")
        return "ok", f"tokens {ref['max_total_num_tokens']}, running {ref['max_running_requests']}"
    fits = f", fits {ref['max_model_len_that_fits']}" if engine == "vllm" else ""
    return "ok", f"does not start ({ref['error'][:60]}...){fits}"


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--headroom", default=os.environ.get("HEADROOM_BIN", str(REPO / "build" / "cli" / "headroom")))
    ap.add_argument("--engine", choices=["vllm", "sglang"])
    ap.add_argument("-k", dest="match", help="only cases whose name contains this")
    ap.add_argument("--list", action="store_true", help="print the cases and exit")
    ap.add_argument("--jobs", type=int, default=4, help="Headroom runs at a time")
    args = ap.parse_args(argv)

    todo = cases(args.engine)
    if args.match:
        todo = [c for c in todo if args.match in case_name(*c)]
    if args.list:
        print("\n".join(case_name(*c) for c in todo))
        return 0
    if not os.access(args.headroom, os.X_OK):
        print(f"no headroom binary at {args.headroom} (set HEADROOM_BIN)")
        return 1

    refs = {}
    try:
        refs["vllm"] = VllmReference()
    except ImportError as e:
        print(f"skipped: vLLM's sizing code does not import in {sys.executable} ({e}); "
              "validation/setup-torch2 installs it (validation/requirements-serving.txt)")
        return SKIP
    if any(c[0] == "sglang" for c in todo):
        try:
            refs["sglang"] = SglangReference()
        except ImportError as e:
            print(f"note: SGLang's sizing code does not import ({e}); SGLang cases are unchecked")
    print(f"vLLM {refs['vllm'].vllm.__version__}" +
          (f", SGLang {refs['sglang'].sglang.__version__}" if "sglang" in refs else "") +
          f"; {len(todo)} cases; headroom: {args.headroom}", flush=True)

    passed = failed = refused = unchecked = 0
    with ThreadPoolExecutor(max_workers=max(1, args.jobs)) as pool:
        runs = pool.map(lambda c: run_headroom(args.headroom, *c), todo)
        for (engine, model, flags), (kind, payload) in zip(todo, runs):
            name = case_name(engine, model, flags)
            if kind == "refused":
                refused += 1
                print(f"refused    {name}: {payload}", flush=True)
                continue
            if kind == "crash":
                status, detail = "MISMATCH", f"headroom failed: {payload}"
            else:
                with contextlib.redirect_stdout(io.StringIO()):
                    status, detail = check(refs, engine, model, payload)
            if status == "ok":
                passed += 1
            elif status == "unchecked":
                unchecked += 1
            else:
                failed += 1
            print(f"{status:<10} {name}: {detail}", flush=True)
    print(f"({refused} refused, {unchecked} unchecked)")
    if passed + failed == 0:
        print("nothing was compared: every case was refused or unchecked")
        failed = max(failed, 1)
    print(f"{passed} passed, {failed} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
