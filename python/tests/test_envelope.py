"""Tests of a plan's shape envelope (headroom/envelope.py) on its own: naming inputs, covering, checking, growing.
The envelope applied to real plans is tested in test_plan.py."""
import unittest

import torch

from headroom.envelope import PlanMismatch, ShapeEnvelope, grown, map_tensors, named_tensors


def forward(input_ids, attention_mask=None, labels=None, past=None, **extra):
    return input_ids


class EnvelopeTest(unittest.TestCase):
    def test_inputs_are_named_by_the_signature_wherever_they_are_passed(self):
        ids = torch.zeros(2, 8, dtype=torch.long)
        by_position = named_tensors(forward, (ids, ids), {})
        by_keyword = named_tensors(forward, (), {"input_ids": ids, "attention_mask": ids})
        self.assertEqual(list(by_position), ["input_ids", "attention_mask"])
        self.assertEqual(list(by_keyword), list(by_position))
        nested = named_tensors(forward, (ids,), {"past": (ids, [ids]), "pixels": ids, "step": 3})
        self.assertEqual(list(nested), ["input_ids", "past[0]", "past[1][0]", "pixels"])

    def test_smaller_inputs_pass_and_larger_ones_are_refused_by_input_and_dimension(self):
        ids = torch.zeros(4, 64, dtype=torch.long)
        envelope = ShapeEnvelope.of(forward, (), {"input_ids": ids, "labels": ids})
        self.assertEqual(str(envelope), "input_ids 4x64, labels 4x64")
        for shape in ((4, 32), (4, 48), (1, 64), (4, 64)):
            t = torch.zeros(shape, dtype=torch.long)
            envelope.check(forward, (t,), {"labels": t})
        with self.assertRaisesRegex(PlanMismatch, r"input 'input_ids': dimension 0 is 16, larger than the 4"):
            envelope.check(forward, (torch.zeros(16, 64),), {})
        with self.assertRaisesRegex(PlanMismatch, r"input 'labels': dimension 1 is 65, larger than the 64"):
            envelope.check(forward, (ids,), {"labels": torch.zeros(4, 65)})
        with self.assertRaisesRegex(PlanMismatch, r"input 'input_ids' has shape 4x64x1, 3 dimensions"):
            envelope.check(forward, (torch.zeros(4, 64, 1),), {})
        with self.assertRaisesRegex(PlanMismatch, r"input 'attention_mask': the plan was made without this input"):
            envelope.check(forward, (ids, ids), {})

    def test_max_shapes_cover_more_and_name_what_is_wrong(self):
        ids = torch.zeros(4, 64, dtype=torch.long)
        envelope = ShapeEnvelope.of(forward, (ids,), {"labels": ids})
        wider = envelope.covering(ShapeEnvelope.parse(forward, {"input_ids": (2, 128), "labels": torch.zeros(8, 1)}))
        self.assertEqual(wider.shapes, {"input_ids": (4, 128), "labels": (8, 64)})
        listed = envelope.covering(ShapeEnvelope.parse(forward, [{"input_ids": (4, 96)}, {"input_ids": (5, 32)}]))
        self.assertEqual(listed.shapes["input_ids"], (5, 96))
        one = ShapeEnvelope.of(forward, (ids,), {}).covering(ShapeEnvelope.parse(forward, (4, 100)))
        self.assertEqual(one.shapes, {"input_ids": (4, 100)})
        with self.assertRaisesRegex(ValueError, r"max_shapes: 'input' is not an input of the example batch "
                                                r"\(its inputs: input_ids, labels\)"):
            envelope.covering(ShapeEnvelope.parse(forward, {"input": (4, 64)}))
        with self.assertRaisesRegex(ValueError, r"max_shapes: 'labels' has 1 dimensions, the example batch's 2"):
            envelope.covering(ShapeEnvelope.parse(forward, {"labels": (4,)}))
        with self.assertRaisesRegex(ValueError, r"max_shapes\['labels'\]: every dimension must be positive"):
            ShapeEnvelope.parse(forward, {"labels": (4, 0)})
        with self.assertRaisesRegex(ValueError, r"max_shapes\['labels'\]: expected a shape"):
            ShapeEnvelope.parse(forward, {"labels": "4x64"})
        with self.assertRaisesRegex(ValueError, "max_shapes: an empty list"):
            ShapeEnvelope.parse(forward, [])

    def test_grown_tiles_the_example_values(self):
        ids = torch.arange(6).reshape(2, 3)
        self.assertTrue(torch.equal(grown(ids, (3, 5)), torch.tensor([[0, 1, 2, 0, 1], [3, 4, 5, 3, 4],
                                                                      [0, 1, 2, 0, 1]])))
        self.assertIs(grown(ids, (2, 3)), ids)
        args, kwargs = map_tensors(forward, (ids,), {"labels": ids, "step": 1},
                                   lambda name, t: grown(t, (2, 4) if name == "labels" else (2, 3)))
        self.assertEqual(tuple(args[0].shape), (2, 3))
        self.assertEqual(tuple(kwargs["labels"].shape), (2, 4))
        self.assertEqual(kwargs["step"], 1)


if __name__ == "__main__":
    unittest.main()
