"""Modules the tracer tests build through --module: nothing Headroom has a builder for."""

import torch
from torch import nn


class Block(nn.Module):
    def __init__(self, width):
        super().__init__()
        self.norm = nn.LayerNorm(width)
        self.up = nn.Linear(width, 4 * width)
        self.down = nn.Linear(4 * width, width)

    def forward(self, x):
        return x + self.down(torch.tanh(self.up(self.norm(x))))


class TanhMlp(nn.Module):
    """A residual MLP of `depth` blocks over [batch, width] inputs, then a classifier."""

    def __init__(self, width=32, depth=3, classes=10):
        super().__init__()
        self.blocks = nn.ModuleList(Block(width) for _ in range(depth))
        self.head = nn.Linear(width, classes)

    def forward(self, x):
        for block in self.blocks:
            x = block(x)
        return self.head(x)


def frozen_body(width=16):
    """A module whose first layer is frozen (requires_grad False), as LoRA bases are."""
    model = nn.Sequential(nn.Linear(width, width), nn.ReLU(), nn.Linear(width, 2))
    model[0].weight.requires_grad_(False)
    model[0].bias.requires_grad_(False)
    return model


def not_a_module():
    return 42
