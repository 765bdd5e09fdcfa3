"""Records the allocation trace of a whole training run on the CPU, for the allocator's benchmarks.

    validation/record-trace gpt2-fp32-adamw ../bench/traces/gpt2-fp32-adamw.6steps.rmm.csv --steps 6
    validation/record-trace lstm ../bench/traces/lstm-fp32-adamw.6steps.rmm.csv --steps 6

Unlike a fixture's trace (one step, after a warm-up step), this one starts before the model is built and
covers --steps steps, so a replay sees every allocation from the first: the model, the first step that
creates optimizer state, and the steady steps after it. NAME is a configuration of configs.py or `lstm`, a
4-layer LSTM language model (hidden 512, vocabulary 8192, batch 16 x 128 tokens, AdamW) that no fixture
covers. Beside OUT.rmm.csv it writes OUT.steps.json, the event count at the end of each step (a line's time in the
trace is its event number), so that a replay can tell the warm-up from the steady steps. Runs under the allocation
hook (LD_PRELOAD, as validation/record sets it).
"""
import argparse
import json
import os
import sys

import torch
import torch.nn.functional as F

from headroom_validation import configs, hook as hooks, workloads


class LstmLanguageModel(torch.nn.Module):
    def __init__(self, vocab=8192, hidden=512, layers=4):
        super().__init__()
        self.embed = torch.nn.Embedding(vocab, hidden)
        self.lstm = torch.nn.LSTM(hidden, hidden, num_layers=layers, batch_first=True)
        self.head = torch.nn.Linear(hidden, vocab)

    def forward(self, ids):
        out, _ = self.lstm(self.embed(ids))
        return self.head(out)


def _lstm_steps(steps, step_done):
    torch.manual_seed(0)
    model = LstmLanguageModel()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    for _ in range(steps):
        ids = torch.randint(0, 8192, (16, 129))
        logits = model(ids[:, :-1])
        loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), ids[:, 1:].reshape(-1))
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        del logits, loss
        step_done()


def _config_steps(name, steps, step_done):
    w = workloads.build(configs.by_name(name), torch.device("cpu"))
    for _ in range(steps):
        w.step(lambda phase: None)
        step_done()


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("name", help="a configuration of configs.py, or lstm")
    parser.add_argument("out", help="the RMM CSV trace to write")
    parser.add_argument("--steps", type=int, default=3)
    args = parser.parse_args(argv)
    if args.name != "lstm":
        configs.by_name(args.name)  # an unknown name fails before anything runs
    hook = hooks.CpuHook()
    step_ends = []  # the event count when each step returned: the trace's step boundaries

    def step_done():
        step_ends.append(hook.lib.hr_events())

    with hook.log(args.out):
        if args.name == "lstm":
            _lstm_steps(args.steps, step_done)
        else:
            _config_steps(args.name, args.steps, step_done)
    steps_path = args.out.removesuffix(".rmm.csv") + ".steps.json"
    with open(steps_path, "w") as f:
        json.dump({"trace": os.path.basename(args.out), "step_end_events": step_ends}, f)
        f.write("\n")
    print(f"{args.out}: {hook.lib.hr_events()} events, peak {hook.peak() / 2**20:.1f} MiB live; steps end at {step_ends}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
