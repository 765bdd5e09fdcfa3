"""Records the allocation trace of a whole training run (CPU or CUDA), for the allocator's benchmarks.

    validation/record-trace gpt2-fp32-adamw ../bench/traces/gpt2-fp32-adamw.6steps.rmm.csv --steps 6
    validation/record-trace lstm ../bench/traces/lstm-fp32-adamw.6steps.rmm.csv --steps 6

Unlike a fixture's trace (one step, after a warm-up step), this one starts before the model is built and
covers --steps steps, so a replay sees every allocation from the first: the model, the first step that
creates optimizer state, and the steady steps after it. NAME is a configuration of configs.py or `lstm`, a
4-layer LSTM language model (hidden 512, vocabulary 8192, batch 16 x 128 tokens, AdamW) that no fixture
covers. Beside OUT.rmm.csv it writes OUT.steps.json, the event count at the end of each step (a line's time in the
trace is its event number), so that a replay can tell the warm-up from the steady steps. Runs under the allocation
hook (LD_PRELOAD, as validation/record-trace sets it); with --device cuda it records a PyTorch memory snapshot
(NAME.snapshot.json) instead, whose step ends are times (step_end_time_ns), and needs no hook.
"""
import argparse
import json
import os
import sys

import torch

from headroom_validation import hook as hooks, workloads


def _steps(name, steps, step_done, device):
    w = workloads.by_name(name, device)
    for _ in range(steps):
        w.step(lambda phase: None)
        step_done()


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("name", help="a configuration of configs.py, or lstm")
    parser.add_argument("out", help="the trace to write: NAME.rmm.csv on cpu, NAME.snapshot.json on cuda")
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    args = parser.parse_args(argv)
    try:
        workloads.check_name(args.name)  # an unknown name fails before anything runs
    except ValueError as e:
        parser.error(str(e))
    suffix = ".rmm.csv" if args.device == "cpu" else ".snapshot.json"
    if not args.out.endswith(suffix):
        parser.error(f"{args.out}: a {args.device} trace is written to a file named *{suffix}")
    device = torch.device(args.device)
    hook = hooks.CpuHook() if args.device == "cpu" else hooks.CudaCounters()
    step_ends = {}  # where each step ended, in the trace's own time

    def step_done():
        if args.device == "cpu":  # a CSV line's time is its event number
            step_ends.setdefault("step_end_events", []).append(hook.lib.hr_events())
        else:  # a snapshot's entries carry time_us: the last entry's when the step's work is done
            torch.cuda.synchronize()
            entries = torch.cuda.memory._snapshot()["device_traces"][device.index or 0]
            step_ends.setdefault("step_end_time_ns", []).append(entries[-1]["time_us"] * 1000 if entries else 0)

    with hook.log(args.out):
        _steps(args.name, args.steps, step_done, device)
    steps_path = args.out.removesuffix(suffix) + ".steps.json"
    with open(steps_path, "w") as f:
        json.dump({"trace": os.path.basename(args.out), "device": args.device, **step_ends}, f)
        f.write("\n")
    print(f"{args.out}: peak {hook.peak() / 2**20:.1f} MiB live; steps end at {step_ends}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
