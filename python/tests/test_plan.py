"""Tests of headroom.plan and plans applied op by op. Run from python/: python -m unittest discover -s tests -t .

They need PyTorch 2.4 or later (selective activation checkpointing), transformers, and the headroom executable
(HEADROOM_BIN, or build/cli/headroom of the checkout); each is skipped without them. The memory a plan promises is
checked against real steps by validation/apply-plans, with the allocation hook; here: that plans apply, change no
gradient, refuse a model that runs other ops, and undo themselves.
"""
import os
import re
import unittest

import torch

try:
    import transformers
except ImportError:
    transformers = None

import headroom
from headroom import _native
from tests.bitwise import differing

try:
    from torch.utils.checkpoint import create_selective_checkpoint_contexts  # noqa: F401
    HAVE_SAC = True
except ImportError:
    HAVE_SAC = False

try:
    _native.executable()
    HAVE_HEADROOM = True
except _native.NotInstalled:
    HAVE_HEADROOM = False

README = os.path.join(os.path.dirname(__file__), "..", "..", "README.md")


# Three layers, and sequences long enough that the layers' activations, not the logits, fill the step.
def tiny_llama():
    torch.manual_seed(0)
    config = transformers.LlamaConfig(vocab_size=128, hidden_size=64, intermediate_size=160, num_hidden_layers=3,
                                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256)
    model = transformers.LlamaForCausalLM(config).train()
    ids = torch.randint(0, 128, (2, 128), generator=torch.Generator().manual_seed(1))
    return model, {"input_ids": ids, "labels": ids}


def tiny_gpt2():
    torch.manual_seed(0)
    config = transformers.GPT2Config(vocab_size=128, n_embd=64, n_layer=3, n_head=4, n_positions=256,
                                     bos_token_id=0, eos_token_id=0)
    model = transformers.GPT2LMHeadModel(config).train()
    ids = torch.randint(0, 128, (2, 128), generator=torch.Generator().manual_seed(1))
    return model, {"input_ids": ids, "labels": ids}


def gradients(model, batch, seed=5):
    model.zero_grad(set_to_none=True)
    torch.manual_seed(seed)
    model(**batch).loss.backward()
    return {n: p.grad.clone() for n, p in model.named_parameters()}


@unittest.skipUnless(HAVE_SAC and transformers is not None and HAVE_HEADROOM,
                     "needs PyTorch >= 2.4, transformers and the headroom executable")
class PlanTest(unittest.TestCase):
    def test_every_strategy_changes_no_gradient(self):
        for build in (tiny_llama, tiny_gpt2):  # GPT-2's dropouts replay with the RNG they first drew
            model, batch = build()
            model.config.use_cache = False
            reference = gradients(model, batch)
            for strategy in ("sqrt-n", "chain-dp", "optimal", "hybrid", None):
                with self.subTest(model=type(model).__name__, strategy=strategy):
                    try:
                        plan = headroom.plan(model, batch, budget="60%", strategy=strategy, optimizer="sgd")
                    except headroom.PlanError as error:
                        self.assertRegex(str(error), "budget")  # a strategy with no plan says so
                        continue
                    self.assertTrue(plan.fits, str(plan))
                    self.assertLessEqual(plan.peak_bytes, plan.budget_bytes)
                    self.assertTrue(plan.regions, str(plan))
                    with plan.applied(model):
                        self.assertEqual(differing(reference, gradients(model, batch)), {})

    def test_apply_and_remove_restore_the_model(self):
        model, batch = tiny_llama()
        plan = headroom.plan(model, batch, budget="60%", strategy="chain-dp", optimizer="sgd")
        blocks = [model.get_submodule(r.module) for r in plan.regions]
        self.assertTrue(blocks)
        plan.apply(model)
        self.assertTrue(all("forward" in b.__dict__ for b in blocks))
        self.assertFalse(model.config.use_cache)  # a cache would be extended twice by the replay
        plan.remove()
        plan.remove()  # twice is harmless
        self.assertTrue(all("forward" not in b.__dict__ for b in blocks))
        self.assertTrue(model.config.use_cache)

    def test_a_model_that_runs_other_ops_is_refused_by_name(self):
        model, batch = tiny_llama()
        plan = headroom.plan(model, batch, budget="60%", strategy="chain-dp", optimizer="sgd")
        shorter = {k: v[:, :64] for k, v in batch.items()}  # same ops, other shapes: fine
        with plan.applied(model):
            model(**shorter).loss.backward()
        model.config._attn_implementation = "eager"  # another attention: other ops
        try:
            with plan.applied(model), self.assertRaisesRegex(headroom.PlanMismatch,
                                                             r"model\.layers\.\d+: op \d+ is aten\.\w+"):
                model(**batch).loss.backward()
        finally:
            model.config._attn_implementation = "sdpa"

    def test_a_plan_runs_within_its_shape_envelope_and_refuses_larger_inputs(self):
        model, batch = tiny_llama()  # (2, 128) token batches
        model.config.use_cache = False
        plan = headroom.plan(model, batch, budget="60%", strategy="chain-dp", optimizer="sgd")
        self.assertEqual(str(plan.envelope), "input_ids 2x128, labels 2x128")
        for shape in ((2, 64), (2, 96), (1, 128)):  # dynamic padding: every batch its own length
            smaller = {k: v[:shape[0], :shape[1]] for k, v in batch.items()}
            reference = gradients(model, smaller)
            with plan.applied(model):
                self.assertEqual(differing(reference, gradients(model, smaller)), {})
        longer = {k: torch.cat([v, v[:, :32]], dim=1) for k, v in batch.items()}
        wider = {k: torch.cat([v, v]) for k, v in batch.items()}
        for inputs, pattern in ((longer, r"^input 'input_ids': dimension 1 is 160, larger than the 128 the plan was "
                                         r"made for .*max_shapes="),
                                (wider, r"^input 'input_ids': dimension 0 is 4, larger than the 2")):
            model.zero_grad(set_to_none=True)
            with plan.applied(model), self.assertRaisesRegex(headroom.PlanMismatch, pattern) as raised:
                model(**inputs).loss.backward()
            self.assertNotIn("\n", str(raised.exception))
            self.assertTrue(all(p.grad is None for p in model.parameters()))  # refused before anything ran
        with plan.applied(model), torch.no_grad():
            model(**longer)  # without gradients the plan does not apply, nor its envelope
        self.assertTrue(all("forward" not in m.__dict__ for m in model.modules()))

    def test_max_shapes_plan_for_the_longest_batch(self):
        model, batch = tiny_llama()
        model.config.use_cache = False
        small = headroom.plan(model, batch, budget="1GiB", strategy="chain-dp", optimizer="sgd")
        plan = headroom.plan(model, batch, budget="1GiB", strategy="chain-dp", optimizer="sgd",
                             max_shapes={"input_ids": (2, 192), "labels": (2, 192)})
        self.assertEqual(str(plan.envelope), "input_ids 2x192, labels 2x192")
        self.assertIn("for inputs up to input_ids 2x192, labels 2x192", str(plan))
        self.assertGreater(plan.store_all_bytes, small.store_all_bytes)  # traced at the envelope
        shapes = {tuple(t["shape"]) for t in plan.graph["tensors"] if t.get("role") == "input"}
        self.assertIn((2, 192), shapes)
        longest = {k: torch.cat([v, v[:, :64]], dim=1) for k, v in batch.items()}
        reference = gradients(model, longest)
        with plan.applied(model):
            self.assertEqual(differing(reference, gradients(model, longest)), {})
            self.assertEqual(differing(gradients(model, batch), gradients(model, batch)), {})
        with self.assertRaisesRegex(ValueError, r"max_shapes: 'ids' is not an input of the example batch"):
            headroom.plan(model, batch, budget="60%", max_shapes={"ids": (2, 192)})

    def test_a_plan_names_what_it_runs(self):
        model, batch = tiny_llama()
        plan = headroom.plan(model, batch, budget="60%", optimizer="sgd")
        text = str(plan)
        self.assertIn("LlamaForCausalLM", text)
        self.assertIn("as PyTorch runs it", text)
        self.assertRegex(text, r"peak [\d.]+ MiB of activations and gradients for a budget of [\d.]+ MiB")
        self.assertIn("model.layers.", text)
        self.assertEqual(plan.plan_file["format"], "headroom-plan")

    def test_bad_arguments_get_one_clear_error(self):
        model, batch = tiny_llama()
        with self.assertRaisesRegex(ValueError, "give budget="):
            headroom.plan(model, batch)
        with self.assertRaisesRegex(ValueError, "give budget="):
            headroom.plan(model, batch, budget="50%", gpu="H100-80GB")
        with self.assertRaisesRegex(headroom.PlanError, "smallest peak"):
            headroom.plan(model, batch, budget="1KiB", strategy="chain-dp")
        with self.assertRaisesRegex(headroom.PlanError, "--strategy"):
            headroom.plan(model, batch, budget="50%", strategy="greedy")
        with self.assertRaisesRegex(headroom.PlanError, "no .loss"):
            headroom.plan(torch.nn.Linear(4, 4), torch.randn(2, 4), budget="50%")

    def test_offloads_run_through_saved_tensor_hooks_and_change_no_gradient(self):
        # On a CPU with emulate_host the copies go to a mapping apart from PyTorch's allocator, as to a GPU's host.
        for build in (tiny_llama, tiny_gpt2):
            model, batch = build()
            model.config.use_cache = False
            reference = gradients(model, batch)
            for strategy in ("offload", "hybrid"):
                with self.subTest(model=type(model).__name__, strategy=strategy):
                    plan = headroom.plan(model, batch, budget="50%", strategy=strategy, optimizer="sgd",
                                         emulate_host=True)
                    self.assertTrue(plan.fits, str(plan))
                    self.assertTrue(plan.offloads, str(plan))
                    self.assertIn("offloaded by saved-tensor hooks", str(plan))
                    with plan.applied(model):
                        self.assertEqual(differing(reference, gradients(model, batch)), {})
                    # Host memory held at once is the plan's, to the byte (validation/apply-plans checks the
                    # device side with the allocation hook).
                    self.assertEqual(plan.host_peak_measured_bytes, plan.host_bytes)

    def test_offloads_refuse_a_model_that_runs_other_ops(self):
        model, batch = tiny_llama()
        plan = headroom.plan(model, batch, budget="50%", strategy="offload", optimizer="sgd", emulate_host=True)
        model.config._attn_implementation = "eager"
        try:
            with plan.applied(model), self.assertRaisesRegex(headroom.PlanMismatch,
                                                             r"LlamaForCausalLM: op \d+ of the forward is aten\.\w+"):
                model(**batch).loss.backward()
        finally:
            model.config._attn_implementation = "sdpa"
        with self.assertRaisesRegex(ValueError, "emulate_host is for a model on a CPU"):
            headroom.plan(model.to("meta"), batch, budget="50%", emulate_host=True)

    def test_planning_touches_neither_the_model_nor_the_random_numbers(self):
        model, batch = tiny_gpt2()
        before = {n: p.detach().clone() for n, p in model.named_parameters()}
        rng = torch.get_rng_state()
        headroom.plan(model, batch, budget="60%", strategy="chain-dp", optimizer="sgd")
        self.assertTrue(torch.equal(rng, torch.get_rng_state()))
        for n, p in model.named_parameters():
            self.assertTrue(torch.equal(before[n], p), n)
            self.assertIsNone(p.grad, n)


class AllocatorTest(unittest.TestCase):
    """What runs without a GPU: the allocator's names and its statistics before it is in use. Loading it into
    PyTorch needs a CUDA device (validation/headroom_validation/pluggable.py runs it there)."""

    def test_unknown_allocators_and_early_statistics_are_refused(self):
        with self.assertRaisesRegex(ValueError, "unknown allocator 'jemalloc'"):
            headroom.use_allocator("jemalloc")
        headroom.use_allocator("pytorch")  # PyTorch's own: nothing to do
        with self.assertRaisesRegex(RuntimeError, "not in use"):
            headroom.allocator_stats()


@unittest.skipUnless(HAVE_SAC and transformers is not None and HAVE_HEADROOM,
                     "needs PyTorch >= 2.4, transformers and the headroom executable")
class ReadmeTest(unittest.TestCase):
    def test_the_readme_python_example_runs_as_written(self):
        with open(README) as f:
            text = f.read()
        section = text[text.index("\n## Python\n"):]
        code = re.search(r"```python\n(.*?)```", section, re.S).group(1)
        namespace = {}
        exec(compile(code, "README.md (Python)", "exec"), namespace)  # noqa: S102  (the README's own example)
        self.assertIsInstance(namespace["plan"], headroom.Plan)


if __name__ == "__main__":
    unittest.main()
