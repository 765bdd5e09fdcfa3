"""Gradients compared bit for bit. Importing this pins PyTorch to one intra-op thread, so that no kernel's summation
order depends on how many threads the machine offers or the math library picks under load."""
import torch

torch.set_num_threads(1)


def differing(reference, got):
    """The parameters whose gradients differ in any bit, each with its largest difference."""
    return {n: (reference[n] - got[n]).abs().max().item() for n in reference if not torch.equal(reference[n], got[n])}
