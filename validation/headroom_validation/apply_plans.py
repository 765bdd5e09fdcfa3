"""Applies Headroom's plans to real models and measures what they do.

    python -m headroom_validation.apply_plans [--out validation/fixtures/plans] [--budgets 70% 45%] [NAME ...]
    python -m headroom_validation.apply_plans --emit [torch hf torch-budget] [--out ...] [NAME ...]

For each model (MODELS: small Hugging Face models with random weights, built from configs) it measures the
training step without a plan (forward, loss, backward; gradients set to None before), then for each budget and
each of `headroom plan`'s strategies asks headroom.plan for a plan, applies it op by op (plan.applied) and
measures the same step again from the same seed: the peak of tensor bytes above what was live before the step
(validation/alloc_hook.c on a CPU; torch.cuda.max_memory_allocated on CUDA), whether every parameter's gradient
is bitwise equal to the step's without a plan, and the step's wall time (reported beside the plan's predicted
overhead, which is a GPU roofline). Each plan also runs on smaller inputs within its shape envelope (three
shorter sequences and a smaller batch; ViT, whose images have one size, three smaller batches): each such step's
peak must be at or below the plan's printed one, with gradients bitwise equal to the same step's without a plan. A strategy with no plan for the budget is recorded with Headroom's reason.
On a CPU the plans may offload to host memory kept apart from PyTorch's allocator (headroom.plan's
emulate_host), so the hook counts what a GPU would hold, and the host bytes the offloads hold at most are
checked against the plan's too.

With --emit it does the same for what `headroom plan --emit FORMAT` prints for the model's config (eager
attention), run as printed on a fresh model: the settings' peak against the one Headroom gives for the
schedule they run (--out), and their gradients. torch-budget's peak is not modeled (torch.compile's partitioner
chooses) and compiled kernels round differently, so its row reports the peak and the largest relative
difference of the gradients without judging them.

Each model's outcome is checked (peak within --tolerance of the prediction, gradients equal) and printed as a
table; the process exits 1 if any plan misses. With --out each model's fixture is written (the traced step or
the config, the schedule of every plan, what was measured): `headroom validate` evaluates the same schedules
again without PyTorch and compares them with these measurements (report/validation_fixture.h, applied plans).
"""
import argparse
import ctypes
import gc
import json
import os
import pathlib
import platform
import subprocess
import sys
import tempfile
import time

import torch
import torch._functorch.config  # --emit torch-budget's setting, reset after each run

# store-all is the step without a plan, measured first; "auto" is headroom.plan's default.
STRATEGIES = ["auto", "sqrt-n", "sqrt-n-linear", "chen-greedy", "chain-dp", "optimal", "offload", "hybrid"]
FIXTURE_VERSION = 1
SEED = 1234
HOST_TOLERANCE = 0.03  # the offloads' host bytes against the plan's


def _lm_batch(vocab, batch, seq):
    g = torch.Generator().manual_seed(7)
    ids = torch.randint(0, vocab, (batch, seq), generator=g)
    return {"input_ids": ids, "labels": ids}


class Spec:
    """A model of the harness: its config and head class, a batch, what `headroom plan` needs to build the same
    step from the config (for --emit), and a description."""

    def __init__(self, config, cls, batch, shape_flags, description, sequences=True):
        config.architectures = [cls.__name__]
        self.config, self.cls, self.batch = config, cls, batch
        self.shape_flags, self.description = shape_flags, description
        self.sequences = sequences  # whether the batch's second dimension is a sequence that may be shorter

    def smaller_batches(self):
        """Batches within the plan's envelope: three shorter sequences and half the batch; without sequences
        three smaller batches. Each input its own storage (the harness counts inputs by storage), an input the
        batch passes twice (input_ids as labels) still passed twice."""
        def cut(batch_fraction, seq_fraction):
            memo = {}
            for k, v in self.batch.items():
                if id(v) not in memo:
                    index = [slice(0, max(1, v.shape[0] * batch_fraction // 4))]
                    if v.dim() > 1 and self.sequences:
                        index.append(slice(0, max(1, v.shape[1] * seq_fraction // 4)))
                    memo[id(v)] = v[tuple(index)].clone()
            return {k: memo[id(v)] for k, v in self.batch.items()}
        if self.sequences:
            return [cut(4, 3), cut(4, 2), cut(4, 1), cut(2, 4)]
        return [cut(3, 4), cut(2, 4), cut(1, 4)]

    def build(self, attention=None):
        """The model, with the same weights every time; `attention` an attn_implementation, or the default."""
        torch.manual_seed(0)
        if attention is None:
            return self.cls(self.config)
        return self.cls._from_config(self.config, attn_implementation=attention)


def _gpt2(t):
    c = t.GPT2Config(vocab_size=2048, n_embd=256, n_layer=4, n_head=8, n_positions=512, bos_token_id=0,
                     eos_token_id=0)
    return Spec(c, t.GPT2LMHeadModel, _lm_batch(2048, 4, 256), ["--micro-batch", "4", "--seq", "256"],
                "GPT-2 (4 layers, 256 wide, dropout 0.1)")


def _llama(t):
    c = t.LlamaConfig(vocab_size=2048, hidden_size=256, intermediate_size=688, num_hidden_layers=4,
                      num_attention_heads=8, num_key_value_heads=2, max_position_embeddings=512)
    return Spec(c, t.LlamaForCausalLM, _lm_batch(2048, 4, 256), ["--micro-batch", "4", "--seq", "256"],
                "Llama (4 layers, GQA 8/2 heads)")


def _qwen2(t):
    c = t.Qwen2Config(vocab_size=2048, hidden_size=256, intermediate_size=688, num_hidden_layers=4,
                      num_attention_heads=8, num_key_value_heads=2, max_position_embeddings=512,
                      tie_word_embeddings=True)
    return Spec(c, t.Qwen2ForCausalLM, _lm_batch(2048, 4, 256), ["--micro-batch", "4", "--seq", "256"],
                "Qwen2 (4 layers, GQA, tied embeddings)")


def _bert(t):
    c = t.BertConfig(vocab_size=2048, hidden_size=256, num_hidden_layers=4, num_attention_heads=4,
                     intermediate_size=1024, max_position_embeddings=512)
    return Spec(c, t.BertForMaskedLM, _lm_batch(2048, 4, 256),
                ["--micro-batch", "4", "--seq", "256", "--head", "mlm"], "BERT masked LM (4 layers, dropout 0.1)")


def _t5(t):
    c = t.T5Config(vocab_size=2048, d_model=256, d_kv=32, d_ff=1024, num_layers=4, num_decoder_layers=4,
                   num_heads=8, decoder_start_token_id=0, pad_token_id=0)
    g = torch.Generator().manual_seed(7)
    batch = {"input_ids": torch.randint(1, 2048, (4, 256), generator=g),
             "labels": torch.randint(1, 2048, (4, 64), generator=g)}
    return Spec(c, t.T5ForConditionalGeneration, batch,
                ["--micro-batch", "4", "--seq", "256", "--target-seq", "64"], "T5 (4 + 4 layers, dropout 0.1)")


def _vit(t):
    c = t.ViTConfig(image_size=64, patch_size=8, hidden_size=256, num_hidden_layers=4, num_attention_heads=8,
                    intermediate_size=1024, num_labels=10, hidden_dropout_prob=0.1)
    g = torch.Generator().manual_seed(7)
    batch = {"pixel_values": torch.randn(16, 3, 64, 64, generator=g),
             "labels": torch.randint(0, 10, (16,), generator=g)}
    return Spec(c, t.ViTForImageClassification, batch, ["--micro-batch", "16"],
                "ViT (4 layers, 64 px images in 8 px patches)", sequences=False)


MODELS = {"gpt2": _gpt2, "llama-gqa": _llama, "qwen2": _qwen2, "bert": _bert, "t5": _t5, "vit": _vit}


def spec_of(name):
    import transformers
    return MODELS[name](transformers)


class Meter:
    """Live tensor bytes and their peak: the allocation hook on a CPU, the CUDA allocator's counters on a GPU."""

    def __init__(self, device):
        self.device = device
        if device.type == "cpu":
            lib = ctypes.CDLL(None)
            if not hasattr(lib, "hr_start"):
                raise RuntimeError("the allocation hook is not loaded: run through validation/apply-plans")
            for name in ("hr_live", "hr_peak", "hr_dropped"):
                getattr(lib, name).restype = ctypes.c_ulonglong
            lib.hr_start()
            self.lib = lib

    def live(self):
        if self.device.type == "cuda":
            torch.cuda.synchronize()
            return torch.cuda.memory_allocated()
        return self.lib.hr_live()

    def reset_peak(self):
        if self.device.type == "cuda":
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
        else:
            self.lib.hr_reset_peak()

    def peak(self):
        if self.device.type == "cuda":
            torch.cuda.synchronize()
            return torch.cuda.max_memory_allocated()
        if self.lib.hr_dropped():
            raise RuntimeError("the allocation hook's table overflowed; the peak is not exact")
        return self.lib.hr_peak()


def measure_step(model, batch, meter):
    """One step from the harness's seed: the bytes live before it, its peak above them plus the batch's (Headroom
    counts the step's inputs among the planned tensors; the batch was made before it), the gradients, seconds."""
    model.zero_grad(set_to_none=True)
    gc.collect()
    torch.manual_seed(SEED)
    baseline = meter.live()
    inputs = sum(t.untyped_storage().nbytes() for t in batch.values())
    meter.reset_peak()
    start = time.perf_counter()
    out = model(**batch)
    out.loss.backward()
    del out
    if meter.device.type == "cuda":
        torch.cuda.synchronize()
    seconds = time.perf_counter() - start
    peak = meter.peak() - baseline + inputs
    # torch.compile wraps the model: its parameters are the same, under "_orig_mod."
    grads = {n.removeprefix("_orig_mod."): p.grad.detach().clone() for n, p in model.named_parameters()
             if p.grad is not None}
    return baseline, peak, grads, seconds


def same_gradients(grads, reference):
    return grads.keys() == reference.keys() and all(torch.equal(grads[k], reference[k]) for k in grads)


def gradient_difference(grads, reference):
    """The largest |difference| of any parameter's gradient, relative to that gradient's largest |value|."""
    worst = 0.0
    for k, r in reference.items():
        g = grads.get(k)
        if g is None:
            return float("inf")
        scale = r.abs().max().item() or 1.0
        worst = max(worst, (g - r).abs().max().item() / scale)
    return worst


def timed(model, batch, meter, repeats):
    """A warm-up step, then `repeats` measured ones; the figures of the first, the least time of all."""
    measure_step(model, batch, meter)
    runs = [measure_step(model, batch, meter) for _ in range(repeats)]
    baseline, peak, grads, _ = runs[0]
    return baseline, peak, grads, min(r[3] for r in runs)


def run_model(name, device, budgets, repeats):
    import headroom
    from headroom.applying import kv_cache_off
    spec = spec_of(name)
    model, description = spec.build().to(device).train(), spec.description
    batch = {k: v.to(device) for k, v in spec.batch.items()}
    kv_cache_off(model)  # as applied plans run, so both run the same ops
    meter = Meter(device)
    baseline, store_all_peak, reference, store_all_seconds = timed(model, batch, meter, repeats)
    smaller = [(b, timed(model, b, meter, 1)[2]) for b in spec.smaller_batches()]  # with their gradients
    rows, plans, graph, job_flags = [], [], None, None
    for budget in budgets:
        for strategy in STRATEGIES:
            entry = {"budget": budget, "strategy": strategy}
            try:
                plan = headroom.plan(model, batch, budget=budget, strategy=None if strategy == "auto" else strategy,
                                     optimizer="sgd", emulate_host=device.type == "cpu")
            except headroom.PlanError as error:
                entry["error"] = str(error)
                plans.append(entry)
                rows.append((budget, strategy, None, None, None, None, str(error)[:70]))
                continue
            graph, job_flags = plan.graph, _job_flags(plan.flags)
            _, peak, grads, seconds = timed_applied(plan, model, batch, meter, repeats)
            equal = same_gradients(grads, reference)
            host = plan.host_peak_measured_bytes
            within = []
            for inputs, inputs_reference in smaller:
                _, inputs_peak, inputs_grads, _ = timed_applied(plan, model, inputs, meter, 1)
                within.append({"inputs": _shapes(inputs), "peak_allocated_bytes": inputs_peak,
                               "gradients_bitwise_equal": same_gradients(inputs_grads, inputs_reference)})
            entry.update({
                "chosen_strategy": plan.strategy,
                "fits": plan.fits,
                "plan": plan.plan_file,
                "predicted": {"peak_bytes": plan.peak_bytes, "overhead": plan.overhead,
                              "host_bytes": plan.host_bytes, "budget_bytes": plan.budget_bytes,
                              "blocks": [r.module for r in plan.regions]},
                "measured": {"peak_allocated_bytes": peak, "gradients_bitwise_equal": equal,
                             "host_peak_bytes": host, "seconds": seconds, "smaller_inputs": within},
            })
            plans.append(entry)
            error = plan.peak_bytes / peak - 1
            note = "" if equal else "GRADIENTS DIFFER"
            largest = max(w["peak_allocated_bytes"] for w in within)
            if largest > plan.peak_bytes or not all(w["gradients_bitwise_equal"] for w in within):
                note += f"{'; ' if note else ''}SMALLER INPUTS: {_smaller_text(within, plan.peak_bytes)}"
            if plan.host_bytes or host:
                host_error = plan.host_bytes / host - 1 if host else float("inf")
                note = f"host {plan.host_bytes / 2**20:.2f}/{host / 2**20:.2f} MiB {100 * host_error:+.2f}%"
                if abs(host_error) > HOST_TOLERANCE:
                    note += " HOST MISS"
                if not equal:
                    note += "; GRADIENTS DIFFER"
            rows.append((budget, plan.strategy if strategy == "auto" else strategy, plan.peak_bytes, peak, error,
                         seconds / store_all_seconds - 1, note))
    fixture = _fixture(name, f"{description}; fp32 on {device.type}, {_shapes(batch)}", device, graph, job_flags,
                       (baseline, store_all_peak, store_all_seconds), plans)
    return fixture, rows, store_all_peak


def _fixture(name, description, device, model, job_args, store_all, plans):
    """An applied_plans fixture; store_all is (baseline bytes, peak allocated bytes, seconds) of the step without a
    plan."""
    baseline, peak, seconds = store_all
    return {
        "headroom_fixture_version": FIXTURE_VERSION,
        "kind": "applied_plans",
        "name": name,
        "description": description,
        "device": device.type if device.type == "cpu" else torch.cuda.get_device_name(),
        "versions": _versions(),
        "model": model,
        "job_args": job_args,
        "measured": {"baseline_bytes": baseline, "store_all_peak_allocated_bytes": peak, "store_all_seconds": seconds},
        "plans": plans,
    }


EMIT_FORMATS = ["torch", "hf", "torch-budget"]


def run_emitted(name, device, budgets, formats, repeats):
    """What `headroom plan --emit FORMAT` prints for the model's config (eager attention), run as printed on a
    fresh model: its peak against the one Headroom evaluates for the settings' schedule (--out), and gradients
    against the same model without settings. torch-budget's peak is not modeled (torch.compile chooses); its
    gradients are still compared."""
    from headroom.applying import kv_cache_off
    spec = spec_of(name)
    batch = {k: v.to(device) for k, v in spec.batch.items()}
    flags = ["--attention", "eager", "--precision", "fp32", "--optimizer", "sgd", "--loop", "hand", "--kernels",
             "cpu" if device.type == "cpu" else "cuda", "--torch", ".".join(torch.__version__.split(".")[:2])]
    import transformers
    flags += ["--transformers", ".".join(transformers.__version__.split(".")[:2])] + spec.shape_flags
    meter = Meter(device)

    def fresh(attention):
        model = spec.build(attention).to(device).train()
        kv_cache_off(model)
        return model

    baseline, store_all_peak, reference, store_all_seconds = timed(fresh("eager"), batch, meter, repeats)
    config = spec.config.to_dict()
    rows, runs = [], []
    with tempfile.TemporaryDirectory() as folder:
        config_path, plan_path = os.path.join(folder, "config.json"), os.path.join(folder, "plan.json")
        with open(config_path, "w") as f:
            json.dump(config, f)
        for budget in budgets:
            for fmt in formats:
                entry = {"budget": budget, "strategy": f"--emit {fmt}"}
                out = ["--out", plan_path] if fmt != "torch-budget" else []
                result = subprocess.run([os.environ["HEADROOM_BIN"], "plan", "--model", config_path, "--budget",
                                         budget, "--emit", fmt, *out, *flags], capture_output=True, text=True)
                if result.returncode != 0:
                    entry["error"] = result.stderr.strip().replace(config_path, name)
                    runs.append(entry)
                    rows.append((budget, entry["strategy"], None, None, None, None, entry["error"][:70]))
                    continue
                text = result.stdout
                try:
                    model = settings_applied(text, fmt, fresh)
                    _, peak, grads, seconds = timed(model, batch, meter, repeats)
                except Exception as error:  # the printed settings do not run: a finding, recorded as such
                    entry["error"] = f"the printed settings fail: {type(error).__name__}: {error}"
                    runs.append(entry)
                    rows.append((budget, entry["strategy"], None, None, None, None, "FAIL " + entry["error"][:64]))
                    continue
                finally:
                    torch._functorch.config.activation_memory_budget = 1.0  # torch-budget's setting is global
                equal = same_gradients(grads, reference)
                entry["measured"] = {"peak_allocated_bytes": peak, "gradients_bitwise_equal": equal,
                                     "gradients_largest_relative_difference": gradient_difference(grads, reference),
                                     "seconds": seconds}
                entry["settings"] = text
                predicted = None
                if out:
                    with open(plan_path) as f:
                        entry["plan"] = json.load(f)
                    entry["chosen_strategy"] = entry["plan"]["strategy"]
                    load = subprocess.run([os.environ["HEADROOM_BIN"], "plan", "--model", config_path, "--budget",
                                           budget, "--load", plan_path, "--json", *flags], capture_output=True,
                                          text=True)
                    predicted = json.loads(load.stdout)["plans"][0]["evaluation"]["peak_bytes"]
                    entry["predicted"] = {"peak_bytes": predicted}
                else:
                    entry["error"] = "not modeled: torch.compile's partitioner chooses what it saves"
                runs.append(entry)
                if fmt == "torch-budget":  # compiled kernels round differently: reported, not a miss
                    note = f"gradients differ by {entry['measured']['gradients_largest_relative_difference']:.1e}"
                else:
                    note = "" if equal else "GRADIENTS DIFFER"
                rows.append((budget, entry["strategy"], predicted, peak,
                             None if predicted is None else predicted / peak - 1, seconds / store_all_seconds - 1,
                             note))
    fixture = _fixture(f"{name}-emit", f"{spec.description}; eager attention, the --emit settings run as printed; "
                       f"fp32 on {device.type}, {_shapes(batch)}", device, config, flags,
                       (baseline, store_all_peak, store_all_seconds), runs)
    return fixture, rows, store_all_peak


def settings_applied(text, fmt, fresh):
    """A fresh model with the settings `headroom plan --emit` printed, run as printed: they name the model
    `model`, and the selective attention they register is loaded as they say (attn_implementation)."""
    model = fresh("eager")
    namespace = {"model": model}
    exec(compile(text, f"headroom plan --emit {fmt}", "exec"), namespace)  # noqa: S102
    if namespace.get("SELECTIVE"):
        model = fresh("headroom_selective")
    if "apply_plan" in namespace:
        namespace["apply_plan"](model)
    return namespace["model"] if fmt == "torch-budget" else model


def timed_applied(plan, model, batch, meter, repeats):
    with plan.applied(model):
        return timed(model, batch, meter, repeats)


def _job_flags(flags):
    """The plan's flags that describe the step (not the budget, strategy or output): what validate needs."""
    keep, out, i = {"--optimizer", "--loop", "--precision", "--kernels", "--torch"}, [], 0
    switches = {"--emulated-host"}  # flags without a value
    while i < len(flags):
        if flags[i] in keep:
            out += flags[i:i + 2]
            i += 2
        elif flags[i] in switches:
            out.append(flags[i])
            i += 1
        else:
            i += 1 if flags[i] == "--json" else 2
    return out


def _smaller_text(within, printed):
    return "; ".join(f"{w['inputs']} {w['peak_allocated_bytes'] / 2**20:.2f} MiB"
                     f"{' over the printed peak' if w['peak_allocated_bytes'] > printed else ''}"
                     f"{'' if w['gradients_bitwise_equal'] else ' gradients differ'}" for w in within)


def _shapes(batch):
    return ", ".join(f"{k} {'x'.join(map(str, v.shape))}" for k, v in batch.items())


def _versions():
    import transformers
    return {"torch": torch.__version__, "transformers": transformers.__version__,
            "python": platform.python_version()}


def print_rows(name, store_all_peak, rows, tolerance):
    print(f"\n{name}: without a plan {store_all_peak / 2**20:.2f} MiB")
    print(f"  {'budget':>6} {'strategy':<14} {'predicted':>12} {'measured':>12} {'error':>8} {'time':>8}  note")
    misses = 0
    for budget, strategy, predicted, measured, error, slower, note in rows:
        if measured is None:  # no plan for the budget, or (FAIL) settings that do not run as printed
            misses += note.startswith("FAIL")
            print(f"  {budget:>6} {strategy:<14} {'-':>12} {'-':>12} {'-':>8} {'-':>8}  {note}")
            continue
        if predicted is None:  # measured, not modeled (torch-budget): reported only
            print(f"  {budget:>6} {strategy:<14} {'-':>12} {measured / 2**20:>8.2f} MiB {'-':>8} "
                  f"{100 * slower:>+7.1f}%  not modeled; {note}")
            continue
        miss = (abs(error) > tolerance or (note and not note.startswith("host")) or "MISS" in note or "DIFFER" in note
                or "SMALLER" in note)
        misses += bool(miss)
        print(f"  {budget:>6} {strategy:<14} {predicted / 2**20:>8.2f} MiB {measured / 2**20:>8.2f} MiB "
              f"{100 * error:>+7.2f}% {100 * slower:>+7.1f}%  {note}{'  MISS' if miss else ''}")
    return misses


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("models", nargs="*", help=f"models to run (default all: {', '.join(MODELS)})")
    p.add_argument("--device", default="cpu")
    p.add_argument("--budgets", nargs="+", default=["70%", "45%"])
    p.add_argument("--tolerance", type=float, default=3.0, help="largest |error| of the peak, percent")
    p.add_argument("--repeats", type=int, default=2, help="measured steps after the warm-up (least time counts)")
    p.add_argument("--out", help="write each model's fixture into this folder")
    p.add_argument("--emit", nargs="*", metavar="FORMAT",
                   help=f"run what `headroom plan --emit FORMAT` prints instead (default: {' '.join(EMIT_FORMATS)})")
    args = p.parse_args(argv)
    unknown = [m for m in args.models if m not in MODELS]
    if unknown:
        p.error(f"unknown model(s) {', '.join(unknown)}; known: {', '.join(MODELS)}")
    device = torch.device(args.device)
    misses = 0
    for name in args.models or list(MODELS):
        if args.emit is None:
            fixture, rows, store_all_peak = run_model(name, device, args.budgets, args.repeats)
        else:
            fixture, rows, store_all_peak = run_emitted(name, device, args.budgets, args.emit or EMIT_FORMATS,
                                                        args.repeats)
        misses += print_rows(fixture["name"], store_all_peak, rows, args.tolerance / 100)
        if args.out:
            folder = pathlib.Path(args.out)
            folder.mkdir(parents=True, exist_ok=True)
            path = folder / f"{fixture['name']}.json"
            path.write_text(json.dumps(fixture, indent=1) + "\n")
    print(f"\n{misses} plan(s) outside {args.tolerance}% or with different gradients")
    return 1 if misses else 0


if __name__ == "__main__":
    sys.exit(main())
