"""headroom-trace: write a PyTorch model's training (or inference) step as Headroom graph JSON."""

import argparse
import json
import sys

import torch

from . import sources, trace
from .recorder import TraceError

EPILOG = """examples:
  headroom-trace --hf-config gemma-2-2b/config.json --batch 1 --seq 2048 -o gemma.json
  headroom-trace --torchvision mobilenet_v3_large --batch 32 --image-size 224 -o mnv3.json
  headroom-trace --module mypkg.nets:build --kwargs '{"width": 512}' --input 16x3x64x64 -o net.json
then: headroom estimate --model gemma.json --gpu h100, headroom plan --model gemma.json --gpu a10"""


def parse_args(argv):
    p = argparse.ArgumentParser(prog="headroom-trace", description=__doc__, epilog=EPILOG,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--hf-config", metavar="PATH", help="a Hugging Face config.json (or a folder holding one)")
    src.add_argument("--torchvision", metavar="NAME", help="a torchvision classification model, e.g. mobilenet_v2")
    src.add_argument("--module", metavar="PKG.MOD:CALLABLE", help="a callable returning a torch.nn.Module")
    p.add_argument("-o", "--out", metavar="FILE", help="where to write the graph JSON (default: stdout)")
    p.add_argument("--batch", type=int, default=1, help="batch size (default 1)")
    p.add_argument("--seq", type=int, default=512, help="--hf-config: sequence length (default 512)")
    p.add_argument("--target-seq", type=int, help="--hf-config encoder-decoders: decoder tokens (default --seq)")
    p.add_argument("--images", type=int, default=1,
                   help="--hf-config LLaVA: images per sequence, whose tokens --seq counts (default 1)")
    p.add_argument("--freeze", action="append", default=[], metavar="PREFIX",
                   help="freeze the parameters whose names start with PREFIX, e.g. vision_tower. (repeatable)")
    p.add_argument("--attention", default="eager", help="--hf-config: attn_implementation (default eager)")
    p.add_argument("--image-size", type=int, default=224, help="--torchvision: image side (default 224)")
    p.add_argument("--num-classes", type=int, default=1000, help="--torchvision: classes (default 1000)")
    p.add_argument("--kwargs", default="{}", help="--module: JSON object of keyword arguments")
    p.add_argument("--input", action="append", default=[], metavar="SHAPE[:DTYPE]",
                   help="--module: an input, e.g. 8x3x224x224:f32 (repeat for several)")
    p.add_argument("--loss", default="mean", choices=["mean", "cross-entropy", "none"],
                   help="--module: the loss over the first output (default mean)")
    p.add_argument("--dtype", choices=["f32", "bf16", "f16"], help="cast the model's parameters (default: as built)")
    p.add_argument("--inference", action="store_true", help="trace the forward only, under torch.no_grad()")
    args = p.parse_args(argv)
    for flag in ("batch", "seq", "image_size", "num_classes", "target_seq"):
        if getattr(args, flag) is not None and getattr(args, flag) <= 0:
            p.error(f"--{flag.replace('_', '-')} must be positive, got {getattr(args, flag)}")
    return args


def workload(args):
    if args.hf_config:
        return sources.hugging_face(args.hf_config, args.batch, args.seq, args.dtype, args.inference, args.attention,
                                    args.target_seq, args.images)
    if args.torchvision:
        return sources.torchvision_model(args.torchvision, args.batch, args.image_size, args.num_classes,
                                         args.dtype, args.inference)
    try:
        kwargs = json.loads(args.kwargs)
    except ValueError as error:
        raise TraceError(f"--kwargs: not JSON: {error}") from None
    if not isinstance(kwargs, dict):
        raise TraceError("--kwargs: expected a JSON object")
    return sources.user_module(args.module, kwargs, args.input, args.loss, args.dtype, args.inference)


def main(argv=None):
    args = parse_args(sys.argv[1:] if argv is None else argv)
    try:
        w = workload(args)
        sources.freeze(w.module, args.freeze)
        graph = trace(w.module, w.inputs, w.input_names, loss=w.loss, call=w.call, name=w.name)
    except TraceError as error:
        print(f"headroom-trace: error: {error}", file=sys.stderr)
        return 1
    text = json.dumps(graph, separators=(",", ":"))
    if args.out:
        with open(args.out, "w") as f:
            f.write(text + "\n")
    else:
        sys.stdout.write(text + "\n")
    params = sum(1 for t in graph["tensors"] if t["role"] == "parameter")
    print(f"headroom-trace: {w.name}: {len(graph['ops'])} ops, {len(graph['tensors'])} tensors, {params} parameters"
          f" (PyTorch {torch.__version__}){' -> ' + args.out if args.out else ''}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
