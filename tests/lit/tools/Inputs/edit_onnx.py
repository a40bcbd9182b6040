#!/usr/bin/python3
"""Edits an ONNX model the way other exporters differ from ours, for the input-role tests.

    edit_onnx.py IN.onnx OUT.onnx rename OLD NEW      rename a graph input (and every use)
    edit_onnx.py IN.onnx OUT.onnx extra-input NAME    add an i64 [batch, seq] input that an
                                                      Add of the token ids uses (nothing sp
                                                      can feed)
    edit_onnx.py IN.onnx OUT.onnx unused-input NAME   add an f32 [1] input nothing uses
"""
import sys

import onnx
from onnx import TensorProto, helper


def main(argv):
    src, dst, verb, *args = argv
    model = onnx.load(src)
    g = model.graph
    if verb == "rename":
        old, new = args
        for i in g.input:
            if i.name == old:
                i.name = new
        for n in g.node:
            n.input[:] = [new if x == old else x for x in n.input]
    elif verb in ("extra-input", "unused-input"):
        (name,) = args
        ids = g.input[0]
        if verb == "unused-input":
            g.input.append(helper.make_tensor_value_info(name, TensorProto.FLOAT, [1]))
        else:
            dims = [d.dim_value for d in ids.type.tensor_type.shape.dim]
            g.input.append(helper.make_tensor_value_info(name, TensorProto.INT64, dims))
            shifted = ids.name + "_shifted"
            for n in g.node:
                n.input[:] = [shifted if x == ids.name else x for x in n.input]
            g.node.insert(0, helper.make_node("Add", [ids.name, name], [shifted], name="shift_ids"))
    else:
        sys.exit(f"unknown edit {verb!r}")
    onnx.save(model, dst)


if __name__ == "__main__":
    main(sys.argv[1:])
