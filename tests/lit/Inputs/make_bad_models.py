#!/usr/bin/python3
"""Writes the bad-input fixtures of tests/lit/tools into a folder.

  make_bad_models.py OUT_DIR

  unsupported-op.onnx   a graph with an op sp does not support (Celu)
  mlp.onnx              a valid model that is not a Transformer
  escape/model.onnx     an initializer whose external data lies outside the model folder
  opset11.onnx          a model at an opset sp does not support
"""
import os
import sys

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper


def save(model, path):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    onnx.save(model, path)


def linear_model(nodes, extra_inits=(), opset=17):
    w = numpy_helper.from_array(np.ones((4, 4), np.float32), "w")
    graph = helper.make_graph(
        nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 4])], [w, *extra_inits])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])


def main():
    out = sys.argv[1]
    save(linear_model([helper.make_node("MatMul", ["x", "w"], ["h"], name="fc"),
                       helper.make_node("Celu", ["h"], ["y"], name="act/Celu")]),
         os.path.join(out, "unsupported-op.onnx"))
    save(linear_model([helper.make_node("MatMul", ["x", "w"], ["h"], name="fc"),
                       helper.make_node("Erf", ["h"], ["y"], name="act")]),
         os.path.join(out, "mlp.onnx"))
    save(linear_model([helper.make_node("MatMul", ["x", "w"], ["y"], name="fc")], opset=11),
         os.path.join(out, "opset11.onnx"))
    # External data pointing out of the model folder.
    escape = linear_model([helper.make_node("MatMul", ["x", "w"], ["y"], name="fc")])
    w = escape.graph.initializer[0]
    w.ClearField("raw_data")
    w.data_location = TensorProto.EXTERNAL
    w.external_data.add(key="location", value="../secret.bin")
    w.external_data.add(key="offset", value="0")
    w.external_data.add(key="length", value="64")
    save(escape, os.path.join(out, "escape", "model.onnx"))


if __name__ == "__main__":
    main()
