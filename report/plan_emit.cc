#include "report/plan_emit.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_replace.h"
#include "common/name_table.h"
#include "common/status_macros.h"
#include "common/units.h"

namespace headroom {
namespace {

constexpr NameTable<EmitFormat, 5> kEmitFormatNames("emit format", {{
    {"torch", EmitFormat::kTorch},
    {"hf", EmitFormat::kHf},
    {"megatron", EmitFormat::kMegatron},
    {"deepspeed", EmitFormat::kDeepSpeed},
    {"torch-budget", EmitFormat::kTorchBudget},
}});

constexpr size_t kWidth = 100;  // emitted lines wrap here

// "# " + text, wrapped at kWidth on spaces.
std::string Comment(std::string_view text) {
  std::string out;
  std::string line = "#";
  size_t start = 0;
  while (start < text.size()) {
    size_t end = text.find(' ', start);
    if (end == std::string_view::npos) end = text.size();
    const std::string_view word = text.substr(start, end - start);
    if (line.size() > 1 && line.size() + 1 + word.size() > kWidth) {
      absl::StrAppend(&out, line, "\n");
      line = "#";
    }
    absl::StrAppend(&line, " ", std::string(word));
    start = end + 1;
  }
  absl::StrAppend(&out, line, "\n");
  return out;
}

// `one` after a single layer, `many` after several: "layer 3 keeps", "layers 3-5 keep".
std::string_view Agree(const std::vector<int>& layers, std::string_view one, std::string_view many) {
  return layers.size() == 1 ? one : many;
}

std::string LayersPhrase(const std::vector<int>& layers) {
  if (layers.empty()) return "none";
  return absl::StrCat(layers.size() == 1 ? "layer " : "layers ", LayerRanges(layers));
}

std::string RangesOrNone(const std::vector<int>& layers) { return layers.empty() ? "none" : LayerRanges(layers); }

// The first lines of every format: the plan, and what each layer does in it.
std::string Header(EmitFormat format, const StackPlan& plan, const EmitContext& context) {
  std::string out = Comment(absl::StrFormat("headroom plan --emit %s: %s", EmitFormatName(format), context.title));
  absl::StrAppend(&out, Comment(absl::StrFormat(
                            "%d layers. Full checkpoint: %s. Selective (attention core): %s. Offload: %s. Keep: %s.",
                            plan.layers.size(), RangesOrNone(plan.LayersWith(LayerTreatment::kFull)),
                            RangesOrNone(plan.LayersWith(LayerTreatment::kSelective)),
                            RangesOrNone(plan.LayersWith(LayerTreatment::kOffload)),
                            RangesOrNone(plan.LayersWith(LayerTreatment::kKeep)))));
  return out;
}

// Where per-layer settings depart from the plan: layers the treatment
// describes only approximately (layers with the same numbers share one
// note), and what the plan does outside the layers.
std::vector<std::string> Departures(const StackPlan& plan) {
  std::vector<std::string> texts;          // a note without its layers, in first-seen order
  std::vector<std::vector<int>> layers_of;  // the layers each note is about
  for (const LayerPlan& l : plan.layers) {
    if (l.exact || l.treatment == LayerTreatment::kKeep) continue;
    const SavedBytes& o = l.own;
    const std::string split =
        absl::StrFormat("of the %s of saved activations {each makes}, the plan recomputes %s, offloads %s and "
                        "keeps %s", FormatBytes(o.total()), FormatBytes(o.recomputed), FormatBytes(o.offloaded),
                        FormatBytes(o.kept));
    std::string text;
    if (l.treatment == LayerTreatment::kFull) {
      text = absl::StrCat(split, "; checkpointing the whole layer recomputes all of them (less memory than the "
                                 "plan, more time).");
    } else if (l.treatment == LayerTreatment::kSelective) {
      text = absl::StrFormat("the plan recomputes %s of the %s inside {each one's} attention core; selective "
                             "recomputation replays all of the core.",
                             FormatBytes(l.core.recomputed), FormatBytes(l.core.total()));
    } else {
      text = absl::StrCat(split, "; offloading the layer sends all of them to host memory (less device memory "
                                 "than the plan, more copies).");
    }
    const auto it = std::find(texts.begin(), texts.end(), text);
    if (it == texts.end()) {
      texts.push_back(text);
      layers_of.push_back({l.layer});
    } else {
      layers_of[static_cast<size_t>(it - texts.begin())].push_back(l.layer);
    }
  }
  std::vector<std::string> notes;
  for (size_t i = 0; i < texts.size(); ++i) {
    std::string who = LayersPhrase(layers_of[i]);
    who[0] = 'L';
    const bool one = layers_of[i].size() == 1;
    const std::string text = absl::StrReplaceAll(
        texts[i], {{"{each makes}", one ? "it makes" : "each makes"}, {"{each one's}", one ? "its" : "each one's"}});
    notes.push_back(absl::StrCat(who, ": ", text));
  }
  const SavedBytes& out = plan.outside;
  if (out.recomputed > 0 || out.offloaded > 0 || plan.outside_replayed_ops > 0) {
    notes.push_back(absl::StrFormat(
        "Outside the layers (embeddings, final norm, head, loss) the plan replays %d ops, recomputing %s and "
        "offloading %s of saved activations; no per-layer setting expresses that: with these settings those "
        "bytes stay on the device.",
        plan.outside_replayed_ops, FormatBytes(out.recomputed), FormatBytes(out.offloaded)));
  }
  return notes;
}

std::string DepartureComments(const StackPlan& plan) {
  std::string out;
  for (const std::string& note : Departures(plan)) absl::StrAppend(&out, Comment(note));
  return out;
}

// Bytes a one-checkpoint-per-layer setting keeps beyond the plan's
// segments: the inputs of the layers that continue a segment.
uint64_t ExtraInputsOfPerLayerCheckpoints(const StackPlan& plan) {
  uint64_t extra = 0;
  for (const CheckpointSegment& s : plan.segments) {
    for (const LayerPlan& l : plan.layers) {
      if (l.layer > s.first_layer && l.layer < s.first_layer + s.num_layers) extra += l.input_bytes;
    }
  }
  return extra;
}

std::vector<std::string> MultiLayerSegments(const StackPlan& plan) {
  std::vector<std::string> out;
  for (const CheckpointSegment& s : plan.segments) {
    if (s.num_layers > 1) out.push_back(absl::StrFormat("%d-%d", s.first_layer, s.first_layer + s.num_layers - 1));
  }
  return out;
}

uint64_t OffloadedSegmentInputs(const StackPlan& plan, std::vector<int>* layers) {
  uint64_t bytes = 0;
  for (const CheckpointSegment& s : plan.segments) {
    if (!s.input_offloaded) continue;
    layers->push_back(s.first_layer);
    for (const LayerPlan& l : plan.layers) {
      if (l.layer == s.first_layer) bytes += l.input_bytes;
    }
  }
  return bytes;
}

// Python list of quoted module names, wrapped.
std::string PythonList(std::string_view name, const std::vector<std::string>& items) {
  std::string out = absl::StrCat(std::string(name), " = [");
  if (items.empty()) return out + "]\n";
  std::string line = "    ";
  absl::StrAppend(&out, "\n");
  for (const std::string& item : items) {
    const std::string quoted = absl::StrCat("\"", item, "\",");
    if (line.size() > 4 && line.size() + 1 + quoted.size() > kWidth) {
      absl::StrAppend(&out, line, "\n");
      line = "    ";
    }
    absl::StrAppend(&line, line.size() > 4 ? " " : "", quoted);
  }
  absl::StrAppend(&out, line, "\n]\n");
  return out;
}

std::vector<std::string> ModulesOf(const StackPlan& plan, LayerTreatment treatment, bool* unknown) {
  std::vector<std::string> out;
  for (const LayerPlan& l : plan.layers) {
    if (l.treatment != treatment) continue;
    if (l.module.empty()) {
      *unknown = true;
      out.push_back(absl::StrCat("layers.", l.layer));
    } else {
      out.push_back(l.module);
    }
  }
  return out;
}

std::string EmitTorch(const StackPlan& plan, const EmitContext& context) {
  std::string out = Header(EmitFormat::kTorch, plan, context);
  absl::StrAppend(&out, DepartureComments(plan));
  bool unknown = false;
  const std::vector<std::string> full = ModulesOf(plan, LayerTreatment::kFull, &unknown);
  const std::vector<std::string> offload = ModulesOf(plan, LayerTreatment::kOffload, &unknown);
  const std::vector<int> selective = plan.LayersWith(LayerTreatment::kSelective);
  if (full.empty() && offload.empty() && selective.empty()) {
    absl::StrAppend(&out, Comment("The plan keeps every layer's activations: nothing to checkpoint or offload."));
    return out;
  }
  if (unknown) {
    absl::StrAppend(&out, Comment("This graph's op names do not give module paths: 'layers.N' stands for the "
                                  "N-th transformer block; replace it with the block's path in your model."));
  }
  const std::vector<std::string> segments = MultiLayerSegments(plan);
  if (!segments.empty()) {
    absl::StrAppend(&out, Comment(absl::StrFormat(
                              "The plan replays layers %s as one segment each, keeping only the segment's first "
                              "input; checkpointing each layer on its own keeps the other layers' inputs too: "
                              "%s more than the plan.",
                              absl::StrJoin(segments, ", "), FormatBytes(ExtraInputsOfPerLayerCheckpoints(plan)))));
  }
  std::vector<int> offloaded_inputs;
  const uint64_t offloaded_input_bytes = OffloadedSegmentInputs(plan, &offloaded_inputs);
  if (offloaded_input_bytes > 0) {
    absl::StrAppend(&out, Comment(absl::StrFormat(
                              "The plan keeps the inputs of checkpointed %s in host memory; here they stay on the "
                              "device: %s more than the plan.",
                              LayersPhrase(offloaded_inputs), FormatBytes(offloaded_input_bytes))));
  }
  const std::vector<std::string> selective_modules = ModulesOf(plan, LayerTreatment::kSelective, &unknown);
  absl::StrAppend(&out, "import functools\n\nimport torch\nfrom torch.utils.checkpoint import checkpoint\n\n",
                  "# Replayed whole in backward: torch.utils.checkpoint around each layer.\n",
                  PythonList("CHECKPOINT", full),
                  "# Saved activations kept in pinned host memory during forward and backward.\n",
                  PythonList("OFFLOAD", offload),
                  "# Only the attention core replayed (selective_attention below).\n",
                  PythonList("SELECTIVE", selective_modules));
  absl::StrAppend(&out,
                  "\n\ndef _saved_on_cpu(forward):\n"
                  "    def run(*args, **kwargs):\n"
                  "        with torch.autograd.graph.save_on_cpu(pin_memory=True):\n"
                  "            return forward(*args, **kwargs)\n"
                  "    return run\n\n\n"
                  "def apply_plan(model):\n"
                  "    if OFFLOAD and next(model.parameters()).device.type == \"cpu\":\n"
                  "        raise RuntimeError(\"offloading to host memory needs a GPU: on a CPU the copies \"\n"
                  "                           \"would stay in the same memory, beside the tensors they copy\")\n"
                  "    for name in CHECKPOINT:\n"
                  "        layer = model.get_submodule(name)\n"
                  "        layer.forward = functools.partial(checkpoint, layer.forward, use_reentrant=False)\n"
                  "    for name in OFFLOAD:\n"
                  "        layer = model.get_submodule(name)\n"
                  "        layer.forward = _saved_on_cpu(layer.forward)\n"
                  "    for name in SELECTIVE:  # its attention modules, however the model numbers them\n"
                  "        for module in model.get_submodule(name).modules():\n"
                  "            module.headroom_selective = True\n");
  if (!selective.empty()) {
    absl::StrAppend(&out, "\n\n",
                    Comment(absl::StrFormat(
                        "Selective recomputation (Korthikanti et al. 2022) in %s: only the attention core is "
                        "replayed (QK^T, scale and mask, softmax, dropout on the probabilities, probs @ V); the "
                        "q/k/v and output projections, norms and MLP keep their activations. Checkpointing the "
                        "layer's attention module would replay its projections too, so the core is checkpointed "
                        "through the attention function. The plan assumes eager attention: fused kernels (SDPA, "
                        "flash) save no probabilities to recompute.",
                        LayersPhrase(selective))));
    if (context.model_type.empty()) {
      absl::StrAppend(&out, Comment("The model's Hugging Face type is unknown here: import "
                                    "eager_attention_forward from its transformers modeling module."));
    }
    std::string type = context.model_type.empty() ? "llama" : context.model_type;
    if (type == "gemma3_text") type = "gemma3";  // Gemma3ForCausalLM lives in transformers.models.gemma3
    absl::StrAppend(&out, "from transformers import AttentionInterface\n",
                    absl::StrFormat("from transformers.models.%s.modeling_%s import eager_attention_forward\n",
                                    type, type));
    absl::StrAppend(&out,
                    "\n\ndef selective_attention(module, *args, **kwargs):\n"
                    "    if module.training and getattr(module, \"headroom_selective\", False):\n"
                    "        return checkpoint(eager_attention_forward, module, *args, use_reentrant=False, **kwargs)\n"
                    "    return eager_attention_forward(module, *args, **kwargs)\n\n\n"
                    "AttentionInterface.register(\"headroom_selective\", selective_attention)\n"
                    "try:  # transformers 4.53 and later build a causal mask only for attention they know\n"
                    "    from transformers import AttentionMaskInterface\n"
                    "    from transformers.masking_utils import eager_mask\n"
                    "    AttentionMaskInterface.register(\"headroom_selective\", eager_mask)\n"
                    "except ImportError:  # earlier versions build the eager mask for any registered attention\n"
                    "    pass\n"
                    "# Load the model with from_pretrained(..., attn_implementation=\"headroom_selective\").\n");
  }
  absl::StrAppend(&out,
                  "\n# After loading the model, before training (and without gradient_checkpointing_enable()):\n"
                  "# apply_plan(model)\n");
  return out;
}

// Every layer fully checkpointed: what Hugging Face's switch runs, whatever
// else the plan does (the departures say what).
bool EveryLayerFull(const StackPlan& plan) {
  return !plan.layers.empty() && plan.LayersWith(LayerTreatment::kFull).size() == plan.layers.size();
}

std::string EmitHf(const StackPlan& plan, const EmitContext& context) {
  std::string out = Header(EmitFormat::kHf, plan, context);
  if (EveryLayerFull(plan)) {
    absl::StrAppend(&out,
                    Comment(plan.UniformFull()
                                ? "Every layer is checkpointed on its own and nothing else is replayed or offloaded: "
                                  "Hugging Face's switch does exactly that."
                                : "Every layer is checkpointed, which is what Hugging Face's switch does, each layer "
                                  "on its own; where the plan does more or less (below), the switch's peak is the "
                                  "one above."),
                    "model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={\"use_reentrant\": False})\n",
                    Comment("With the Trainer: TrainingArguments(..., gradient_checkpointing=True, "
                            "gradient_checkpointing_kwargs={\"use_reentrant\": False})."));
    if (!plan.UniformFull()) absl::StrAppend(&out, DepartureComments(plan));
    return out;
  }
  const std::vector<std::string> departures = Departures(plan);
  const bool keeps_all = plan.LayersWith(LayerTreatment::kKeep).size() == plan.layers.size();
  if (keeps_all && departures.empty()) {
    absl::StrAppend(&out, Comment("The plan keeps every layer's activations: leave gradient checkpointing off "
                                  "(the default); there is nothing to enable."));
    return out;
  }
  std::vector<std::string> why;
  const std::vector<int> keep = plan.LayersWith(LayerTreatment::kKeep);
  const std::vector<int> selective = plan.LayersWith(LayerTreatment::kSelective);
  const std::vector<int> offload = plan.LayersWith(LayerTreatment::kOffload);
  if (!keep.empty()) {
    why.push_back(absl::StrCat(LayersPhrase(keep), std::string(Agree(keep, " keeps its", " keep their")),
                               " activations"));
  }
  if (!selective.empty()) {
    why.push_back(absl::StrCat(LayersPhrase(selective), std::string(Agree(selective, " replays", " replay")),
                               " only the attention core"));
  }
  if (!offload.empty()) {
    why.push_back(absl::StrCat(LayersPhrase(offload), std::string(Agree(offload, " offloads", " offload")),
                               " to host memory"));
  }
  const std::vector<std::string> segments = MultiLayerSegments(plan);
  if (!segments.empty()) why.push_back(absl::StrCat("layers ", absl::StrJoin(segments, ", "), " are replayed as one "
                                                    "segment each"));
  std::vector<int> offloaded_inputs;
  if (OffloadedSegmentInputs(plan, &offloaded_inputs) > 0) {
    why.push_back(absl::StrCat("the inputs of checkpointed ", LayersPhrase(offloaded_inputs),
                               " are kept in host memory"));
  }
  std::vector<int> partial;
  for (const LayerPlan& l : plan.layers) {
    if (!l.exact) partial.push_back(l.layer);
  }
  if (!partial.empty()) {
    why.push_back(absl::StrCat(LayersPhrase(partial), std::string(Agree(partial, " is", " are")),
                               " replayed or offloaded only in part"));
  }
  if (plan.outside_replayed_ops > 0 || plan.outside.offloaded > 0) {
    why.push_back("the plan also replays or offloads activations outside the layers");
  }
  absl::StrAppend(&out,
                  Comment(absl::StrCat("Hugging Face's gradient_checkpointing_enable() checkpoints every layer, each "
                                       "on its own, and nothing else; it cannot express this plan: ",
                                       absl::StrJoin(why, "; "), ".")),
                  DepartureComments(plan),
                  Comment("Use --emit torch for settings per layer."));
  return out;
}

// Megatron-LM's uniform method: every layer, chunks of N from the first
// layer, the last chunk possibly shorter. 0 when the segments are not that.
int UniformChunk(const StackPlan& plan) {
  if (plan.segments.empty() || plan.LayersWith(LayerTreatment::kFull).size() != plan.layers.size()) return 0;
  const int chunk = plan.segments.front().num_layers;
  const int first = plan.layers.front().layer;
  for (size_t i = 0; i < plan.segments.size(); ++i) {
    const CheckpointSegment& s = plan.segments[i];
    if (s.first_layer != first + static_cast<int>(i) * chunk) return 0;
    if (s.num_layers != chunk && !(i + 1 == plan.segments.size() && s.num_layers < chunk)) return 0;
  }
  return chunk;
}

// Megatron-LM's block method: the first N layers, each its own segment. 0 when not that.
int BlockLayers(const StackPlan& plan) {
  const std::vector<int> full = plan.LayersWith(LayerTreatment::kFull);
  if (full.empty() || plan.segments.size() != full.size()) return 0;
  for (size_t i = 0; i < full.size(); ++i) {
    if (full[i] != plan.layers[i].layer) return 0;
  }
  return static_cast<int>(full.size());
}

std::string EmitMegatron(const StackPlan& plan, const EmitContext& context) {
  std::string out = Header(EmitFormat::kMegatron, plan, context);
  const std::vector<int> full = plan.LayersWith(LayerTreatment::kFull);
  const std::vector<int> selective = plan.LayersWith(LayerTreatment::kSelective);
  const std::vector<int> offload = plan.LayersWith(LayerTreatment::kOffload);
  const size_t layers = plan.layers.size();
  std::vector<std::string> cannot;
  if (!full.empty() && !selective.empty()) {
    cannot.push_back(absl::StrFormat(
        "the plan checkpoints %s whole and recomputes the attention core of %s; Megatron-LM takes one "
        "--recompute-granularity for every layer", LayersPhrase(full), LayersPhrase(selective)));
  } else if (!selective.empty()) {
    if (selective.size() == layers) {
      absl::StrAppend(&out, "--recompute-granularity selective\n",
                      Comment("selective: the attention core of every layer is recomputed (Megatron-Core's "
                              "default --recompute-modules core_attn); the rest of each layer keeps its "
                              "activations."));
    } else {
      cannot.push_back(absl::StrFormat(
          "the plan recomputes the attention core of %s only; --recompute-granularity selective covers every "
          "layer (recomputing more than the plan)", LayersPhrase(selective)));
    }
  } else if (!full.empty()) {
    const int chunk = UniformChunk(plan);
    const int block = BlockLayers(plan);
    if (chunk > 0) {
      absl::StrAppend(&out, absl::StrFormat("--recompute-granularity full --recompute-method uniform "
                                            "--recompute-num-layers %d\n", chunk),
                      Comment(absl::StrFormat("uniform: all %d layers are recomputed, in chunks of %d %s that "
                                              "keep only the chunk's input.", layers, chunk,
                                              chunk == 1 ? "layer" : "layers")));
    } else if (block > 0) {
      const std::vector<int> keep = plan.LayersWith(LayerTreatment::kKeep);
      absl::StrAppend(&out, absl::StrFormat("--recompute-granularity full --recompute-method block "
                                            "--recompute-num-layers %d\n", block),
                      Comment(absl::StrFormat(
                          "block: the first %d %s of the stage %s recomputed, each from its own input%s.", block,
                          block == 1 ? "layer" : "layers", block == 1 ? "is" : "are",
                          keep.empty() ? ""
                                       : absl::StrCat("; ", LayersPhrase(keep),
                                                      std::string(Agree(keep, " keeps its", " keep their")),
                                                      " activations"))));
    } else {
      std::string shape = absl::StrFormat("the plan checkpoints %s", LayersPhrase(full));
      const std::vector<std::string> segments = MultiLayerSegments(plan);
      if (!segments.empty()) {
        absl::StrAppend(&shape, " (layers ", absl::StrJoin(segments, ", "), " as one segment each)");
      }
      cannot.push_back(absl::StrCat(
          shape, "; --recompute-method block takes the first N layers one by one and uniform takes every layer "
                 "in equal chunks, and neither is this"));
    }
  } else if (offload.empty()) {
    absl::StrAppend(&out, Comment("The plan recomputes no layer: leave --recompute-granularity unset."));
  }
  if (!offload.empty()) {
    cannot.push_back(absl::StrFormat("the activations of %s go to host memory; the recompute flags do not offload",
                                     LayersPhrase(offload)));
  }
  std::vector<int> offloaded_inputs;
  if (OffloadedSegmentInputs(plan, &offloaded_inputs) > 0) {
    cannot.push_back(absl::StrFormat("the plan keeps the inputs of checkpointed %s in host memory",
                                     LayersPhrase(offloaded_inputs)));
  }
  for (const std::string& c : cannot) absl::StrAppend(&out, Comment(absl::StrCat("Cannot be expressed: ", c, ".")));
  absl::StrAppend(&out, DepartureComments(plan));
  if (!cannot.empty()) absl::StrAppend(&out, Comment("Use --emit torch for settings per layer."));
  return out;
}

std::string EmitDeepSpeed(const StackPlan& plan, const EmitContext& context) {
  std::string out = DeepSpeedActivationCheckpointing(plan).dump(2) + "\n";
  absl::StrAppend(&out, Header(EmitFormat::kDeepSpeed, plan, context));
  if (plan.segments.empty()) {
    absl::StrAppend(&out, Comment("The plan checkpoints no layer: the block above changes nothing; leave "
                                  "activation checkpointing off."));
  } else {
    std::vector<std::string> segments;
    bool one_layer_each = true;
    for (const CheckpointSegment& s : plan.segments) {
      segments.push_back(s.num_layers == 1 ? absl::StrCat(s.first_layer)
                                           : absl::StrCat(s.first_layer, "-", s.first_layer + s.num_layers - 1));
      one_layer_each = one_layer_each && s.num_layers == 1;
    }
    const std::string which =
        one_layer_each && plan.segments.size() > 1
            ? absl::StrCat("one per layer, ", LayersPhrase(plan.LayersWith(LayerTreatment::kFull)))
            : absl::StrCat(plan.segments.size() == 1 && one_layer_each ? "layer " : "layers ",
                           absl::StrJoin(segments, ", "));
    absl::StrAppend(
        &out, Comment(absl::StrFormat(
                  "It configures deepspeed.checkpointing.checkpoint(function, *args), which the model code calls "
                  "(Megatron-DeepSpeed does; elsewhere call deepspeed.checkpointing.configure(None, "
                  "deepspeed_config=...) and wrap the forward yourself). Call it once per segment of the plan, "
                  "%d in all: %s.",
                  plan.segments.size(), which)));
    std::vector<int> offloaded_inputs;
    if (OffloadedSegmentInputs(plan, &offloaded_inputs) > 0) {
      absl::StrAppend(&out, Comment(absl::StrFormat("cpu_checkpointing: the plan keeps the inputs of %s in host "
                                                    "memory; DeepSpeed then keeps every checkpoint input there.",
                                                    LayersPhrase(offloaded_inputs))));
    }
  }
  const std::vector<int> selective = plan.LayersWith(LayerTreatment::kSelective);
  const std::vector<int> offload = plan.LayersWith(LayerTreatment::kOffload);
  if (!selective.empty()) {
    absl::StrAppend(&out, Comment(absl::StrFormat(
                              "Cannot be expressed: selective recomputation of the attention core in %s; "
                              "DeepSpeed checkpoints whole functions (see --emit torch or megatron).",
                              LayersPhrase(selective))));
  }
  if (!offload.empty()) {
    absl::StrAppend(&out, Comment(absl::StrFormat(
                              "Cannot be expressed: offloading the activations of %s; cpu_checkpointing moves only "
                              "checkpoint inputs (see --emit torch).",
                              LayersPhrase(offload))));
  }
  absl::StrAppend(&out, DepartureComments(plan));
  return out;
}

std::string EmitTorchBudget(const StackPlan& plan, const EmitContext& context) {
  std::string out = Header(EmitFormat::kTorchBudget, plan, context);
  const double budget = ActivationMemoryBudget(plan);
  absl::StrAppend(&out, "import torch._functorch.config\n\n",
                  absl::StrFormat("torch._functorch.config.activation_memory_budget = %.2f\n", budget),
                  "model = torch.compile(model)\n");
  absl::StrAppend(&out, Comment(absl::StrFormat(
                            "The plan keeps %s of the %s of activations that store-all saves for backward on the "
                            "device (%.1f%%, rounded down). PyTorch reads the budget as a fraction of what its "
                            "runtime-optimized partitioner saves (1.0, at most store-all's bytes) above the compiled "
                            "region's inputs (0.0), and chooses what to recompute itself: this matches the plan's "
                            "kept bytes, not its choice of tensors. It applies to torch.compile'd regions only.",
                            FormatBytes(plan.all.kept), FormatBytes(plan.all.total()),
                            plan.all.total() == 0 ? 100.0
                                                  : 100.0 * static_cast<double>(plan.all.kept) /
                                                        static_cast<double>(plan.all.total()))));
  if (plan.all.offloaded > 0) {
    absl::StrAppend(&out, Comment(absl::StrFormat(
                              "The plan offloads %s to host memory; activation_memory_budget only recomputes, so "
                              "those bytes count as not kept and PyTorch will recompute instead.",
                              FormatBytes(plan.all.offloaded))));
  }
  if (context.has_random_ops && budget < 1.0) {
    absl::StrAppend(&out, Comment("WARNING: this step draws random numbers (dropout). Below a budget of 1.0 "
                                  "PyTorch's partitioner may recompute them in backward with fresh ones, so the "
                                  "gradients differ from the step's, silently (pytorch/pytorch#190758, open). Set "
                                  "dropout to 0, or use --emit torch, whose checkpoints restore the random state."));
  }
  if (budget >= 1.0) absl::StrAppend(&out, Comment("1.00 is PyTorch's default: nothing to set."));
  return out;
}

}  // namespace

std::string_view EmitFormatName(EmitFormat format) { return kEmitFormatNames.Name(format); }

absl::StatusOr<EmitFormat> ParseEmitFormat(std::string_view name) { return kEmitFormatNames.Parse(name); }

nlohmann::json DeepSpeedActivationCheckpointing(const StackPlan& plan) {
  bool cpu_checkpointing = false;
  for (const CheckpointSegment& s : plan.segments) cpu_checkpointing = cpu_checkpointing || s.input_offloaded;
  nlohmann::json block = {
      {"partition_activations", false},
      {"cpu_checkpointing", cpu_checkpointing},
      {"contiguous_memory_optimization", false},
      {"number_checkpoints", plan.segments.empty() ? nlohmann::json(nullptr) : nlohmann::json(plan.segments.size())},
      {"synchronize_checkpoint_boundary", false},
      {"profile", false},
  };
  return {{"activation_checkpointing", block}};
}

double ActivationMemoryBudget(const StackPlan& plan) {
  if (plan.all.total() == 0) return 1.0;
  const double fraction = static_cast<double>(plan.all.kept) / static_cast<double>(plan.all.total());
  return std::floor(fraction * 100 + 1e-9) / 100;
}

namespace {

// The forward ops of `layer`, from the step's layer regions (LayerRegions).
absl::StatusOr<CheckpointRegion> LayerRegion(const std::vector<CheckpointRegion>& layers, int layer) {
  for (const CheckpointRegion& r : layers) {
    if (r.layer == layer) return CheckpointRegion{.layer = layer, .first = r.first, .last = r.last};
  }
  return absl::UnimplementedError(absl::StrFormat("layer %d's ops are not one run of the step (a block called "
                                                  "more than once)", layer));
}

// The ops of `layer`'s attention core: from its first core op to its last (the attention function's call).
absl::StatusOr<CheckpointRegion> CoreRegion(const Graph& step, const std::vector<CheckpointRegion>& ops,
                                            int layer) {
  HEADROOM_ASSIGN_OR_RETURN(CheckpointRegion whole, LayerRegion(ops, layer));
  CheckpointRegion core{.layer = layer};
  for (OpId o = whole.first; o <= whole.last; ++o) {
    if (!step.op(o).attention_core) continue;
    if (core.first == kNone) core.first = o;
    core.last = o;
  }
  if (core.first == kNone) {
    return absl::UnimplementedError(absl::StrFormat("layer %d has no eager attention core", layer));
  }
  return core;
}

}  // namespace

absl::StatusOr<std::vector<CheckpointRegion>> SettingsRegions(EmitFormat format, const StackPlan& plan,
                                                              const Graph& step) {
  const std::vector<CheckpointRegion> ops = LayerRegions(step);
  std::vector<CheckpointRegion> regions;
  auto whole_layers = [&](const std::vector<int>& layers) -> absl::Status {
    for (int layer : layers) {
      HEADROOM_ASSIGN_OR_RETURN(CheckpointRegion r, LayerRegion(ops, layer));
      regions.push_back(r);
    }
    return absl::OkStatus();
  };
  auto cores = [&](const std::vector<int>& layers) -> absl::Status {
    for (int layer : layers) {
      HEADROOM_ASSIGN_OR_RETURN(CheckpointRegion r, CoreRegion(step, ops, layer));
      regions.push_back(r);
    }
    return absl::OkStatus();
  };
  switch (format) {
    case EmitFormat::kTorch: {
      if (!plan.LayersWith(LayerTreatment::kOffload).empty()) {
        return absl::UnimplementedError("its save_on_cpu layers' copies are not modeled");
      }
      HEADROOM_RETURN_IF_ERROR(whole_layers(plan.LayersWith(LayerTreatment::kFull)));
      HEADROOM_RETURN_IF_ERROR(cores(plan.LayersWith(LayerTreatment::kSelective)));
      break;
    }
    case EmitFormat::kHf: {
      if (!EveryLayerFull(plan)) return absl::UnimplementedError("it sets nothing for this plan");
      std::vector<int> all;
      for (const LayerPlan& l : plan.layers) all.push_back(l.layer);
      HEADROOM_RETURN_IF_ERROR(whole_layers(all));
      break;
    }
    case EmitFormat::kMegatron: {
      const std::vector<int> full = plan.LayersWith(LayerTreatment::kFull);
      const std::vector<int> selective = plan.LayersWith(LayerTreatment::kSelective);
      if (full.empty() && selective.size() == plan.layers.size()) {
        HEADROOM_RETURN_IF_ERROR(cores(selective));
      } else if (selective.empty() && UniformChunk(plan) > 0) {
        const int chunk = UniformChunk(plan);
        for (size_t i = 0; i < plan.layers.size(); i += static_cast<size_t>(chunk)) {
          const size_t end = std::min(plan.layers.size(), i + static_cast<size_t>(chunk));
          HEADROOM_ASSIGN_OR_RETURN(CheckpointRegion first, LayerRegion(ops, plan.layers[i].layer));
          HEADROOM_ASSIGN_OR_RETURN(CheckpointRegion last, LayerRegion(ops, plan.layers[end - 1].layer));
          regions.push_back({.layer = first.layer, .first = first.first, .last = last.last});
        }
      } else if (selective.empty() && BlockLayers(plan) > 0) {
        HEADROOM_RETURN_IF_ERROR(whole_layers(full));
      } else {
        return absl::UnimplementedError("its flags cannot express this plan");
      }
      break;
    }
    case EmitFormat::kDeepSpeed:
      return absl::UnimplementedError("DeepSpeed checkpoints where the model's own code calls it");
    case EmitFormat::kTorchBudget:
      return absl::UnimplementedError("torch.compile's partitioner chooses what it saves");
  }
  std::sort(regions.begin(), regions.end(),
            [](const CheckpointRegion& a, const CheckpointRegion& b) { return a.first < b.first; });
  return regions;
}

std::string EmitPlan(EmitFormat format, const StackPlan& plan, const EmitContext& context) {
  switch (format) {
    case EmitFormat::kTorch: return EmitTorch(plan, context);
    case EmitFormat::kHf: return EmitHf(plan, context);
    case EmitFormat::kMegatron: return EmitMegatron(plan, context);
    case EmitFormat::kDeepSpeed: return EmitDeepSpeed(plan, context);
    case EmitFormat::kTorchBudget: return EmitTorchBudget(plan, context);
  }
  return "";
}

}  // namespace headroom
