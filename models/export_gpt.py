#!/usr/bin/python3
"""Export the GPT of gpt.py to ONNX in training mode, with the facts a compiler should find.

Writes OUT.onnx (Dropout kept, no constant folding, parameters named by their
torch state-dict names), and next to it OUT.json holding the sizes, the
parameter count and the variant switches, which tests compare against what
sp-compile reports.

    /usr/bin/python3 models/export_gpt.py -o /tmp/gpt.onnx --layers 2 --hidden 64 \\
        --heads 4 --seq 64 --vocab 256 --batch 4 --opset 17 --tied
"""

import argparse
import io
import json
import os
import sys

import onnx
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from gpt import GELU_FORMS, GPT, LAYERNORM_FORMS, LINEAR_FORMS, MASK_FORMS, SCALE_FORMS, GPTConfig  # noqa: E402

MIN_OPSET, MAX_OPSET = 13, 17
MIN_TRILU_OPSET = 14


def add_output_args(p):
    """The flags every exporter here shares: seed, static or dynamic dims, where the data goes."""
    p.add_argument("--seed", type=int, default=1234, help="torch seed for the weights")
    p.add_argument("--dynamic", action="store_true",
                   help='make batch and sequence symbolic dims "batch" and "seq" (default static)')
    p.add_argument("--external-data", action="store_true",
                   help="store every initializer in OUT.onnx.data next to the model")
    p.add_argument("--save-torch", metavar="OUT.pt", help="also save the torch state dict here")


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("-o", "--output", required=True, help="the .onnx file to write (OUT.json goes next to it)")
    p.add_argument("--opset", type=int, default=17, help=f"ONNX opset, {MIN_OPSET}..{MAX_OPSET} (default 17)")
    p.add_argument("--layers", type=int, default=2, help="number of transformer layers L")
    p.add_argument("--hidden", type=int, default=64, help="hidden size h")
    p.add_argument("--heads", type=int, default=4, help="attention heads a")
    p.add_argument("--seq", type=int, default=64, help="sequence length s (also the position table size)")
    p.add_argument("--vocab", type=int, default=256, help="vocabulary size v")
    p.add_argument("--batch", type=int, default=4, help="micro-batch size b")
    p.add_argument("--dropout", type=float, default=0.1, help="dropout probability everywhere")
    p.add_argument("--layernorm", choices=LAYERNORM_FORMS, default="module", help="LayerNorm form")
    p.add_argument("--gelu", choices=GELU_FORMS, default="erf", help="GELU form")
    p.add_argument("--linear", choices=LINEAR_FORMS, default="matmul", help="linear layer form")
    p.add_argument("--mask", choices=MASK_FORMS, default="buffer", help="causal mask form (trilu needs opset >= 14)")
    p.add_argument("--scale", choices=SCALE_FORMS, default="div", help="attention score scaling form")
    tie = p.add_mutually_exclusive_group()
    tie.add_argument("--tied", dest="tied", action="store_true", default=True,
                     help="share the output layer weight with the token embedding (default)")
    tie.add_argument("--untied", dest="tied", action="store_false", help="give the output layer its own weight")
    add_output_args(p)
    args = p.parse_args(argv)
    if not MIN_OPSET <= args.opset <= MAX_OPSET:
        p.error(f"--opset must be in {MIN_OPSET}..{MAX_OPSET}")
    if args.mask == "trilu" and args.opset < MIN_TRILU_OPSET:
        p.error(f"--mask trilu needs Trilu, which exists from opset {MIN_TRILU_OPSET}; use --mask buffer")
    return args


def config_from_args(args):
    return GPTConfig(vocab_size=args.vocab, block_size=args.seq, n_layer=args.layers, n_head=args.heads,
                     n_embd=args.hidden, dropout=args.dropout, layernorm=args.layernorm, gelu=args.gelu,
                     linear=args.linear, mask=args.mask, scale=args.scale, tied=args.tied)


def export_onnx(model, args):
    """Trace the model in training mode and return the ModelProto."""
    idx = torch.randint(0, args.vocab, (args.batch, args.seq), dtype=torch.long)
    dynamic_axes = None
    if args.dynamic:
        dynamic_axes = {"idx": {0: "batch", 1: "seq"}, "logits": {0: "batch", 1: "seq"}}
    buf = io.BytesIO()
    torch.onnx.export(model, (idx,), buf, opset_version=args.opset, training=torch.onnx.TrainingMode.TRAINING,
                      do_constant_folding=False, input_names=["idx"], output_names=["logits"],
                      dynamic_axes=dynamic_axes)
    return onnx.load_model_from_string(buf.getvalue())


def check_initializer_names(model, proto):
    """Downstream tools find parameters by their state-dict names: make sure torch kept them."""
    expected = {name for name, _ in model.named_parameters()} | {name for name, _ in model.named_buffers()}
    missing = expected - {t.name for t in proto.graph.initializer}
    if missing:
        sys.exit(f"error: torch renamed or dropped initializers {sorted(missing)}")


def save_onnx(proto, path, external_data):
    if external_data:
        onnx.save_model(proto, path, save_as_external_data=True, all_tensors_to_one_file=True,
                        location=os.path.basename(path) + ".data", size_threshold=0)
    else:
        onnx.save_model(proto, path)


def expected_facts(model, args):
    return {
        "layers": args.layers, "hidden": args.hidden, "heads": args.heads, "seq": args.seq,
        "vocab": args.vocab, "batch": args.batch, "params": model.num_params(), "tied": args.tied,
        "opset": args.opset, "layernorm": args.layernorm, "gelu": args.gelu, "linear": args.linear,
        "mask": args.mask, "scale": args.scale, "dropout": args.dropout, "dynamic": args.dynamic,
        "seed": args.seed,
    }


def facts_path(onnx_path):
    return os.path.splitext(onnx_path)[0] + ".json"


def main(argv=None):
    args = parse_args(argv)
    torch.manual_seed(args.seed)
    model = GPT(config_from_args(args))
    proto = export_onnx(model, args)
    check_initializer_names(model, proto)
    save_onnx(proto, args.output, args.external_data)
    with open(facts_path(args.output), "w") as f:
        json.dump(expected_facts(model, args), f, indent=2)
        f.write("\n")
    if args.save_torch:
        torch.save(model.state_dict(), args.save_torch)


if __name__ == "__main__":
    main()
