"""Tests of headroom-trace. Run from python/: python -m unittest discover -s tests -t .

HEADROOM_BIN names the headroom binary for the tests that estimate and plan a traced graph (skipped without it).
The builder checks need transformers and are skipped where it is absent.
"""

import json
import os
import subprocess
import sys
import tempfile
import unittest

import torch
import torch.nn.functional as F

from headroom.trace import TraceError, sources, trace
from headroom.trace.recorder import block_of, storage_key
from tests import sample_modules

HEADROOM = os.environ.get("HEADROOM_BIN")
DTYPE_BYTES = {"f64": 8, "f32": 4, "bf16": 2, "f16": 2, "i64": 8, "i32": 4, "i8": 1, "u8": 1, "bool": 1}

try:
    import transformers
    HAVE_TRANSFORMERS = True
except ImportError:
    HAVE_TRANSFORMERS = False

try:
    import torchvision  # noqa: F401
    HAVE_TORCHVISION = True
except ImportError:
    HAVE_TORCHVISION = False


def nbytes(t):
    n = DTYPE_BYTES[t["dtype"]]
    for d in t["shape"]:
        n *= d
    return n


def ops_named(graph, suffix):
    return [op for op in graph["ops"] if op["name"].endswith(suffix)]


def base(graph, tid):
    return graph["tensors"][tid].get("view_of", tid)


def run_cli(*args):
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([os.getcwd()] + sys.path))
    return subprocess.run([sys.executable, "-m", "headroom.trace.cli", *args], capture_output=True, text=True,
                          env=env, timeout=600)


def run_headroom(*args):
    return subprocess.run([HEADROOM, *args], capture_output=True, text=True, timeout=600)


def tanh_mlp_graph(width=8, depth=2, batch=4, frozen=False):
    with sources.on_meta():
        model = sample_modules.TanhMlp(width, depth, classes=3)
    if frozen:
        model.blocks[0].up.weight.requires_grad_(False)
    x = torch.empty(batch, width, device="meta")
    y = torch.empty(batch, dtype=torch.int64, device="meta")
    return trace(model, [x, y], ["x", "y"], loss=lambda out: F.cross_entropy(out, y), call=lambda m, xs: m(xs[0]))


class RecorderTest(unittest.TestCase):
    def test_ops_run_in_order_with_module_names_blocks_and_phases(self):
        g = tanh_mlp_graph()
        names = [op["name"] for op in g["ops"]]
        self.assertLess(names.index("blocks.0.up.addmm"), names.index("blocks.1.up.addmm"))
        self.assertLess(names.index("blocks.1.down.addmm"), names.index("head.addmm"))
        layers = {op["name"]: op.get("layer", -1) for op in g["ops"]}
        self.assertEqual(layers["blocks.0.norm.native_layer_norm"], 0)
        self.assertEqual(layers["blocks.1.up.addmm"], 1)
        self.assertEqual(layers["head.addmm"], -1)
        phases = [op["phase"] for op in g["ops"]]
        self.assertEqual(phases[-1], "loss")
        self.assertEqual(phases[: names.index("head.addmm") + 1], ["forward"] * (names.index("head.addmm") + 1))

    def test_saved_tensors_are_what_autograd_keeps(self):
        g = tanh_mlp_graph()
        tensors = g["tensors"]
        # tanh's backward uses its result; the second linear saves its input (tanh's output) for the weight's
        # gradient: one storage, saved by both ops.
        tanh = ops_named(g, "blocks.0.tanh")[0]
        self.assertEqual([base(g, t) for t in tanh["saved"]], [base(g, tanh["outputs"][0])])
        down = ops_named(g, "blocks.0.down.addmm")[0]
        self.assertIn(base(g, tanh["outputs"][0]), [base(g, t) for t in down["saved"]])
        # The layer norm keeps its input, mean and rstd; the weight-transpose a linear saves is a view of the weight.
        norm = ops_named(g, "blocks.0.norm.native_layer_norm")[0]
        saved_shapes = sorted(tensors[t]["shape"] for t in norm["saved"])
        self.assertEqual(saved_shapes, [[4, 1], [4, 1], [4, 8], [8], [8]])
        weight = next(t["id"] for t in tensors if t["name"] == "blocks.0.down.weight")
        self.assertIn(weight, [base(g, t) for t in down["saved"]])
        # Element-wise adds keep nothing.
        for op in ops_named(g, ".add"):
            self.assertNotIn("saved", op)

    def test_a_frozen_weight_over_an_input_saves_nothing(self):
        g = tanh_mlp_graph(frozen=True)
        # blocks.0.up: the weight is frozen but the bias and the normalized input (from a trainable norm) need
        # gradients, so the input is not needed for a weight gradient: only the weight (for the input's
        # gradient) is saved.
        up = ops_named(g, "blocks.0.up.addmm")[0]
        saved = [g["tensors"][base(g, t)]["name"] for t in up["saved"]]
        self.assertEqual(saved, ["blocks.0.up.weight"])
        frozen = next(t for t in g["tensors"] if t["name"] == "blocks.0.up.weight")
        self.assertFalse(frozen["trainable"])

    def test_parameters_and_views(self):
        g = tanh_mlp_graph()
        params = [t for t in g["tensors"] if t["role"] == "parameter"]
        self.assertEqual(sum(nbytes(t) // 4 for t in params), sum(p.numel() for p in sample_modules.TanhMlp(8, 2, 3)
                                                                   .parameters()))
        transpose = ops_named(g, "blocks.0.up.t")[0]
        out = g["tensors"][transpose["outputs"][0]]
        self.assertEqual(g["tensors"][out["view_of"]]["name"], "blocks.0.up.weight")

    def test_in_place_ops_write_a_view_of_their_input(self):
        with sources.on_meta():
            model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.ReLU(inplace=True), torch.nn.Linear(4, 1))
        x = torch.empty(2, 4, device="meta")
        g = trace(model, [x], loss=lambda out: out.mean())
        relu = ops_named(g, "1.relu_")[0]
        self.assertTrue(relu["inplace"])
        self.assertEqual(base(g, relu["outputs"][0]), base(g, relu["inputs"][0]))
        # ReLU's backward reads its result, the in-place output.
        self.assertEqual([base(g, t) for t in relu["saved"]], [base(g, relu["inputs"][0])])

    def test_complex_tensors_are_recorded_in_their_real_layout(self):
        with sources.on_meta():
            model = torch.nn.Linear(8, 8)

        def rotate(m, xs):
            z = torch.view_as_complex(m(xs[0]).reshape(2, 4, 2))
            return torch.view_as_real(z * z).flatten(1)

        g = trace(model, [torch.empty(2, 8, device="meta")], call=rotate, loss=lambda out: out.mean())
        complex_mul = ops_named(g, "mul")[0]
        out = g["tensors"][complex_mul["outputs"][0]]
        self.assertEqual((out["shape"], out["dtype"]), ([2, 4, 2], "f32"))  # complex64 [2, 4]: 64 bytes
        self.assertEqual(nbytes(out), 2 * 4 * 8)

    def test_inputs_and_parameters_must_be_on_meta(self):
        model = torch.nn.Linear(2, 2)
        with self.assertRaisesRegex(TraceError, "parameter weight is on cpu"):
            trace(model, [torch.empty(1, 2, device="meta")])
        with self.assertRaisesRegex(TraceError, "input 0"):
            trace(model.to("meta"), [torch.zeros(1, 2)])

    def test_a_loss_without_trainable_parameters_is_refused(self):
        with sources.on_meta():
            model = torch.nn.Sequential(torch.nn.Linear(2, 2)).requires_grad_(False)
        with self.assertRaisesRegex(TraceError, "trainable"):
            trace(model, [torch.empty(1, 2, device="meta")], loss=lambda out: out.mean())
        # A failed trace leaves no hook behind on the user's modules.
        self.assertFalse(model[0]._forward_pre_hooks or model[0]._forward_hooks)

    def test_storage_key_identifies_views(self):
        t = torch.empty(4, 4, device="meta")
        self.assertEqual(storage_key(t), storage_key(t.t()))
        self.assertNotEqual(storage_key(t), storage_key(torch.empty(4, 4, device="meta")))


class CliTest(unittest.TestCase):
    def test_errors_name_the_input_at_fault(self):
        cases = [
            (["--torchvision", "resnet5000"],
             "unknown model 'resnet5000'" if HAVE_TORCHVISION else "--torchvision needs the torchvision package"),
            (["--module", "tests.sample_modules:not_a_module"], "not a torch.nn.Module"),
            (["--module", "tests.sample_modules:TanhMlp", "--input", "4xq"], "--input '4xq'"),
            (["--module", "tests.sample_modules:TanhMlp", "--input", "4x32:f12"], "unknown dtype 'f12'"),
            (["--module", "tests.sample_modules:Nope", "--input", "4x32"], "Nope"),
            (["--module", "tests.sample_modules:TanhMlp", "--input", "4x32", "--kwargs", "[1]"], "--kwargs"),
            (["--hf-config", "/nonexistent/config.json"], "/nonexistent/config.json"),
            (["--torchvision", "resnet18", "--batch", "0"], "--batch must be positive"),
        ]
        for args, message in cases:
            with self.subTest(args=args):
                result = run_cli(*args)
                self.assertNotEqual(result.returncode, 0)
                self.assertIn(message, result.stderr)

    def test_writes_graph_json(self):
        with tempfile.TemporaryDirectory() as d:
            out = os.path.join(d, "mlp.json")
            result = run_cli("--module", "tests.sample_modules:TanhMlp", "--kwargs", '{"width": 16, "depth": 2}',
                             "--input", "8x16", "--loss", "cross-entropy", "-o", out)
            self.assertEqual(result.returncode, 0, result.stderr)
            with open(out) as f:
                g = json.load(f)
            self.assertEqual(g["headroom_graph_version"], 1)
            self.assertEqual(g["name"], "TanhMlp")
            self.assertIn("loss", {op["phase"] for op in g["ops"]})


@unittest.skipUnless(HEADROOM, "HEADROOM_BIN is not set")
class EstimateAndPlanTest(unittest.TestCase):
    """Models Headroom has no builder for estimate and plan from their traced graphs."""

    def traced(self, directory, *args):
        out = os.path.join(directory, "model.json")
        result = run_cli(*args, "-o", out)
        self.assertEqual(result.returncode, 0, result.stderr)
        return out

    def check_estimate_and_plan(self, path, budget):
        estimate = run_headroom("estimate", "--model", path, "--budget", budget, "--precision", "fp32", "--json",
                                "--no-search")
        self.assertEqual(estimate.returncode, 0, estimate.stderr)
        report = json.loads(estimate.stdout)
        self.assertGreater(report["allocated_bytes"], 0)
        plan = run_headroom("plan", "--model", path, "--budget", budget, "--precision", "fp32")
        self.assertEqual(plan.returncode, 0, plan.stderr + plan.stdout)
        return report

    @unittest.skipUnless(HAVE_TORCHVISION, "needs torchvision (none is published for every PyTorch)")
    def test_torchvision_mobilenet(self):
        with tempfile.TemporaryDirectory() as d:
            path = self.traced(d, "--torchvision", "mobilenet_v2", "--batch", "8", "--image-size", "64")
            report = self.check_estimate_and_plan(path, "2GiB")
            # MobileNetV2 has 3.5 M parameters at 1000 classes: fp32 weights, gradients and AdamW's two moments
            # alone are 16 bytes each.
            self.assertGreater(report["allocated_bytes"], 16 * 3_504_872)

    def test_user_module(self):
        with tempfile.TemporaryDirectory() as d:
            path = self.traced(d, "--module", "tests.sample_modules:TanhMlp", "--kwargs", '{"width": 256}',
                               "--input", "64x256", "--loss", "cross-entropy")
            self.check_estimate_and_plan(path, "1GiB")


# Tiny configurations of the families both transformers 4.46 and Headroom's builders know.
TINY = {
    "llama-gqa": {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 64,
                  "intermediate_size": 176, "num_hidden_layers": 2, "num_attention_heads": 4,
                  "num_key_value_heads": 2, "vocab_size": 512, "max_position_embeddings": 256,
                  "tie_word_embeddings": False},
    "qwen2": {"architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2", "hidden_size": 64,
              "intermediate_size": 176, "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
              "vocab_size": 512, "max_position_embeddings": 256, "tie_word_embeddings": True},
    "mistral": {"architectures": ["MistralForCausalLM"], "model_type": "mistral", "hidden_size": 64,
                "intermediate_size": 224, "num_hidden_layers": 2, "num_attention_heads": 4,
                "num_key_value_heads": 1, "vocab_size": 512, "max_position_embeddings": 256,
                "tie_word_embeddings": False},
    "gemma": {"architectures": ["GemmaForCausalLM"], "model_type": "gemma", "hidden_size": 64,
              "intermediate_size": 256, "num_hidden_layers": 2, "num_attention_heads": 2, "num_key_value_heads": 1,
              "head_dim": 48, "vocab_size": 512, "max_position_embeddings": 256,
              "hidden_activation": "gelu_pytorch_tanh"},
    "gemma2": {"architectures": ["Gemma2ForCausalLM"], "model_type": "gemma2", "hidden_size": 64,
               "intermediate_size": 192, "num_hidden_layers": 2, "num_attention_heads": 2, "num_key_value_heads": 1,
               "head_dim": 48, "vocab_size": 512, "max_position_embeddings": 256, "sliding_window": 8,
               "query_pre_attn_scalar": 48, "attn_logit_softcapping": 50.0, "final_logit_softcapping": 30.0,
               "hidden_activation": "gelu_pytorch_tanh"},
    "phi3": {"architectures": ["Phi3ForCausalLM"], "model_type": "phi3", "hidden_size": 64,
             "intermediate_size": 176, "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
             "vocab_size": 512, "max_position_embeddings": 256, "resid_pdrop": 0.1, "tie_word_embeddings": False,
             "pad_token_id": 0},
    "gpt2": {"architectures": ["GPT2LMHeadModel"], "model_type": "gpt2", "n_embd": 64, "n_layer": 2, "n_head": 4,
             "vocab_size": 512, "n_positions": 256},
    "opt": {"architectures": ["OPTForCausalLM"], "model_type": "opt", "hidden_size": 64, "ffn_dim": 256,
            "num_hidden_layers": 2, "num_attention_heads": 4, "vocab_size": 512, "max_position_embeddings": 256,
            "word_embed_proj_dim": 64, "dropout": 0.1, "pad_token_id": 1},
    "starcoder2": {"architectures": ["Starcoder2ForCausalLM"], "model_type": "starcoder2", "hidden_size": 64,
                   "intermediate_size": 256, "num_hidden_layers": 2, "num_attention_heads": 4,
                   "num_key_value_heads": 2, "vocab_size": 512, "max_position_embeddings": 256,
                   "sliding_window": 16, "residual_dropout": 0.1, "embedding_dropout": 0.1},
    "t5-gated": {"architectures": ["T5ForConditionalGeneration"], "model_type": "t5", "d_model": 64, "d_ff": 128,
                 "d_kv": 16, "num_layers": 2, "num_decoder_layers": 3, "num_heads": 4, "vocab_size": 512,
                 "feed_forward_proj": "gated-gelu", "tie_word_embeddings": False},
    "bart": {"architectures": ["BartForConditionalGeneration"], "model_type": "bart", "d_model": 64,
             "encoder_layers": 2, "decoder_layers": 2, "encoder_attention_heads": 4, "decoder_attention_heads": 4,
             "encoder_ffn_dim": 128, "decoder_ffn_dim": 128, "vocab_size": 512, "max_position_embeddings": 128,
             "attention_dropout": 0.1, "activation_dropout": 0.1},
    # Whisper's encoder reads 2 x max_source_positions log-mel frames whatever --seq says (the decoder's tokens);
    # 60 positions keep the two stacks' lengths apart.
    "whisper": {"architectures": ["WhisperForConditionalGeneration"], "model_type": "whisper", "d_model": 64,
                "encoder_layers": 2, "decoder_layers": 3, "encoder_attention_heads": 4,
                "decoder_attention_heads": 4, "encoder_ffn_dim": 128, "decoder_ffn_dim": 128, "vocab_size": 512,
                "num_mel_bins": 80, "max_source_positions": 60, "max_target_positions": 448, "pad_token_id": 0,
                "bos_token_id": 1, "eos_token_id": 2, "decoder_start_token_id": 1, "dropout": 0.1,
                "attention_dropout": 0.1, "activation_dropout": 0.1},
    "t5-relu-tied": {"architectures": ["T5ForConditionalGeneration"], "model_type": "t5", "d_model": 64,
                     "d_ff": 256, "d_kv": 16, "num_layers": 2, "num_heads": 4, "vocab_size": 512,
                     "feed_forward_proj": "relu"},
    "falcon": {"architectures": ["FalconForCausalLM"], "model_type": "falcon", "hidden_size": 64,
               "num_hidden_layers": 2, "num_attention_heads": 4, "vocab_size": 512, "multi_query": True,
               "parallel_attn": True, "new_decoder_architecture": False, "bias": False},
    "falcon-new": {"architectures": ["FalconForCausalLM"], "model_type": "falcon", "hidden_size": 64,
                   "num_hidden_layers": 2, "num_attention_heads": 8, "num_kv_heads": 2, "vocab_size": 512,
                   "new_decoder_architecture": True, "ffn_hidden_size": 192, "hidden_dropout": 0.1},
    "falcon-seq": {"architectures": ["FalconForCausalLM"], "model_type": "falcon", "hidden_size": 64,
                   "num_hidden_layers": 2, "num_attention_heads": 4, "vocab_size": 512, "multi_query": False,
                   "parallel_attn": False, "bias": True, "attention_dropout": 0.1, "hidden_dropout": 0.1},
    "gptj": {"architectures": ["GPTJForCausalLM"], "model_type": "gptj", "n_embd": 64, "n_layer": 2, "n_head": 4,
             "rotary_dim": 8, "vocab_size": 512, "n_positions": 256, "resid_pdrop": 0.1, "embd_pdrop": 0.1,
             "attn_pdrop": 0.1},
    "gpt_bigcode": {"architectures": ["GPTBigCodeForCausalLM"], "model_type": "gpt_bigcode", "n_embd": 64,
                    "n_layer": 2, "n_head": 4, "n_inner": 192, "vocab_size": 512, "n_positions": 256},
    "gpt_bigcode-mha": {"architectures": ["GPTBigCodeForCausalLM"], "model_type": "gpt_bigcode", "n_embd": 64,
                        "n_layer": 2, "n_head": 4, "vocab_size": 512, "n_positions": 256, "multi_query": False},
    "bloom": {"architectures": ["BloomForCausalLM"], "model_type": "bloom", "hidden_size": 64, "n_layer": 2,
              "n_head": 4, "vocab_size": 512, "attention_dropout": 0.1, "hidden_dropout": 0.1},
    "bloom-post-ln": {"architectures": ["BloomForCausalLM"], "model_type": "bloom", "n_embed": 64, "n_layer": 2,
                      "num_attention_heads": 4, "vocab_size": 512, "apply_residual_connection_post_layernorm": True},
    "bert": {"architectures": ["BertForMaskedLM"], "model_type": "bert", "hidden_size": 64,
             "num_hidden_layers": 2, "num_attention_heads": 4, "intermediate_size": 256, "vocab_size": 512,
             "max_position_embeddings": 256},
    "vit": {"architectures": ["ViTForImageClassification"], "model_type": "vit", "hidden_size": 64,
            "num_hidden_layers": 2, "num_attention_heads": 4, "intermediate_size": 128, "image_size": 32,
            "patch_size": 8, "num_labels": 10},
    # Two towers: their blocks are compared by module path (text_model.encoder.layers.0, ...), as transformers
    # numbers the text tower first and runs the vision tower first.
    "clip": {"architectures": ["CLIPModel"], "model_type": "clip", "projection_dim": 32,
             "text_config": {"hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
                             "num_attention_heads": 4, "vocab_size": 512, "max_position_embeddings": 64},
             "vision_config": {"hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 3,
                               "num_attention_heads": 4, "image_size": 32, "patch_size": 8}},
    "siglip": {"architectures": ["SiglipModel"], "model_type": "siglip",
               "text_config": {"hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
                               "num_attention_heads": 4, "vocab_size": 512, "max_position_embeddings": 64},
               "vision_config": {"hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 3,
                                 "num_attention_heads": 4, "image_size": 32, "patch_size": 8}},
    # A vision tower (3 blocks, numbered 0-2 as forward runs it first), then a Llama (blocks 3-4) over 32 tokens of
    # which 16 are the image's patches; compared frozen as LLaVA-1.5 fine-tunes it, and in the other modes below.
    "llava": {"architectures": ["LlavaForConditionalGeneration"], "model_type": "llava", "image_token_index": 500,
              "text_config": {"model_type": "llama", "hidden_size": 64, "intermediate_size": 176,
                              "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
                              "vocab_size": 512, "max_position_embeddings": 256},
              "vision_config": {"model_type": "clip_vision_model", "hidden_size": 48, "intermediate_size": 96,
                                "num_hidden_layers": 3, "num_attention_heads": 4, "image_size": 32,
                                "patch_size": 8}},
    # A state-space model: no attention; the slow path's Python loop over positions (Note [Mamba]).
    "mamba": {"architectures": ["MambaForCausalLM"], "model_type": "mamba", "hidden_size": 64,
              "num_hidden_layers": 2, "vocab_size": 512, "state_size": 16, "expand": 2, "conv_kernel": 4},
    # GPT-OSS: sinks, alternating sliding and full layers, a biased router and grouped-matmul experts (transformers
    # 5 runs them with torch._grouped_mm; its routing keeps a few integer tensors per layer).
    "gpt_oss": {"architectures": ["GptOssForCausalLM"], "model_type": "gpt_oss", "hidden_size": 64,
                "intermediate_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
                "head_dim": 16, "vocab_size": 512, "max_position_embeddings": 256, "num_local_experts": 4,
                "num_experts_per_tok": 2, "sliding_window": 8, "layer_types": ["sliding_attention", "full_attention"],
                "tie_word_embeddings": False},
    # Llama 4's text model: MoE in every other layer (every expert over every token, a shared expert), NoPE in the
    # last, chunked attention and the L2 q/k norm in the others; its rotary runs in complex64.
    "llama4_text": {"architectures": ["Llama4ForCausalLM"], "model_type": "llama4_text", "hidden_size": 64,
                    "intermediate_size": 64, "intermediate_size_mlp": 128, "num_hidden_layers": 4,
                    "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16, "vocab_size": 512,
                    "max_position_embeddings": 256, "num_local_experts": 4, "num_experts_per_tok": 1,
                    "interleave_moe_layer_step": 2, "no_rope_layers": [1, 1, 1, 0], "attention_chunk_size": 8,
                    "use_qk_norm": True, "attn_temperature_tuning": True, "tie_word_embeddings": False},
}
TINY["llava-all"] = TINY["llava"]
TINY["llava-projector"] = dict(TINY["llava"], vision_feature_select_strategy="full")

# The transformers releases each comparison holds for, [from, before), and why. Outside them the subtest is
# skipped, saying so; README lists these as open.
TRANSFORMERS_RANGE = {
    # GPT-OSS came in 4.55; the builder follows transformers 5's grouped-matmul experts.
    "gpt_oss": ((5, 0), None, "the builder follows transformers 5's GPT-OSS experts"),
    # Llama 4 came in 4.51; the builder was written from transformers 5.
    "llama4_text": ((5, 0), None, "the builder follows transformers 5's Llama 4"),
}


def transformers_outside(family):
    """Why the installed transformers is outside `family`'s TRANSFORMERS_RANGE, or None."""
    low, high, why = TRANSFORMERS_RANGE.get(family, (None, None, ""))
    installed = tuple(int(part) for part in transformers.__version__.split(".")[:2])
    if (low and installed < low) or (high and installed >= high):
        return f"transformers {transformers.__version__}: {why}"
    return None

# What trains, as each side spells it: the tracer freezes by parameter name, the builder by --vlm-train.
# From transformers 4.52 LLaVA's parts live under model. (LlavaModel), its head beside them.
LLAVA_PARTS = "model." if HAVE_TRANSFORMERS and hasattr(transformers, "LlavaModel") else ""
TRACE_ARGS = {"llava": ["--freeze", LLAVA_PARTS + "vision_tower."],
              "llava-projector": ["--freeze", LLAVA_PARTS + "vision_tower.", "--freeze",
                                  LLAVA_PARTS + "language_model."]}
ESTIMATE_ARGS = {"llava-all": ["--vlm-train", "all"], "llava-projector": ["--vlm-train", "projector"]}


@unittest.skipUnless(HAVE_TRANSFORMERS, "needs transformers")
class HuggingFaceTest(unittest.TestCase):
    def write_config(self, directory, config):
        path = os.path.join(directory, "config.json")
        with open(path, "w") as f:
            json.dump(config, f)
        return path

    def test_inference_fills_a_kv_cache_and_saves_nothing(self):
        with tempfile.TemporaryDirectory() as d:
            out = os.path.join(d, "prefill.json")
            result = run_cli("--hf-config", self.write_config(d, TINY["llama-gqa"]), "--inference", "--batch", "2",
                             "--seq", "16", "-o", out)
            self.assertEqual(result.returncode, 0, result.stderr)
            with open(out) as f:
                g = json.load(f)
            self.assertEqual({op["phase"] for op in g["ops"]}, {"forward"})
            self.assertFalse(any("saved" in op for op in g["ops"]))
            # The cache: each layer's keys and values, 2 KV heads of 16 dims over 16 tokens, made by cat.
            cats = [op for op in g["ops"] if op["kind"] == "cat" and op.get("layer", -1) == 1]
            shapes = [g["tensors"][op["outputs"][0]]["shape"] for op in cats]
            self.assertIn([2, 2, 16, 16], shapes)
            if HEADROOM:
                estimate = run_headroom("estimate", "--model", out, "--inference", "--budget", "1GiB", "--no-search",
                                        "--precision", "fp32")
                self.assertEqual(estimate.returncode, 0, estimate.stderr)

    def test_a_model_without_a_head_needs_inference(self):
        with tempfile.TemporaryDirectory() as d:
            config = dict(TINY["llama-gqa"], architectures=["LlamaModel"])
            result = run_cli("--hf-config", self.write_config(d, config), "--seq", "8")
            self.assertNotEqual(result.returncode, 0)
            self.assertIn("LlamaModel returns no logits", result.stderr)

    def test_llava_takes_image_tokens_and_pixels_and_freezes_by_name(self):
        with tempfile.TemporaryDirectory() as d:
            path = self.write_config(d, TINY["llava"])
            out = os.path.join(d, "llava.json")
            result = run_cli("--hf-config", path, "--batch", "2", "--seq", "40", "--images", "2",
                             "--freeze", LLAVA_PARTS + "vision_tower.", "-o", out)
            self.assertEqual(result.returncode, 0, result.stderr)
            with open(out) as f:
                g = json.load(f)
            inputs = {t["name"]: t["shape"] for t in g["tensors"] if t["role"] == "input"}
            self.assertEqual(inputs["pixel_values"], [4, 3, 32, 32])
            self.assertEqual(inputs["input_ids"], [2, 40])
            # Two images of 16 patches each go into the embeddings; the vision tower is frozen.
            scatter = ops_named(g, "masked_scatter")[0]
            self.assertEqual(nbytes(g["tensors"][scatter["inputs"][2]]), 4 * 16 * 64 * 4)
            frozen = [t for t in g["tensors"] if t["role"] == "parameter"
                      and t["name"].startswith(LLAVA_PARTS + "vision_tower.")]
            self.assertTrue(frozen)
            self.assertFalse(any(t["trainable"] for t in frozen))
            result = run_cli("--hf-config", path, "--freeze", "vision_model.", "-o", out)
            self.assertNotEqual(result.returncode, 0)
            self.assertIn("--freeze 'vision_model.': no parameter", result.stderr)

    def test_a_config_without_model_type_is_refused(self):
        with tempfile.TemporaryDirectory() as d:
            result = run_cli("--hf-config", self.write_config(d, {"hidden_size": 8}))
            self.assertNotEqual(result.returncode, 0)
            self.assertIn("model_type: field is required", result.stderr)


# Families without a builder: GPT-Neo (global and local attention layers). Each traces, keeps transformers'
# parameter count, and estimates and plans.
NO_BUILDER = {
    "gpt_neo": {"architectures": ["GPTNeoForCausalLM"], "model_type": "gpt_neo", "hidden_size": 64, "num_layers": 2,
                "num_heads": 4, "vocab_size": 512, "max_position_embeddings": 128,
                "attention_types": [[["global", "local"], 1]], "window_size": 16},
}


def transformers_parameter_count(config):
    document = dict(config)
    hf_config = transformers.AutoConfig.for_model(document.pop("model_type"), **document)
    with sources.on_meta():
        model = getattr(transformers, config["architectures"][0])._from_config(hf_config)
    return sum(p.numel() for p in model.parameters())  # tied weights once


@unittest.skipUnless(HAVE_TRANSFORMERS, "needs transformers")
class FamiliesWithoutBuildersTest(unittest.TestCase):
    def test_trace_keeps_the_parameters_and_estimates(self):
        for family, config in NO_BUILDER.items():
            with self.subTest(family=family), tempfile.TemporaryDirectory() as d:
                config_path = os.path.join(d, "config.json")
                with open(config_path, "w") as f:
                    json.dump(config, f)
                out = os.path.join(d, "traced.json")
                result = run_cli("--hf-config", config_path, "--batch", "2", "--seq", "16", "-o", out)
                self.assertEqual(result.returncode, 0, result.stderr)
                with open(out) as f:
                    g = json.load(f)
                self.assertEqual(parameter_count(g), transformers_parameter_count(config))
                self.assertIn("loss", {op["phase"] for op in g["ops"]})
                self.assertTrue(any(op.get("saved") for op in g["ops"] if op.get("layer", -1) >= 0))
                if HEADROOM:
                    estimate = run_headroom("estimate", "--model", out, "--budget", "1GiB", "--precision", "fp32",
                                            "--no-search")
                    self.assertEqual(estimate.returncode, 0, estimate.stderr)
                    plan = run_headroom("plan", "--model", out, "--budget", "1GiB", "--precision", "fp32")
                    self.assertEqual(plan.returncode, 0, plan.stderr + plan.stdout)


def saved_bytes_per_layer(graph, by_module=False):
    """Bytes of the distinct storages each block's forward ops save for backward, by block index, or with
    `by_module` by the block's module path ("vision_model.encoder.layers.0"). Left out:
    - parameters and buffers, resident anyway;
    - a tensor saved by several blocks (Llama's rotary cos/sin tables, computed once before the layers);
    - rotary tables: transformers 4.46 computes them inside every layer for Mistral, Gemma, Gemma 2 and Phi-3
      (2 x seq x rotary_dim per layer) but once for Llama and Qwen2; the builder models the once-per-model
      tables, as resident buffers;
    - scalars (a 4-byte divisor GPT-2 makes with torch.full)."""
    tensors = graph["tensors"]
    producer = {}
    for op in graph["ops"]:
        for tid in op.get("outputs", []):
            producer.setdefault(tid, op["name"])
    savers = {}
    for op in graph["ops"]:
        if op.get("phase", "forward") != "forward" or op.get("layer", -1) < 0:
            continue
        block = block_of(op["name"]) if by_module else op["layer"]
        for tid in op.get("saved", []):
            b = tensors[tid].get("view_of", tid)
            if (tensors[b]["role"] in ("parameter", "buffer") or not tensors[b]["shape"]
                    or "rotary_emb" in producer.get(b, "")):
                continue
            savers.setdefault(b, set()).add(block)
    per_layer = {}
    for b, layers in savers.items():
        if len(layers) == 1:
            (layer,) = layers
            per_layer[layer] = per_layer.get(layer, 0) + nbytes(tensors[b])
    return per_layer


def block_count(config):
    if config["model_type"] == "t5":  # encoder blocks, then decoder blocks
        return config["num_layers"] + config.get("num_decoder_layers", config["num_layers"])
    if config["model_type"] in ("bart", "whisper"):
        return config["encoder_layers"] + config["decoder_layers"]
    if config["model_type"] == "llava":
        return config["vision_config"]["num_hidden_layers"] + config["text_config"]["num_hidden_layers"]
    return config.get("num_hidden_layers", config.get("n_layer"))


def parameter_count(graph):
    return sum(nbytes(t) // DTYPE_BYTES[t["dtype"]] for t in graph["tensors"] if t["role"] == "parameter"
               and "view_of" not in t)


@unittest.skipUnless(HAVE_TRANSFORMERS and HEADROOM, "needs transformers and HEADROOM_BIN")
class BuilderAgreesWithTraceTest(unittest.TestCase):
    """Op by op, through what autograd keeps: for each family that transformers can build, the traced graph's
    saved bytes per layer equal the builder's. The trace runs on the meta device, which takes PyTorch's
    non-CUDA paths, so the builder is asked for the same (--kernels cpu) at the PyTorch and transformers versions
    traced."""

    def test_families(self):
        torch_version = ".".join(torch.__version__.split(".")[:2])
        transformers_version = ".".join(transformers.__version__.split(".")[:2])
        batch, seq = 2, 32
        for family, config in TINY.items():
            with self.subTest(family=family), tempfile.TemporaryDirectory() as d:
                if transformers_outside(family):
                    self.skipTest(transformers_outside(family))
                config_path = os.path.join(d, "config.json")
                with open(config_path, "w") as f:
                    json.dump(config, f)
                traced_path = os.path.join(d, "traced.json")
                result = run_cli("--hf-config", config_path, "--batch", str(batch), "--seq", str(seq),
                                 *TRACE_ARGS.get(family, []), "-o", traced_path)
                self.assertEqual(result.returncode, 0, result.stderr)
                built_path = os.path.join(d, "built.json")
                # A ViT's sequence is its image's patches: the builder takes no --seq for it.
                seq_args = [] if config["model_type"] == "vit" else ["--seq", str(seq)]
                built = run_headroom("estimate", "--model", config_path, "--budget", "80GiB", "--precision", "fp32",
                                     "--attention", "eager", "--kernels", "cpu", "--torch", torch_version,
                                     "--transformers", transformers_version,
                                     "--micro-batch", str(batch), *seq_args, "--no-search",
                                     *ESTIMATE_ARGS.get(family, []), "--graph-out", built_path)
                self.assertEqual(built.returncode, 0, built.stderr)
                with open(traced_path) as f:
                    traced = json.load(f)
                with open(built_path) as f:
                    builder = json.load(f)
                self.assertEqual(parameter_count(traced), parameter_count(builder))
                towers = "vision_config" in config and config["model_type"] != "llava"
                traced_layers = saved_bytes_per_layer(traced, by_module=towers)
                if towers:
                    expected = [f"{tower}_model.encoder.layers.{i}" for tower in ("text", "vision")
                                for i in range(config[f"{tower}_config"]["num_hidden_layers"])]
                else:
                    expected = list(range(block_count(config)))
                if family in TRACE_ARGS and "--freeze" in TRACE_ARGS[family]:
                    # A frozen vision tower saves nothing: only the language model's blocks appear.
                    expected = expected[config["vision_config"]["num_hidden_layers"]:]
                self.assertEqual(sorted(traced_layers), sorted(expected))
                self.assertEqual(traced_layers, saved_bytes_per_layer(builder, by_module=towers))


if __name__ == "__main__":
    unittest.main()
