#!/usr/bin/python3
"""Export a HuggingFace-style GPT-2, GPT-NeoX, GPT-J, Phi, Llama or BERT to ONNX in training mode, with its facts.

The models are written as transformers (~4.30) writes them (models/hf_gpt2.py, models/gpt_neox.py,
models/gptj.py, models/phi.py (4.37's), models/llama.py, models/bert.py), so the graphs are what a user
exporting `GPT2LMHeadModel`, `GPTNeoXForCausalLM`, `GPTJForCausalLM`, `PhiForCausalLM`, `LlamaForCausalLM`
or `BertForMaskedLM` gets. Like models/export_gpt.py it writes OUT.onnx (Dropout kept, no constant
folding, parameters named by their torch state-dict names) and next to it OUT.json: the family,
the sizes, the variant switches, the parameter count, the graph inputs with their roles
(tokens / positions / mask / token_types), what became of every buffer, the opset and the seed.
The token input is named by --input-name (default input_ids: the same weights can be exported under
any name); the other inputs keep HF's names attention_mask, position_ids and token_type_ids.

    /usr/bin/python3 models/export_family.py --family gpt2 -o /tmp/g.onnx --input-name input_ids
    /usr/bin/python3 models/export_family.py --family llama -o /tmp/l.onnx --heads 4 --kv-heads 2 \\
        --rope interleaved --rope-tables sliced --mask triu --opset 14
    /usr/bin/python3 models/export_family.py --family bert -o /tmp/b.onnx --mask finfo --token-types buffer

Variant switches (each family accepts only its own; see the model files for the exact forms):
    gpt2   --buffers hf430|nonpersistent   --attention-mask none|input   --position-ids internal|input
           --activation gelu_new|gelu|relu|silu (GPT2Config.activation_function)
           --residual sequential|parallel|parallel-one-norm (GPT-NeoX's and GPT-J's blocks)
    gpt_neox --rotary-pct 0.25|0.5|1.0  --parallel-residual true|false
           --attention-mask none|input  --position-ids internal|input
    gptj   --rotary-pct 0.25|0.5|1.0 (rotary_dim = head size x pct; GPT-J-6B's 64 of 256 is 0.25)
           --attention-mask none|input  --position-ids internal|input
    phi    --rotary-pct 0.5|0.25|1.0 (partial_rotary_factor; phi-1 and phi-1.5: 0.5)  --position-ids internal|input
    llama  --rmsnorm hf|div  --silu module|manual  --rope half|interleaved
           --rope-tables position_ids|sliced  --mask finfo|triu|tril  --attention-mask none|input|ones
    bert   --mask 10000|finfo  --token-types input|buffer  --pad-token-id N
Combinations torch cannot export at the requested opset are refused before exporting.
"""

import argparse
import io
import json
import os
import sys
import warnings

import onnx
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bert as bert_lib  # noqa: E402
import gpt_neox as neox_lib  # noqa: E402
import gptj as gptj_lib  # noqa: E402
import hf_gpt2 as gpt2_lib  # noqa: E402
import llama as llama_lib  # noqa: E402
import phi as phi_lib  # noqa: E402
from export_gpt import add_output_args, facts_path, save_onnx  # noqa: E402  (shared with the GPT exporter)

MIN_OPSET, MAX_OPSET = 13, 17
MIN_TRILU_OPSET = 14
FAMILIES = ("gpt2", "gpt_neox", "gptj", "phi", "llama", "bert")
TOKENS, POSITIONS, MASK, TOKEN_TYPES = "tokens", "positions", "mask", "token_types"

# Family -> switch -> (choices, default). `--mask` is shared by name, with different forms.
VARIANTS = {
    "gpt2": {"buffers": (gpt2_lib.BUFFER_FORMS, "hf430"),
             "activation": (gpt2_lib.ACTIVATIONS, "gelu_new"),
             "residual": (gpt2_lib.RESIDUAL_FORMS, "sequential"),
             "attention_mask": (("none", "input"), "none"),
             "position_ids": (("internal", "input"), "internal")},
    "gpt_neox": {"rotary_pct": (neox_lib.ROTARY_PCTS, "0.25"),
                 "parallel_residual": (neox_lib.PARALLEL_FORMS, "true"),
                 "attention_mask": (("none", "input"), "none"),
                 "position_ids": (("internal", "input"), "internal")},
    "gptj": {"rotary_pct": (gptj_lib.ROTARY_PCTS, "0.25"),
             "attention_mask": (("none", "input"), "none"),
             "position_ids": (("internal", "input"), "internal")},
    "phi": {"rotary_pct": (phi_lib.ROTARY_PCTS, "0.5"),
            "position_ids": (("internal", "input"), "internal")},
    "llama": {"rmsnorm": (llama_lib.RMSNORM_FORMS, "hf"),
              "silu": (llama_lib.SILU_FORMS, "module"),
              "rope": (llama_lib.ROPE_FORMS, "half"),
              "rope_tables": (llama_lib.ROPE_TABLE_FORMS, "position_ids"),
              "mask": (llama_lib.MASK_FORMS, "finfo"),
              "attention_mask": (llama_lib.ATTENTION_MASK_FORMS, "none")},
    "bert": {"mask": (bert_lib.MASK_FORMS, "10000"),
             "token_types": (bert_lib.TOKEN_TYPE_FORMS, "input")},
}
DEFAULT_DROPOUT = {"gpt2": 0.1, "gpt_neox": 0.0, "gptj": 0.0, "phi": 0.0, "llama": 0.0, "bert": 0.1}
DEFAULT_TIED = {"gpt2": True, "gpt_neox": False, "gptj": False, "phi": False, "llama": False, "bert": True}


def all_switches():
    names = {}
    for family, switches in VARIANTS.items():
        for name, (choices, _) in switches.items():
            names.setdefault(name, []).append((family, choices))
    return names


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--family", required=True, choices=FAMILIES, help="model family")
    p.add_argument("-o", "--output", required=True, help="the .onnx file to write (OUT.json goes next to it)")
    p.add_argument("--opset", type=int, default=17, help=f"ONNX opset, {MIN_OPSET}..{MAX_OPSET} (default 17)")
    p.add_argument("--layers", type=int, default=2, help="number of layers L (default 2)")
    p.add_argument("--hidden", type=int, default=64, help="hidden size h (default 64)")
    p.add_argument("--heads", type=int, default=4, help="attention (query) heads a (default 4)")
    p.add_argument("--kv-heads", type=int, default=None,
                   help="llama: key/value heads (default heads / 2 when even, else heads); must divide --heads")
    p.add_argument("--ffn", type=int, default=None,
                   help="MLP inner size (default 4h for gpt2 and bert; llama: 8h/3 rounded up to 8)")
    p.add_argument("--seq", type=int, default=64, help="sequence length s")
    p.add_argument("--max-positions", type=int, default=None,
                   help="position table / causal-mask buffer / rotary table size (HF's n_positions or "
                        "max_position_embeddings; default --seq); at least --seq")
    p.add_argument("--vocab", type=int, default=256, help="vocabulary size v")
    p.add_argument("--batch", type=int, default=4, help="micro-batch size b")
    p.add_argument("--dropout", type=float, default=None,
                   help="dropout probability everywhere (gpt2 and bert; default 0.1; llama has none)")
    tie = p.add_mutually_exclusive_group()
    tie.add_argument("--tied", dest="tied", action="store_true", default=None,
                     help="share the output layer weight with the token embedding (gpt2, bert default)")
    tie.add_argument("--untied", dest="tied", action="store_false",
                     help="give the output layer its own weight (llama default; not bert)")
    p.add_argument("--input-name", default=None,
                   help="name of the token input in the graph (default input_ids); e.g. idx, tokens")
    add_output_args(p)
    for name, uses in all_switches().items():
        forms = sorted({c for _, choices in uses for c in choices})
        where = "; ".join(f"{family}: {'|'.join(choices)}" for family, choices in uses)
        p.add_argument("--" + name.replace("_", "-"), dest=name, default=None, metavar="|".join(forms),
                       help=where)
    p.add_argument("--pad-token-id", type=int, default=None,
                   help="bert: word_embeddings padding_idx as HF's (0); its row then gets no gradient in torch")
    args = p.parse_args(argv)
    error = validate(args)
    if error:
        p.error(error)
    return args


def validate(args):
    """Fill family defaults into args; return an error message or None."""
    family = args.family
    if not MIN_OPSET <= args.opset <= MAX_OPSET:
        return f"--opset must be in {MIN_OPSET}..{MAX_OPSET}"
    switches = VARIANTS[family]
    for name, uses in all_switches().items():
        value = getattr(args, name)
        if name not in switches:
            if value is not None:
                return (f"--{name.replace('_', '-')} is not a {family} switch (it belongs to "
                        f"{', '.join(f for f, _ in uses)})")
            continue
        choices, default = switches[name]
        if value is None:
            setattr(args, name, default)
        elif value not in choices:
            return f"--{name.replace('_', '-')} for {family} must be one of {', '.join(choices)}, got {value!r}"
    if args.pad_token_id is not None and family != "bert":
        return "--pad-token-id is a bert switch"
    if args.pad_token_id is not None and not 0 <= args.pad_token_id < args.vocab:
        return f"--pad-token-id {args.pad_token_id} is outside the vocabulary [0, {args.vocab})"
    if args.dropout is None:
        args.dropout = DEFAULT_DROPOUT[family]
    elif family == "llama" and args.dropout != 0:
        return "llama has no dropout (HF's LlamaForCausalLM has none); leave --dropout out or set it to 0"
    if args.tied is None:
        args.tied = DEFAULT_TIED[family]
    elif family == "bert" and not args.tied:
        return "BertForMaskedLM always ties its decoder to the word embeddings; --untied is not a bert switch"
    if args.hidden % args.heads:
        return f"--hidden {args.hidden} is not divisible by --heads {args.heads}"
    if family == "llama":
        if args.kv_heads is None:
            args.kv_heads = args.heads // 2 if args.heads % 2 == 0 else args.heads
        if args.kv_heads < 1 or args.heads % args.kv_heads:
            return f"--kv-heads {args.kv_heads} must divide --heads {args.heads}"
        if (args.hidden // args.heads) % 2:
            return f"llama's rotary embeddings need an even head size, got {args.hidden // args.heads}"
        if args.ffn is None:
            args.ffn = -(-(8 * args.hidden // 3) // 8) * 8
        if args.mask in ("triu", "tril") and args.opset < MIN_TRILU_OPSET:
            return (f"--mask {args.mask} builds the causal mask with torch.{args.mask}, exported as Trilu, which "
                    f"exists from opset {MIN_TRILU_OPSET} (torch cannot export it at opset {args.opset}); "
                    f"use --mask finfo or --opset {MIN_TRILU_OPSET} or later")
    else:
        if args.kv_heads is not None:
            return "--kv-heads is a llama switch"
        if family in ("gpt_neox", "gptj", "phi") and int(args.hidden // args.heads * float(args.rotary_pct)) % 2:
            return (f"{family}'s rotary dims (head size {args.hidden // args.heads} x --rotary-pct "
                    f"{args.rotary_pct}) must be even")
        if args.ffn is None:
            args.ffn = 4 * args.hidden
    if args.max_positions is None:
        args.max_positions = args.seq
    elif args.max_positions < args.seq:
        return f"--max-positions {args.max_positions} is less than --seq {args.seq}"
    if args.input_name is None:
        args.input_name = "input_ids"
    role_names = {"attention_mask", "position_ids", "token_type_ids"}
    if args.input_name in role_names or args.input_name == "logits":
        return f"--input-name {args.input_name} is the name of another input or output of the graph"
    for dim, value in (("layers", args.layers), ("hidden", args.hidden), ("heads", args.heads),
                       ("seq", args.seq), ("vocab", args.vocab), ("batch", args.batch), ("ffn", args.ffn)):
        if value < 1:
            return f"--{dim} must be positive, got {value}"
    return None


def build_model(family, sizes, variants, dropout, tied, pad_token_id=None):
    """The torch model of a family from sizes (layers, hidden, heads, kv_heads, ffn, seq, vocab and
    optionally max_positions, default seq) and variants.

    Shared by the exporter and tests/e2e/family_reference.py (which rebuilds it from OUT.json).
    """
    s = sizes
    max_positions = s.get("max_positions") or s["seq"]
    if family == "gpt2":
        config = gpt2_lib.GPT2Config(vocab_size=s["vocab"], n_positions=max_positions, n_embd=s["hidden"],
                                     n_layer=s["layers"], n_head=s["heads"], n_inner=s["ffn"],
                                     resid_pdrop=dropout, embd_pdrop=dropout, attn_pdrop=dropout,
                                     tie_word_embeddings=tied, buffers=variants["buffers"],
                                     activation_function=variants["activation"],
                                     residual=variants["residual"])
        return gpt2_lib.GPT2LMHeadModel(config)
    if family == "gpt_neox":
        config = neox_lib.GPTNeoXConfig(vocab_size=s["vocab"], hidden_size=s["hidden"], num_hidden_layers=s["layers"],
                                        num_attention_heads=s["heads"], intermediate_size=s["ffn"],
                                        attention_dropout=dropout, hidden_dropout=dropout,
                                        max_position_embeddings=max_positions, tie_word_embeddings=tied,
                                        rotary_pct=variants["rotary_pct"],
                                        parallel_residual=variants["parallel_residual"])
        return neox_lib.GPTNeoXForCausalLM(config)
    if family == "gptj":
        config = gptj_lib.GPTJConfig(vocab_size=s["vocab"], n_positions=max_positions, n_embd=s["hidden"],
                                     n_layer=s["layers"], n_head=s["heads"], n_inner=s["ffn"],
                                     rotary_dim=int(s["hidden"] // s["heads"] * float(variants["rotary_pct"])),
                                     resid_pdrop=dropout, embd_pdrop=dropout, attn_pdrop=dropout,
                                     tie_word_embeddings=tied)
        return gptj_lib.GPTJForCausalLM(config)
    if family == "phi":
        config = phi_lib.PhiConfig(vocab_size=s["vocab"], hidden_size=s["hidden"], intermediate_size=s["ffn"],
                                   num_hidden_layers=s["layers"], num_attention_heads=s["heads"],
                                   resid_pdrop=dropout, embd_pdrop=dropout, attention_dropout=dropout,
                                   max_position_embeddings=max_positions, tie_word_embeddings=tied,
                                   partial_rotary_factor=float(variants["rotary_pct"]))
        return phi_lib.PhiForCausalLM(config)
    if family == "llama":
        config = llama_lib.LlamaConfig(vocab_size=s["vocab"], hidden_size=s["hidden"], intermediate_size=s["ffn"],
                                       num_hidden_layers=s["layers"], num_attention_heads=s["heads"],
                                       num_key_value_heads=s["kv_heads"], max_position_embeddings=max_positions,
                                       tie_word_embeddings=tied,
                                       **{k: variants[k] for k in VARIANTS["llama"]})
        return llama_lib.LlamaForCausalLM(config)
    if family == "bert":
        config = bert_lib.BertConfig(vocab_size=s["vocab"], hidden_size=s["hidden"], num_hidden_layers=s["layers"],
                                     num_attention_heads=s["heads"], intermediate_size=s["ffn"],
                                     hidden_dropout_prob=dropout, attention_probs_dropout_prob=dropout,
                                     max_position_embeddings=max_positions, pad_token_id=pad_token_id,
                                     mask=variants["mask"], token_types=variants["token_types"])
        if not tied:
            raise ValueError("BertForMaskedLM is always tied")
        return bert_lib.BertForMaskedLM(config)
    raise ValueError(f"unknown family {family!r}")


def input_roles(family, variants):
    """The forward's extra inputs in order, as (keyword, role): the token input comes first."""
    extra = []
    if family in ("gpt2", "gpt_neox", "gptj"):
        if variants["attention_mask"] == "input":
            extra.append(("attention_mask", MASK))
        if variants["position_ids"] == "input":
            extra.append(("position_ids", POSITIONS))
    elif family == "phi":
        if variants["position_ids"] == "input":
            extra.append(("position_ids", POSITIONS))
    elif family == "llama":
        if variants["attention_mask"] == "input":
            extra.append(("attention_mask", MASK))
        if variants["rope_tables"] == "position_ids":
            extra.append(("position_ids", POSITIONS))
    elif family == "bert":
        extra.append(("attention_mask", MASK))
        if variants["token_types"] == "input":
            extra.append(("token_type_ids", TOKEN_TYPES))
    return extra


def role_value(role, batch, seq, tokens=None):
    """What the runtime feeds each input: positions arange(seq) per row, mask ones, token types zeros."""
    if role == TOKENS:
        return tokens
    if role == POSITIONS:
        return torch.arange(seq, dtype=torch.long).unsqueeze(0).expand(batch, seq).contiguous()
    if role == MASK:
        return torch.ones(batch, seq, dtype=torch.long)
    if role == TOKEN_TYPES:
        return torch.zeros(batch, seq, dtype=torch.long)
    raise ValueError(f"unknown input role {role!r}")


def forward_kwargs(family, variants, batch, seq):
    """The keyword inputs of the forward (besides the tokens) the runtime's roles give."""
    return {kw: role_value(role, batch, seq) for kw, role in input_roles(family, variants)}


def export_onnx(model, args):
    """Trace the model in training mode and return the ModelProto."""
    tokens = torch.randint(0, args.vocab, (args.batch, args.seq), dtype=torch.long)
    extra = input_roles(args.family, variants_of(args))
    kwargs = {kw: role_value(role, args.batch, args.seq) for kw, role in extra}
    input_names = [args.input_name] + [kw for kw, _ in extra]
    dynamic_axes = None
    if args.dynamic:
        dynamic_axes = {name: {0: "batch", 1: "seq"} for name in input_names}
        dynamic_axes["logits"] = {0: "batch", 1: "seq"}
    # A trailing dict holds keyword arguments; the graph inputs follow the forward's parameter order,
    # which input_roles() keeps.
    call = (tokens, kwargs) if kwargs else (tokens,)
    buf = io.BytesIO()
    with warnings.catch_warnings():  # HF's Python-level size checks (if seq_len > ...) make the tracer warn
        warnings.filterwarnings("ignore", category=torch.jit.TracerWarning)
        torch.onnx.export(model, call, buf, opset_version=args.opset,
                          training=torch.onnx.TrainingMode.TRAINING,
                          do_constant_folding=False, input_names=input_names, output_names=["logits"],
                          dynamic_axes=dynamic_axes)
    proto = onnx.load_model_from_string(buf.getvalue())
    have = [i.name for i in proto.graph.input]
    if have != input_names:
        sys.exit(f"error: the exported graph's inputs are {have}, want {input_names}")
    return proto


def variants_of(args):
    return {name: getattr(args, name) for name in VARIANTS[args.family]}


def check_initializer_names(model, proto):
    """Every parameter must be an initializer of its state-dict name (downstream tools find them so)."""
    inits = {t.name for t in proto.graph.initializer}
    missing = sorted({name for name, _ in model.named_parameters()} - inits)
    if missing:
        sys.exit(f"error: torch renamed or dropped initializers {missing}")


def buffer_fates(model, proto):
    """name -> "initializer" (a persistent buffer the forward reads), "inlined" (a non-persistent buffer,
    which torch traces as a constant, so it reaches the graph as Constant nodes or anonymous
    initializers, already sliced) or "unused" (a persistent buffer the forward never reads)."""
    inits = {t.name for t in proto.graph.initializer}
    persistent = set(model.state_dict())
    fates = {}
    for name, _ in model.named_buffers():
        if name in inits:
            fates[name] = "initializer"
        elif name in persistent:
            fates[name] = "unused"
        else:
            fates[name] = "inlined"
    return fates


def sizes_of(args):
    return {"layers": args.layers, "hidden": args.hidden, "heads": args.heads,
            "kv_heads": args.kv_heads if args.family == "llama" else args.heads,
            "ffn": args.ffn, "seq": args.seq, "max_positions": args.max_positions, "vocab": args.vocab,
            "batch": args.batch}


def expected_facts(model, proto, args):
    extra = input_roles(args.family, variants_of(args))
    elem = {onnx.TensorProto.INT64: "int64", onnx.TensorProto.FLOAT: "float32", onnx.TensorProto.INT32: "int32"}
    dtypes = {i.name: elem.get(i.type.tensor_type.elem_type, str(i.type.tensor_type.elem_type))
              for i in proto.graph.input}
    names = [args.input_name] + [kw for kw, _ in extra]
    roles = [TOKENS] + [role for _, role in extra]
    shape = ["batch", "seq"] if args.dynamic else [args.batch, args.seq]
    facts = {"family": args.family, **sizes_of(args), "params": model.num_params(), "tied": args.tied,
             "opset": args.opset, "dropout": args.dropout, "dynamic": args.dynamic, "seed": args.seed,
             "variants": variants_of(args), "pad_token_id": args.pad_token_id,
             "inputs": [{"name": n, "role": r, "dtype": dtypes[n], "shape": shape} for n, r in zip(names, roles)],
             "input_name": args.input_name, "outputs": [{"name": "logits", "shape": shape + [args.vocab]}],
             "buffers": buffer_fates(model, proto)}
    return facts


def main(argv=None):
    args = parse_args(argv)
    torch.manual_seed(args.seed)
    model = build_model(args.family, sizes_of(args), variants_of(args), args.dropout, args.tied, args.pad_token_id)
    proto = export_onnx(model, args)
    check_initializer_names(model, proto)
    save_onnx(proto, args.output, args.external_data)
    with open(facts_path(args.output), "w") as f:
        json.dump(expected_facts(model, proto, args), f, indent=2)
        f.write("\n")
    if args.save_torch:
        torch.save(model.state_dict(), args.save_torch)


if __name__ == "__main__":
    main()
