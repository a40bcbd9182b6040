#!/usr/bin/python3
"""Test that gen_llama_graph.py writes the same graph as torch's export of llama.py.

Exports small configs with `export_family.py --family llama --mask tril`
(opset 17, the other switches at their defaults, static shapes; grouped
keys and values, and as many as the queries) and generates the same configs
with gen_llama_graph.py, then compares them node by node as
check_paper_graph_structure.py does for the GPT (op type, attributes, every
input by role; Constants by value; initializers, graph inputs and outputs,
opset). Before comparing, torch's graph gets the generator's two documented
substitutions, so that they are the only differences allowed:
  - each rotary table (a float32 Constant [s, head_dim]) keeps its type and
    shape but not its data (the generator declares it as external data);
  - each [s, s] bool Constant of ones becomes ConstantOfShape of its shape.
Exits 1 with the first difference if they differ.

    /usr/bin/python3 models/check_llama_graph_structure.py

Needs torch and onnx.
"""

import argparse
import os
import sys
import tempfile

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import export_family  # noqa: E402
import gen_llama_graph  # noqa: E402
from check_paper_graph_structure import report  # noqa: E402

SMALL = [gen_llama_graph.LlamaSize(layers=2, hidden=96, heads=6, kv_heads=2, ffn=256, seq=32, vocab=128, batch=2),
         gen_llama_graph.LlamaSize(layers=2, hidden=64, heads=4, kv_heads=4, ffn=176, seq=16, vocab=64, batch=1)]


def torch_export(size, directory):
    path = os.path.join(directory, f"torch-kv{size.kv_heads}.onnx")
    export_family.main(["--family", "llama", "--mask", "tril", "-o", path,
                        "--opset", str(gen_llama_graph.OPSET), "--layers", str(size.layers),
                        "--hidden", str(size.hidden), "--heads", str(size.heads),
                        "--kv-heads", str(size.kv_heads), "--ffn", str(size.ffn), "--seq", str(size.seq),
                        "--vocab", str(size.vocab), "--batch", str(size.batch)])
    return onnx.load(path)


def with_substitutions(model):
    """torch's graph with the generator's substitutions (the module docstring) applied."""
    nodes = []
    for node in model.graph.node:
        tensor = node.attribute[0].t if node.op_type == "Constant" else None
        if tensor is not None and len(tensor.dims) == 2:
            if tensor.data_type == TensorProto.FLOAT:
                declared = TensorProto(data_type=tensor.data_type, dims=tensor.dims,
                                       data_location=TensorProto.EXTERNAL)
                node = helper.make_node("Constant", [], list(node.output), name=node.name, value=declared)
            elif tensor.data_type == TensorProto.BOOL and numpy_helper.to_array(tensor).all():
                shape = node.output[0] + "_shape"
                nodes.append(helper.make_node("Constant", [], [shape], value=numpy_helper.from_array(
                    np.array(tensor.dims, dtype=np.int64))))
                node = helper.make_node("ConstantOfShape", [shape], list(node.output), name=node.name,
                                        value=numpy_helper.from_array(np.array([True])))
        nodes.append(node)
    del model.graph.node[:]
    model.graph.node.extend(nodes)
    return model


def check(size, directory):
    """Compare one config; returns True if the graphs match."""
    label = (f"L{size.layers} h{size.hidden} a{size.heads} kv{size.kv_heads} F{size.ffn} s{size.seq} "
             f"v{size.vocab} b{size.batch}")
    return report(label, with_substitutions(torch_export(size, directory)),
                  gen_llama_graph.build_model(size, "weights.bin"))


def main(argv=None):
    argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter).parse_args(argv)
    with tempfile.TemporaryDirectory() as directory:
        results = [check(size, directory) for size in SMALL]
    if not all(results):
        sys.exit("gen_llama_graph.py no longer writes what torch writes for llama.py: update one or the other")


if __name__ == "__main__":
    main()
