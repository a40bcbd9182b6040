#!/usr/bin/python3
"""Write weight-free ONNX graphs of llama.py's Llama (HF's LlamaForCausalLM) at any size.

The graph is node for node what torch 1.13 writes for
`export_family.py --family llama --mask tril` at opset 17 with static shapes
and the other switches at their defaults (HF's RMSNorm, nn.SiLU, rotate_half,
rotary tables gathered by a position_ids input, no padding mask, untied
lm_head); `check_llama_graph_structure.py` keeps the two in step. The `tril`
mask is the one form whose causal mask is not an [s, s] float constant in the
file (64 GiB at s = 131072).

What torch writes as data, this declares as external data in STEM.weights.bin
next to the graph, which is never written, so that a Llama-3-8B graph at
s = 131072 takes well under a second and a few hundred KB:
  - every parameter, an initializer at its state-dict name, at consecutive
    64-byte-aligned offsets (as gen_paper_graph.py does);
  - the rotary tables, which torch inlines into every layer as two Constant
    nodes of [max_positions, head_dim] float32 (cos and sin, 64 MiB each at
    s = 131072, head_dim 128): here the same Constant nodes, their tensors
    external data, every layer's pointing at the same two extents;
  - the [s, s] bool matrix of ones under each layer's Trilu (torch.ones folded
    to a Constant): here a ConstantOfShape of that shape, the same value
    built from its shape.

    /usr/bin/python3 models/gen_llama_graph.py --preset llama3-8b --seq 131072 -o /tmp/llama3-8b.onnx
    /usr/bin/python3 models/gen_llama_graph.py --layers 2 --hidden 96 --heads 6 --kv-heads 2 \\
        --ffn 256 --seq 32 --vocab 128 --batch 2 -o /tmp/small.onnx

With --preset, the size flags override the preset's values. Needs only the
onnx package and numpy (no torch).
"""

import argparse
import dataclasses
import math
import os
import sys
import time

import numpy as np
from onnx import TensorProto, helper, numpy_helper, save_model

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from gen_paper_graph import IR_VERSION, OPSET, GraphBuilder, shape_tensor  # noqa: E402

RMS_NORM_EPS = 1e-6  # llama.py's LlamaConfig.rms_norm_eps
INT64_MAX = 2**63 - 1  # torch's end of an open slice (x[..., d:])


@dataclasses.dataclass
class LlamaSize:
    layers: int
    hidden: int
    heads: int
    kv_heads: int
    ffn: int
    seq: int
    vocab: int
    batch: int

    @property
    def head_dim(self):
        return self.hidden // self.heads

    @property
    def groups(self):
        """Query heads per key/value head (repeat_kv's n_rep)."""
        return self.heads // self.kv_heads


# Sizes without the sequence and batch, which a run chooses.
PRESETS = {
    "llama3-8b": dict(layers=32, hidden=4096, heads=32, kv_heads=8, ffn=14336, vocab=128256),
}
SIZE_FLAGS = ("layers", "hidden", "heads", "kv_heads", "ffn", "seq", "vocab", "batch")


def state_dict_layout(size):
    """(name, shape) of every parameter, in torch's state-dict order (all float32)."""
    h, kv, f = size.hidden, size.kv_heads * size.head_dim, size.ffn
    layout = [("model.embed_tokens.weight", [size.vocab, h])]
    for i in range(size.layers):
        p = f"model.layers.{i}"
        layout += [(f"{p}.self_attn.q_proj.weight", [h, h]),
                   (f"{p}.self_attn.k_proj.weight", [kv, h]),
                   (f"{p}.self_attn.v_proj.weight", [kv, h]),
                   (f"{p}.self_attn.o_proj.weight", [h, h]),
                   (f"{p}.mlp.gate_proj.weight", [f, h]),
                   (f"{p}.mlp.down_proj.weight", [h, f]),
                   (f"{p}.mlp.up_proj.weight", [f, h]),
                   (f"{p}.input_layernorm.weight", [h]),
                   (f"{p}.post_attention_layernorm.weight", [h])]
    return layout + [("model.norm.weight", [h]), ("lm_head.weight", [size.vocab, h])]


def linear(b, scope, x, weight):
    """A bias-free nn.Linear: MatMul(x, Transpose(weight))."""
    return b.node(scope, "MatMul", [x, b.node(scope, "Transpose", [weight], perm=[1, 0])])


def rms_norm(b, scope, x, weight):
    """HF's LlamaRMSNorm; returns (its input cast to float32, which the residual reads, its output)."""
    x = b.node(scope, "Cast", [x], to=TensorProto.FLOAT)
    var = b.node(scope, "ReduceMean", [b.node(scope, "Pow", [x, b.constant(scope, 2.0, np.float32)])],
                 axes=[-1], keepdims=1)
    std = b.node(scope, "Sqrt", [b.node(scope, "Add", [var, b.constant(scope, RMS_NORM_EPS, np.float32)])])
    y = b.node(scope, "Mul", [x, b.node(scope, "Div", [b.constant(scope, 1.0, np.float32), std])])
    y = b.node(scope, "Cast", [y], to=TensorProto.FLOAT)
    return x, b.node(scope, "Mul", [weight, y])


def heads_shape(b, scope, size, heads):
    """The shape argument of x.view(b, s, heads, head_dim)."""
    return shape_tensor(b, scope, [b.constant(scope, v, np.int64)
                                   for v in (size.batch, size.seq, heads, size.head_dim)])


def split_heads(b, scope, x, shape):
    """x.view(shape).transpose(1, 2)."""
    return b.node(scope, "Transpose", [b.node(scope, "Reshape", [x, shape], allowzero=0)], perm=[0, 2, 1, 3])


def slice_last(b, scope, x, start, end):
    """x[..., start:end] on a rank-4 tensor: one Slice on axis 3."""
    consts = [b.constant(scope, [v], np.int64) for v in (start, end, 3, 1)]
    return b.node(scope, "Slice", [x] + consts)


def rotate(b, scope, x, cos, sin, head_dim):
    """(x * cos) + (rotate_half(x) * sin)."""
    x_cos = b.node(scope, "Mul", [x, cos])
    half = head_dim // 2
    x1, x2 = slice_last(b, scope, x, 0, half), slice_last(b, scope, x, half, INT64_MAX)
    rotated = b.node(scope, "Concat", [b.node(scope, "Neg", [x2]), x1], axis=-1)
    return b.node(scope, "Add", [x_cos, b.node(scope, "Mul", [rotated, sin])])


def expand(b, scope, x, dims):
    """x.expand(dims) as torch writes it: the shape through Reshape(-1), and -1 entries taken from x."""
    shape = b.node(scope, "Reshape", [shape_tensor(b, scope, dims), b.constant(scope, [-1], np.int64)],
                   allowzero=0)
    ones = b.node(scope, "ConstantOfShape", [b.node(scope, "Shape", [shape])],
                  value=numpy_helper.from_array(np.array([1], dtype=np.int64)))
    minus_ones = b.node(scope, "Mul", [ones, b.constant(scope, -1, np.int64)])
    keep = b.node(scope, "Equal", [shape, minus_ones])
    return b.node(scope, "Expand", [x, b.node(scope, "Where", [keep, ones, shape])])


def repeat_kv(b, scope, x, size):
    """x[:, :, None].expand(b, kv, n_rep, s, d).reshape(b, kv * n_rep, s, d); x itself when n_rep is 1."""
    if size.groups == 1:
        return x
    batch, kv, seq, head_dim = (b.constant(scope, v, np.int64)
                                for v in (size.batch, size.kv_heads, size.seq, size.head_dim))
    x = b.node(scope, "Unsqueeze", [x, b.constant(scope, [2], np.int64)])
    x = expand(b, scope, x, [batch, kv, b.pooled_int(scope, size.groups), seq, head_dim])
    heads = b.constant(scope, size.heads, np.int64)
    return b.node(scope, "Reshape", [x, shape_tensor(b, scope, [batch, heads, seq, head_dim])], allowzero=0)


def attention(b, size, scope, x, prefix, positions, tables):
    q = linear(b, f"{scope}/q_proj", x, f"{prefix}.q_proj.weight")
    k = linear(b, f"{scope}/k_proj", x, f"{prefix}.k_proj.weight")
    v = linear(b, f"{scope}/v_proj", x, f"{prefix}.v_proj.weight")
    # torch writes q's shape and view, then k's and v's shapes; but all three shapes first when k
    # and v have as many heads as q
    q_shape = heads_shape(b, scope, size, size.heads)
    if size.groups > 1:
        q = split_heads(b, scope, q, q_shape)
    k_shape, v_shape = (heads_shape(b, scope, size, size.kv_heads) for _ in "kv")
    if size.groups == 1:
        q = split_heads(b, scope, q, q_shape)
    k, v = split_heads(b, scope, k, k_shape), split_heads(b, scope, v, v_shape)

    # cos[position_ids].unsqueeze(1), sin likewise: the tables are this layer's Constants
    cos, sin = (b.node(scope, "Constant", [], value=t) for t in tables)
    cos, sin = (b.node(scope, "Unsqueeze", [b.node(scope, "Gather", [t, positions], axis=0),
                                            b.constant(scope, [1], np.int64)]) for t in (cos, sin))
    q = rotate(b, scope, q, cos, sin, size.head_dim)
    k = rotate(b, scope, k, cos, sin, size.head_dim)
    k, v = repeat_kv(b, scope, k, size), repeat_kv(b, scope, v, size)

    scores = b.node(scope, "MatMul", [q, b.node(scope, "Transpose", [k], perm=[0, 1, 3, 2])])
    scores = b.node(scope, "Div", [scores, b.constant(scope, math.sqrt(size.head_dim), np.float32)])
    # masked_fill(~torch.ones(s, s, dtype=torch.bool).tril(), finfo.min); the ones from their shape
    ones = b.node(scope, "ConstantOfShape", [b.constant(scope, [size.seq, size.seq], np.int64)],
                  value=numpy_helper.from_array(np.array([True])))
    visible = b.node(scope, "Trilu", [ones, b.constant(scope, 0, np.int64)], upper=0)
    hidden = b.node(scope, "Cast", [b.node(scope, "Not", [visible])], to=TensorProto.BOOL)
    scores = b.node(scope, "Where", [hidden, b.constant(scope, np.finfo(np.float32).min, np.float32), scores])
    probs = b.node(scope, "Softmax", [scores], axis=-1)
    probs = b.node(scope, "Cast", [b.node(scope, "Cast", [probs], to=TensorProto.FLOAT)], to=TensorProto.FLOAT)

    y = b.node(scope, "Transpose", [b.node(scope, "MatMul", [probs, v])], perm=[0, 2, 1, 3])
    merged = shape_tensor(b, scope, [b.constant(scope, val, np.int64) for val in (size.batch, size.seq, size.hidden)])
    y = b.node(scope, "Reshape", [y, merged], allowzero=0)
    return linear(b, f"{scope}/o_proj", y, f"{prefix}.o_proj.weight")


def mlp(b, scope, x, prefix):
    """down_proj(silu(gate_proj(x)) * up_proj(x)), nn.SiLU as Sigmoid and Mul."""
    gate = linear(b, f"{scope}/gate_proj", x, f"{prefix}.gate_proj.weight")
    act = b.node(f"{scope}/act_fn", "Mul", [gate, b.node(f"{scope}/act_fn", "Sigmoid", [gate])])
    up = linear(b, f"{scope}/up_proj", x, f"{prefix}.up_proj.weight")
    return linear(b, f"{scope}/down_proj", b.node(scope, "Mul", [act, up]), f"{prefix}.down_proj.weight")


def block(b, size, i, x, positions, tables):
    scope, prefix = f"/model/layers.{i}", f"model.layers.{i}"
    residual, y = rms_norm(b, f"{scope}/input_layernorm", x, f"{prefix}.input_layernorm.weight")
    y = attention(b, size, f"{scope}/self_attn", y, f"{prefix}.self_attn", positions, tables)
    x = b.node(scope, "Add", [residual, y])
    residual, y = rms_norm(b, f"{scope}/post_attention_layernorm", x, f"{prefix}.post_attention_layernorm.weight")
    return b.node(scope, "Add", [residual, mlp(b, f"{scope}/mlp", y, f"{prefix}.mlp")])


def build_model(size, weights_location, doc=""):
    """The ModelProto of the Llama of `size`, its parameters and rotary tables declared in `weights_location`."""
    b = GraphBuilder()
    for name, shape in state_dict_layout(size):
        b.external_initializer(name, TensorProto.FLOAT, shape, weights_location)
    tables = [b.external_tensor("", TensorProto.FLOAT, [size.seq, size.head_dim], weights_location)
              for _ in ("cos", "sin")]
    # position_ids.view(-1, seq_length).long()
    view = shape_tensor(b, "/model", [b.constant("/model", v, np.int64) for v in (-1, size.seq)])
    positions = b.node("/model", "Reshape", ["position_ids", view], allowzero=0)
    positions = b.node("/model", "Cast", [positions], to=TensorProto.INT64)
    x = b.node("/model/embed_tokens", "Gather", ["model.embed_tokens.weight", "input_ids"])
    for i in range(size.layers):
        x = block(b, size, i, x, positions, tables)
    _, x = rms_norm(b, "/model/norm", x, "model.norm.weight")
    logits = linear(b, "/lm_head", x, "lm_head.weight")
    b.node("", "Cast", [logits], outputs=["logits"], to=TensorProto.FLOAT)

    tokens = [size.batch, size.seq]
    graph = helper.make_graph(
        b.nodes, "torch_jit",
        inputs=[helper.make_tensor_value_info(name, TensorProto.INT64, tokens)
                for name in ("input_ids", "position_ids")],
        outputs=[helper.make_tensor_value_info("logits", TensorProto.FLOAT, tokens + [size.vocab])],
        initializer=b.initializers)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)],
                              producer_name="sp gen_llama_graph.py", doc_string=doc)
    model.ir_version = IR_VERSION
    return model


def write_graph(size, path, label):
    """Write the graph of `size` to `path`; returns its node count."""
    location = os.path.splitext(os.path.basename(path))[0] + ".weights.bin"
    doc = (f"Llama {label}: L={size.layers} h={size.hidden} a={size.heads} kv={size.kv_heads} "
           f"F={size.ffn} s={size.seq} v={size.vocab} b={size.batch}; weight-free, {location} is not written")
    model = build_model(size, location, doc)
    save_model(model, path)
    return len(model.graph.node)


def check_size(size):
    """None, or why `size` cannot be written."""
    if size.hidden % size.heads:
        return f"hidden {size.hidden} is not divisible by heads {size.heads}"
    if size.heads % size.kv_heads:
        return f"kv-heads {size.kv_heads} does not divide heads {size.heads}"
    if size.head_dim % 2:
        return f"rotary embeddings need an even head size, got {size.head_dim}"
    return None


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("-o", "--output", required=True, help="the .onnx file to write")
    p.add_argument("--preset", choices=sorted(PRESETS),
                   help="sizes of a published model (llama3-8b: L 32, h 4096, 32 heads, 8 kv heads, "
                        "F 14336, v 128256); give --seq, and --batch unless 1")
    for flag, what in (("layers", "layers L"), ("hidden", "hidden size h"), ("heads", "query heads a"),
                       ("kv-heads", "key/value heads (divides --heads)"), ("ffn", "MLP width F"),
                       ("seq", "sequence length s"), ("vocab", "vocabulary size v"), ("batch", "micro-batch b")):
        p.add_argument(f"--{flag}", type=int, help=what)
    args = p.parse_args(argv)
    values = dict(PRESETS.get(args.preset, {}), batch=1) if args.preset else {}
    values.update({f: getattr(args, f) for f in SIZE_FLAGS if getattr(args, f) is not None})
    missing = [f"--{f.replace('_', '-')}" for f in SIZE_FLAGS if f not in values]
    if missing:
        p.error(f"give {' '.join(missing)} (or --preset with its sizes)")
    if any(v < 1 for v in values.values()):
        p.error("every size must be positive")
    return args, LlamaSize(**values)


def main(argv=None):
    args, size = parse_args(argv)
    problem = check_size(size)
    if problem:
        sys.exit(f"error: {problem}")
    start = time.perf_counter()
    nodes = write_graph(size, args.output, args.preset or "custom")
    print(f"{args.output}: {args.preset or 'custom'}, {nodes} nodes, "
          f"{os.path.getsize(args.output) / 1024:.0f} KiB, {time.perf_counter() - start:.2f} s")


if __name__ == "__main__":
    main()
