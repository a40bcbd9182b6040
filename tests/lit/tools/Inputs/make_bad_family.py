#!/usr/bin/python3
"""Writes variants of a BERT export (models/export_family.py --family bert) that sp must refuse.

  make_bad_family.py IN.onnx OUT_DIR

  mask4d.onnx  the attention_mask input is already [b, 1, 1, s] (the two Unsqueezes removed): a
               mask shape sp does not take (it takes [batch, seq])
  relu.onnx    the MLP's GELU has its Erf replaced by a Relu: a form no activation has
"""
import os
import sys

import onnx
from onnx import helper


def mask4d(model):
    g = model.graph
    mask = next(i for i in g.input if i.name == "attention_mask")
    dims = mask.type.tensor_type.shape.dim
    b, s = dims[0].dim_value, dims[1].dim_value
    g.input.remove(mask)
    g.input.append(helper.make_tensor_value_info("attention_mask", onnx.TensorProto.INT64, [b, 1, 1, s]))
    # Unsqueeze(attention_mask) -> Unsqueeze -> Cast: read the input directly at the Cast.
    first = next(n for n in g.node if n.op_type == "Unsqueeze" and n.input[0] == "attention_mask")
    second = next(n for n in g.node if n.op_type == "Unsqueeze" and n.input[0] == first.output[0])
    for n in g.node:
        for k, name in enumerate(n.input):
            if name == second.output[0]:
                n.input[k] = "attention_mask"
    g.node.remove(first)
    g.node.remove(second)
    return model


def relu(model):
    erf = next(n for n in model.graph.node if n.op_type == "Erf")
    erf.op_type = "Relu"
    return model


def main():
    src, out = sys.argv[1], sys.argv[2]
    for name, edit in (("mask4d", mask4d), ("relu", relu)):
        m = edit(onnx.load(src))
        onnx.save(m, os.path.join(out, name + ".onnx"))


if __name__ == "__main__":
    main()
