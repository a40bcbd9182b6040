#!/usr/bin/python3
"""Write weight-free ONNX graphs of gpt.py's GPT at the paper's sizes (or any size).

The graph is node for node what torch 1.13 writes for `export_gpt.py` at
opset 17 with the default variants and static shapes (fused
LayerNormalization, erf GELU, MatMul with a Transposed weight, sliced bool mask
buffer, Dropout in training mode, Split/Reshape/Transpose heads, and the
Constant/Unsqueeze/Concat shape subgraphs); `check_paper_graph_structure.py`
keeps the two in step. Every initializer is declared with its dtype and shape
as external data in STEM.weights.bin next to the graph, at consecutive
64-byte-aligned offsets; by default that file is never written, so the 175B
graph takes a fraction of a second and about 1.3 MB.

    /usr/bin/python3 models/gen_paper_graph.py --model 175B -o /tmp/gpt-175B.onnx
    /usr/bin/python3 models/gen_paper_graph.py --all -o /tmp/paper
    /usr/bin/python3 models/gen_paper_graph.py --layers 2 --hidden 64 --heads 4 --seq 32 \\
        --vocab 128 --batch 2 -o /tmp/small.onnx

Two options make graphs that sp-run can train (tools/bench_gpu.py uses them):

  --weights [--seed S]   also write STEM.weights.bin: every matrix and embedding
                         normal(0, 0.02) from numpy's PCG64 seeded with S, the
                         LayerNorm gains 1, every bias 0 and the mask buffers
                         the lower triangle of ones. It is written tensor by
                         tensor in chunks of 4 Mi elements, so memory stays
                         small whatever the model's size.
  --shard T              every layer is the layer of ONE rank of a T-way
                         tensor-parallel group, as a model of its own: a/T
                         heads of head size h/a, QKV weight [3h/T, h], attention
                         projection [h, h/T], fc1 [4h/T, h], fc2 [h, 4h/T]
                         (torch's [out, in] layout); the residual stream,
                         LayerNorms and embeddings keep the full width h. Its
                         GEMMs are those of a Megatron rank at t = T; the
                         collectives that would join the ranks are absent.

With --model NAME, the size flags override that model's values (e.g.
`--model 22B --layers 1 --vocab 256 --shard 8 --weights`).

Needs only the onnx package and numpy (no torch).
"""

import argparse
import csv
import dataclasses
import math
import os
import sys
import time
from collections import defaultdict

import numpy as np
from onnx import TensorProto, helper, numpy_helper, save_model

OPSET = 17
IR_VERSION = 8  # what torch 1.13 writes at opset 17
ALIGNMENT = 64
LAYERNORM_EPS = 1e-5
REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DEFAULT_MODELS_CSV = os.path.join(REPO_ROOT, "models", "paper", "models.csv")

DTYPE_BYTES = {TensorProto.FLOAT: 4, TensorProto.BOOL: 1}
SHARED_MASK = "causal_mask"
MASK_FORMS = ("buffer", "shared", "computed")


@dataclasses.dataclass
class GPTSize:
    layers: int
    hidden: int
    heads: int
    seq: int
    vocab: int
    batch: int
    tied: bool = True
    dropout: float = 0.1
    mask: str = "buffer"
    shard: int = 1  # write one rank's layer of a `shard`-way tensor-parallel group

    @property
    def head_dim(self):
        return self.hidden // self.heads

    @property
    def local_heads(self):
        """The attention heads of one rank."""
        return self.heads // self.shard

    @property
    def inner(self):
        """The width of one rank's q, k, v and merged heads (h, or h/t for a shard)."""
        return self.local_heads * self.head_dim

    @property
    def ffn(self):
        """The width of one rank's MLP (4h, or 4h/t for a shard)."""
        return 4 * self.hidden // self.shard


def read_paper_models(path):
    """The paper's configurations from models.csv, by model name."""
    with open(path, newline="") as f:
        return {row["model"]: GPTSize(layers=int(row["layers_L"]), hidden=int(row["hidden_h"]),
                                      heads=int(row["attention_heads_a"]), seq=int(row["seq_s"]),
                                      vocab=int(row["vocab_v"]), batch=int(row["micro_batch_b"]))
                for row in csv.DictReader(f)}


def paper_graph_path(directory, model_name):
    return os.path.join(directory, f"gpt-{model_name}.onnx")


def state_dict_layout(size):
    """(name, dtype, shape) of every initializer, in torch's state-dict order."""
    h, inner, ffn = size.hidden, size.inner, size.ffn
    layout = [("transformer.wte.weight", TensorProto.FLOAT, [size.vocab, h]),
              ("transformer.wpe.weight", TensorProto.FLOAT, [size.seq, h])]
    for i in range(size.layers):
        p = f"transformer.h.{i}"
        layout += [(f"{p}.ln_1.weight", TensorProto.FLOAT, [h]),
                   (f"{p}.ln_1.bias", TensorProto.FLOAT, [h]),
                   (f"{p}.attn.bias", TensorProto.BOOL, [1, 1, size.seq, size.seq]),
                   (f"{p}.attn.c_attn.weight", TensorProto.FLOAT, [3 * inner, h]),
                   (f"{p}.attn.c_attn.bias", TensorProto.FLOAT, [3 * inner]),
                   (f"{p}.attn.c_proj.weight", TensorProto.FLOAT, [h, inner]),
                   (f"{p}.attn.c_proj.bias", TensorProto.FLOAT, [h]),
                   (f"{p}.ln_2.weight", TensorProto.FLOAT, [h]),
                   (f"{p}.ln_2.bias", TensorProto.FLOAT, [h]),
                   (f"{p}.mlp.c_fc.weight", TensorProto.FLOAT, [ffn, h]),
                   (f"{p}.mlp.c_fc.bias", TensorProto.FLOAT, [ffn]),
                   (f"{p}.mlp.c_proj.weight", TensorProto.FLOAT, [h, ffn]),
                   (f"{p}.mlp.c_proj.bias", TensorProto.FLOAT, [h])]
    layout += [("transformer.ln_f.weight", TensorProto.FLOAT, [h]),
               ("transformer.ln_f.bias", TensorProto.FLOAT, [h])]
    if not size.tied:
        layout.append(("lm_head.weight", TensorProto.FLOAT, [size.vocab, h]))
    return layout


class GraphBuilder:
    """Appends nodes named the way torch names them ("/h.0/attn/MatMul_1")."""

    def __init__(self):
        self.nodes = []
        self.initializers = []
        self._counts = defaultdict(int)
        self._pooled = {}
        self._weights_end = 0

    def node(self, scope, op, inputs, outputs=1, **attrs):
        """Add a node; returns its output name, or the list of names if outputs > 1."""
        count = self._counts[(scope, op)]
        self._counts[(scope, op)] += 1
        name = f"{scope}/{op}" + (f"_{count}" if count else "")
        names = outputs if isinstance(outputs, list) else [f"{name}_output_{i}" for i in range(outputs)]
        self.nodes.append(helper.make_node(op, inputs, names, name=name, **attrs))
        return names[0] if len(names) == 1 else names

    def constant(self, scope, value, dtype):
        return self.node(scope, "Constant", [], value=numpy_helper.from_array(np.array(value, dtype=dtype)))

    def pooled_int(self, scope, value):
        """An int64 scalar shared by the whole graph, as torch pools the Python ints it traces."""
        if value not in self._pooled:
            self._pooled[value] = self.constant(scope, value, np.int64)
        return self._pooled[value]

    def external_tensor(self, name, dtype, shape, location):
        """A tensor whose data would live at the next aligned offset of `location`."""
        length = DTYPE_BYTES[dtype] * math.prod(shape)
        offset = -(-self._weights_end // ALIGNMENT) * ALIGNMENT
        self._weights_end = offset + length
        tensor = TensorProto(name=name, data_type=dtype, dims=shape, data_location=TensorProto.EXTERNAL)
        for key, value in (("location", location), ("offset", offset), ("length", length)):
            tensor.external_data.add(key=key, value=str(value))
        return tensor

    def external_initializer(self, name, dtype, shape, location):
        """Declare an initializer whose data would live at the next aligned offset of `location`."""
        self.initializers.append(self.external_tensor(name, dtype, shape, location))


def dropout(b, scope, x, ratio):
    ratio = b.constant(scope, ratio, np.float32)
    training = b.constant(scope, True, np.bool_)
    return b.node(scope, "Dropout", [x, ratio, training], outputs=2)[0]


def linear(b, scope, x, prefix):
    """nn.Linear on a 3D input: Add(bias, MatMul(x, Transpose(weight)))."""
    w_t = b.node(scope, "Transpose", [f"{prefix}.weight"], perm=[1, 0])
    y = b.node(scope, "MatMul", [x, w_t])
    return b.node(scope, "Add", [f"{prefix}.bias", y])


def layer_norm(b, scope, x, prefix):
    return b.node(scope, "LayerNormalization", [x, f"{prefix}.weight", f"{prefix}.bias"],
                  axis=-1, epsilon=LAYERNORM_EPS)


def shape_tensor(b, scope, scalars):
    """Concat of Unsqueezed int64 scalars: how torch writes the shape argument of view()."""
    dims = []
    for s in scalars:
        axes = b.constant(scope, [0], np.int64)
        dims.append(b.node(scope, "Unsqueeze", [s, axes]))
    return b.node(scope, "Concat", dims, axis=0)


def slice_last_dims(b, scope, x, end):
    """x[:, :, :end, :end] as torch writes it: one Slice per axis."""
    for axis in (2, 3):
        axes = b.constant(scope, [axis], np.int64)
        starts = b.constant(scope, [0], np.int64)
        ends = b.constant(scope, [end], np.int64)
        steps = b.constant(scope, [1], np.int64)
        x = b.node(scope, "Slice", [x, starts, ends, axes, steps])
    return x


def attention(b, size, scope, x, prefix):
    batch = b.constant(scope, size.batch, np.int64)
    seq = b.constant(scope, size.seq, np.int64)
    heads = b.pooled_int(scope, size.local_heads)
    hidden = b.constant(scope, size.inner, np.int64)
    qkv = linear(b, f"{scope}/c_attn", x, f"{prefix}.c_attn")
    split = b.constant(scope, [size.inner] * 3, np.int64)
    q, k, v = b.node(scope, "Split", [qkv, split], outputs=3, axis=2)
    head_dim = b.pooled_int(scope, size.head_dim)
    q_shape, k_shape, v_shape = (shape_tensor(b, scope, [batch, seq, heads, head_dim]) for _ in range(3))
    q = b.node(scope, "Transpose", [b.node(scope, "Reshape", [q, q_shape], allowzero=0)], perm=[0, 2, 1, 3])
    k = b.node(scope, "Reshape", [k, k_shape], allowzero=0)
    v = b.node(scope, "Reshape", [v, v_shape], allowzero=0)
    v = b.node(scope, "Transpose", [v], perm=[0, 2, 1, 3])
    k_t = b.node(scope, "Transpose", [k], perm=[0, 2, 3, 1])

    scores = b.node(scope, "MatMul", [q, k_t])
    scores = b.node(scope, "Div", [scores, b.constant(scope, math.sqrt(size.head_dim), np.float32)])
    if size.mask == "shared":
        hidden_keys = SHARED_MASK
    elif size.mask == "computed":
        # ~torch.ones(s, s, dtype=torch.bool).tril() built at run time from
        # its shape (ConstantOfShape, Trilu): no [s, s] data in the file.
        ones = b.node(scope, "ConstantOfShape", [b.constant(scope, [size.seq, size.seq], np.int64)],
                      value=numpy_helper.from_array(np.array([True])))
        visible = b.node(scope, "Trilu", [ones, b.constant(scope, 0, np.int64)], upper=0)
        hidden_keys = b.node(scope, "Not", [visible])
    else:
        visible = slice_last_dims(b, scope, f"{prefix}.bias", size.seq)
        hidden_keys = b.node(scope, "Cast", [b.node(scope, "Not", [visible])], to=TensorProto.BOOL)
    scores = b.node(scope, "Where", [hidden_keys, b.constant(scope, -np.inf, np.float32), scores])
    probs = dropout(b, f"{scope}/attn_dropout", b.node(scope, "Softmax", [scores], axis=-1), size.dropout)

    y = b.node(scope, "Transpose", [b.node(scope, "MatMul", [probs, v])], perm=[0, 2, 1, 3])
    y = b.node(scope, "Reshape", [y, shape_tensor(b, scope, [batch, seq, hidden])], allowzero=0)
    y = linear(b, f"{scope}/c_proj", y, f"{prefix}.c_proj")
    return dropout(b, f"{scope}/resid_dropout", y, size.dropout)


def gelu_erf(b, scope, x):
    """nn.GELU(): x * (1 + erf(x / sqrt(2))) * 0.5."""
    erf = b.node(scope, "Erf", [b.node(scope, "Div", [x, b.constant(scope, math.sqrt(2.0), np.float32)])])
    one_plus = b.node(scope, "Add", [erf, b.constant(scope, 1.0, np.float32)])
    return b.node(scope, "Mul", [b.node(scope, "Mul", [x, one_plus]), b.constant(scope, 0.5, np.float32)])


def mlp(b, size, scope, x, prefix):
    y = linear(b, f"{scope}/c_fc", x, f"{prefix}.c_fc")
    y = gelu_erf(b, f"{scope}/gelu", y)
    y = linear(b, f"{scope}/c_proj", y, f"{prefix}.c_proj")
    return dropout(b, f"{scope}/dropout", y, size.dropout)


def block(b, size, i, x):
    scope, prefix = f"/h.{i}", f"transformer.h.{i}"
    y = layer_norm(b, f"{scope}/ln_1", x, f"{prefix}.ln_1")
    x = b.node(scope, "Add", [x, attention(b, size, f"{scope}/attn", y, f"{prefix}.attn")])
    y = layer_norm(b, f"{scope}/ln_2", x, f"{prefix}.ln_2")
    return b.node(scope, "Add", [x, mlp(b, size, f"{scope}/mlp", y, f"{prefix}.mlp")])


def build_model(size, weights_location, doc=""):
    """The ModelProto of the GPT of `size`, its weights declared in `weights_location`."""
    b = GraphBuilder()
    for name, dtype, shape in state_dict_layout(size):
        if size.mask != "buffer" and name.endswith(".attn.bias"):
            continue
        b.external_initializer(name, dtype, shape, weights_location)
    if size.mask == "shared":
        # One [s, s] bool initializer with its data, True above the diagonal
        # (the keys a query must not see), used by every layer's Where.
        hidden = np.triu(np.ones((size.seq, size.seq), dtype=np.bool_), k=1)
        b.initializers.append(numpy_helper.from_array(hidden, SHARED_MASK))
    positions = b.constant("", np.arange(size.seq), np.int64)
    tokens = b.node("/wte", "Gather", ["transformer.wte.weight", "idx"])
    x = b.node("", "Add", [tokens, b.node("/wpe", "Gather", ["transformer.wpe.weight", positions])])
    x = dropout(b, "/drop", x, size.dropout)
    for i in range(size.layers):
        x = block(b, size, i, x)
    x = layer_norm(b, "/ln_f", x, "transformer.ln_f")
    head = "transformer.wte.weight" if size.tied else "lm_head.weight"
    b.node("/lm_head", "MatMul", [x, b.node("/lm_head", "Transpose", [head], perm=[1, 0])], outputs=["logits"])

    graph = helper.make_graph(
        b.nodes, "torch_jit",
        inputs=[helper.make_tensor_value_info("idx", TensorProto.INT64, [size.batch, size.seq])],
        outputs=[helper.make_tensor_value_info("logits", TensorProto.FLOAT, [size.batch, size.seq, size.vocab])],
        initializer=b.initializers)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)],
                              producer_name="sp gen_paper_graph.py", doc_string=doc)
    model.ir_version = IR_VERSION
    return model


WEIGHT_STD = 0.02
CHUNK_ELEMENTS = 1 << 22  # elements generated and written at a time by write_weights


def initial_value_kind(name, dtype):
    """How write_weights fills an initializer: 'tril' (the causal mask buffer), 'ones' (LayerNorm
    gains), 'zeros' (biases) or 'normal' (matrices and embeddings, N(0, WEIGHT_STD))."""
    if dtype == TensorProto.BOOL:
        return "tril"
    if ".ln_" in name and name.endswith(".weight"):
        return "ones"
    if name.endswith(".bias"):
        return "zeros"
    return "normal"


def write_weights(model, directory, seed):
    """Write the external data every initializer of `model` declares, at its declared offset.

    Streams: each tensor is generated and written CHUNK_ELEMENTS at a time (the random values
    from one numpy PCG64 generator seeded with `seed`, drawn in offset order), so a large shard
    never needs more than a chunk in memory. Returns the bytes written."""
    tensors = []
    for t in model.graph.initializer:
        if t.data_location != TensorProto.EXTERNAL:
            continue
        info = {e.key: e.value for e in t.external_data}
        tensors.append((int(info["offset"]), int(info["length"]), info["location"], t))
    tensors.sort(key=lambda item: item[0])
    locations = {location for _, _, location, _ in tensors}
    if len(locations) > 1:
        raise ValueError(f"initializers spread over several files: {sorted(locations)}")
    if not tensors:
        return 0
    rng = np.random.Generator(np.random.PCG64(seed))
    with open(os.path.join(directory, tensors[0][2]), "wb") as f:
        for offset, length, _, t in tensors:
            f.write(bytes(offset - f.tell()))  # the alignment padding
            kind = initial_value_kind(t.name, t.data_type)
            count = math.prod(t.dims)
            if kind == "tril":  # [..., s, s]: row i sees keys 0..i
                cols = t.dims[-1]
                rows_per_chunk = max(1, CHUNK_ELEMENTS // cols)
                for _ in range(count // (t.dims[-2] * cols)):
                    for r0 in range(0, t.dims[-2], rows_per_chunk):
                        rows = np.arange(r0, min(r0 + rows_per_chunk, t.dims[-2]))[:, None]
                        f.write((np.arange(cols)[None, :] <= rows).tobytes())
            else:
                for start in range(0, count, CHUNK_ELEMENTS):
                    n = min(CHUNK_ELEMENTS, count - start)
                    if kind == "normal":
                        chunk = rng.standard_normal(n, dtype=np.float32) * np.float32(WEIGHT_STD)
                    else:
                        chunk = np.full(n, 1.0 if kind == "ones" else 0.0, dtype=np.float32)
                    f.write(chunk.astype("<f4", copy=False).tobytes())
            if f.tell() != offset + length:
                raise AssertionError(f"{t.name}: wrote {f.tell() - offset} bytes, declared {length}")
        return f.tell()


def write_graph(size, path, label, weights=False, seed=0):
    """Write the graph of `size` to `path` (and, with `weights`, its external data, seeded with
    `seed`); returns its node count."""
    location = os.path.splitext(os.path.basename(path))[0] + ".weights.bin"
    shard = f" shard=1/{size.shard} (one tensor-parallel rank's layers)" if size.shard > 1 else ""
    data = (f"random weights in {location} (seed {seed})" if weights
            else f"weight-free, {location} is not written")
    doc = (f"GPT {label}: L={size.layers} h={size.hidden} a={size.heads} s={size.seq} v={size.vocab} "
           f"b={size.batch} tied={size.tied}{shard}; {data}")
    model = build_model(size, location, doc)
    save_model(model, path)
    if weights:
        write_weights(model, os.path.dirname(os.path.abspath(path)), seed)
    return len(model.graph.node)


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    which = p.add_mutually_exclusive_group()
    which.add_argument("--model", help="a model name from models.csv (22B, 175B, 530B, 1T)")
    which.add_argument("--all", action="store_true", help="every model of models.csv; -o is then a directory")
    p.add_argument("-o", "--output", required=True, help="the .onnx file to write (a directory with --all)")
    p.add_argument("--models-csv", default=DEFAULT_MODELS_CSV, help="the paper's models.csv (default: %(default)s)")
    sizes = p.add_argument_group("custom size (all six, instead of --model/--all)")
    for flag, what in (("layers", "layers L"), ("hidden", "hidden size h"), ("heads", "attention heads a"),
                       ("seq", "sequence length s"), ("vocab", "vocabulary size v"), ("batch", "micro-batch b")):
        sizes.add_argument(f"--{flag}", type=int, help=what)
    p.add_argument("--untied", action="store_true", help="give the output layer its own weight (default: tied)")
    p.add_argument("--dropout", type=float, default=0.1, help="dropout probability (default %(default)s)")
    p.add_argument("--mask", choices=MASK_FORMS, default="buffer",
                   help="buffer: each layer slices its own weight-free tril buffer (torch's export, default); "
                        "shared: one [s, s] bool initializer with data, used by every layer's Where; "
                        "computed: each layer builds it from its shape (ConstantOfShape, Trilu, opset >= 14), "
                        "no [s, s] data: for sequences of 100k and more")
    p.add_argument("--shard", type=int, default=1, metavar="T",
                   help="write every layer as one rank of a T-way tensor-parallel group: a/T heads, "
                        "QKV [3h/T, h], projection [h, h/T], fc1 [4h/T, h], fc2 [h, 4h/T] (default 1: whole)")
    p.add_argument("--weights", action="store_true",
                   help="also write STEM.weights.bin: normal(0, 0.02) matrices, LayerNorm gains 1, biases 0")
    p.add_argument("--seed", type=int, default=0, help="the seed of --weights (default %(default)s)")
    args = p.parse_args(argv)
    given = [f for f in ("layers", "hidden", "heads", "seq", "vocab", "batch") if getattr(args, f) is not None]
    if args.all and given:
        p.error("size flags go without --all (with --model they override its values)")
    if not (args.model or args.all) and len(given) < 6:
        p.error("give --model NAME, --all, or all of --layers --hidden --heads --seq --vocab --batch")
    if args.shard < 1:
        p.error("--shard must be a positive integer")
    return args


def graphs_to_write(args):
    """(label, size, path) for every graph the arguments ask for."""
    if not (args.model or args.all):
        size = GPTSize(args.layers, args.hidden, args.heads, args.seq, args.vocab, args.batch)
        return [("custom", size, args.output)]
    models = read_paper_models(args.models_csv)
    if args.all:
        os.makedirs(args.output, exist_ok=True)
        return [(name, size, paper_graph_path(args.output, name)) for name, size in models.items()]
    if args.model not in models:
        sys.exit(f"error: no model {args.model!r} in {args.models_csv} (have {', '.join(models)})")
    overrides = {f: getattr(args, f) for f in ("layers", "hidden", "heads", "seq", "vocab", "batch")
                 if getattr(args, f) is not None}
    return [(args.model, dataclasses.replace(models[args.model], **overrides), args.output)]


def check_size(size):
    """None, or why `size` cannot be written."""
    if size.hidden % size.heads:
        return f"hidden {size.hidden} is not divisible by heads {size.heads}"
    if size.heads % size.shard:
        return f"--shard {size.shard} does not divide the {size.heads} heads"
    return None


def main(argv=None):
    args = parse_args(argv)
    for label, size, path in graphs_to_write(args):
        size = dataclasses.replace(size, tied=not args.untied, dropout=args.dropout, mask=args.mask,
                                   shard=args.shard)
        problem = check_size(size)
        if problem:
            sys.exit(f"error: {problem}")
        start = time.perf_counter()
        nodes = write_graph(size, path, label, weights=args.weights, seed=args.seed)
        extra = ""
        if args.weights:
            weights = os.path.splitext(path)[0] + ".weights.bin"
            extra = f", weights {os.path.getsize(weights) / 2**20:.1f} MiB"
        print(f"{path}: {label}, {nodes} nodes, {os.path.getsize(path) / 1024:.0f} KiB{extra}, "
              f"{time.perf_counter() - start:.2f} s")


if __name__ == "__main__":
    main()
