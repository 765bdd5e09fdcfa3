"""What `headroom plan --emit torch|hf` prints, run as printed on real transformers models: the settings change no
gradient (selective attention registers its mask; checkpoints restore the random state). Run from python/:
python -m unittest discover -s tests -t . Needs PyTorch >= 2.4, transformers and the headroom executable.
The peaks these settings reach are checked against the allocation hook by validation/apply-plans --emit.
"""
import json
import os
import subprocess
import tempfile
import unittest

import torch
import torch.utils.checkpoint  # PyTorch 1.x does not import it with torch

try:
    import transformers
except ImportError:
    transformers = None

from headroom import _native
from tests.bitwise import differing

try:
    HEADROOM = _native.executable()
except _native.NotInstalled:
    HEADROOM = None

LLAMA = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "vocab_size": 128, "hidden_size": 64,
         "intermediate_size": 160, "num_hidden_layers": 4, "num_attention_heads": 4, "num_key_value_heads": 2,
         "max_position_embeddings": 256, "tie_word_embeddings": False, "attention_dropout": 0.1}
GPT2 = {"architectures": ["GPT2LMHeadModel"], "model_type": "gpt2", "vocab_size": 128, "n_embd": 64, "n_layer": 4,
        "n_head": 4, "n_positions": 256, "bos_token_id": 0, "eos_token_id": 0}


def emit(config, fmt, budget, strategy):
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "config.json")
        with open(path, "w") as f:
            json.dump(config, f)
        result = subprocess.run([HEADROOM, "plan", "--model", path, "--emit", fmt, "--budget", budget, "--strategy",
                                 strategy, "--attention", "eager", "--precision", "fp32", "--micro-batch", "2",
                                 "--seq", "128", "--optimizer", "sgd", "--kernels", "cpu", "--torch", "2.15",
                                 "--transformers", "5.24"], capture_output=True, text=True)
    return result


def unwrapped(text):
    """The emitted comments as one line each: they wrap at 100 columns."""
    return text.replace("\n# ", " ")


def build(config, attention):
    torch.manual_seed(0)
    document = dict(config)
    model_type = document.pop("model_type")
    hf_config = transformers.AutoConfig.for_model(model_type, **document)
    cls = getattr(transformers, config["architectures"][0])
    model = cls._from_config(hf_config, attn_implementation=attention).train()
    model.config.use_cache = False
    ids = torch.randint(0, 128, (2, 128), generator=torch.Generator().manual_seed(1))
    return model, {"input_ids": ids, "labels": ids}


def gradients(model, batch):
    model.zero_grad(set_to_none=True)
    torch.manual_seed(5)
    model(**batch).loss.backward()
    return {n: p.grad.clone() for n, p in model.named_parameters()}


@unittest.skipUnless(transformers is not None and HEADROOM and hasattr(torch.utils.checkpoint, "CheckpointPolicy"),
                     "needs PyTorch >= 2.4, transformers and the headroom executable")
class EmittedSettingsTest(unittest.TestCase):
    def run_snippet(self, config, fmt, budget, strategy, namespace=None):
        """Runs what `headroom plan --emit` prints, as printed (with `model` defined where it names one)."""
        result = emit(config, fmt, budget, strategy)
        self.assertEqual(result.returncode, 0, result.stderr)
        self.assertRegex(unwrapped(result.stdout), r"these settings peak at [\d.]+ \w?i?B")
        namespace = {} if namespace is None else namespace
        exec(compile(result.stdout, f"headroom plan --emit {fmt}", "exec"), namespace)  # noqa: S102
        return result.stdout, namespace

    def test_torch_selective_attention_keeps_the_causal_mask(self):
        for config in (LLAMA, GPT2):
            with self.subTest(model=config["model_type"]):
                text, namespace = self.run_snippet(config, "torch", "85%", "chain-dp")
                self.assertTrue(namespace["SELECTIVE"], text)  # the chain-dp plan replays attention cores here
                reference = gradients(*build(config, "eager"))
                model, batch = build(config, "headroom_selective")
                namespace["apply_plan"](model)
                self.assertEqual(differing(reference, gradients(model, batch)), {})

    def test_hf_switch_whenever_every_layer_is_checkpointed(self):
        reference = gradients(*build(GPT2, "eager"))
        model, batch = build(GPT2, "eager")
        text, _ = self.run_snippet(GPT2, "hf", "50%", "sqrt-n", {"model": model})
        self.assertIn("model.gradient_checkpointing_enable(", text)
        self.assertTrue(model.is_gradient_checkpointing)
        self.assertEqual(differing(reference, gradients(model, batch)), {})

    def test_torch_budget_warns_where_dropout_would_be_recomputed(self):
        result = emit(GPT2, "torch-budget", "50%", "chain-dp")
        self.assertEqual(result.returncode, 0, result.stderr)
        self.assertIn("WARNING: this step draws random numbers (dropout)", unwrapped(result.stdout))
        self.assertIn("not the peak of these settings", unwrapped(result.stdout))


if __name__ == "__main__":
    unittest.main()
