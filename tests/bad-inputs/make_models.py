#!/usr/bin/python3
"""Writes the bad ONNX models of the bad-input catalogue into a folder.

  make_models.py OUT_DIR --models MODELS_DIR

Needs only numpy and onnx (no torch). Each file is small and is made at test
time, so no model binary is committed. MODELS_DIR is the repository's
models/ folder (gpt-tiny.onnx to cut short, gen_paper_graph.py for
GPT-shaped graphs of chosen sizes).

  empty.onnx                0 bytes
  not-a-model.onnx          a line of text
  truncated.onnx            the first 200000 bytes of gpt-tiny.onnx
  opset11.onnx              a model at an opset below 13
  opset18.onnx              a model at an opset above 17
  no-opset.onnx             no default-domain opset import
  unsupported-op.onnx       a Celu node
  foreign-domain.onnx       a com.microsoft FusedGemm node
  undefined-input.onnx      a node reading a name nothing defines
  not-sorted.onnx           a node reading a value a later node defines
  defined-twice.onnx        two nodes writing the same value
  short-initializer.onnx    an f32[4, 4] initializer with 10 bytes of data
  complex-initializer.onnx  a complex64 initializer
  string-input.onnx         a graph input of strings
  no-outputs.onnx           a graph without outputs
  escape/model.onnx         external data at '../secret.bin'
  absolute-external.onnx    external data at an absolute path
  mlp.onnx                  a valid model that is not a Transformer
  symbolic-batch.onnx       gpt-tiny with its batch dimension named 'batch'
  gpt-seq6.onnx             GPT, 2 layers, 4 heads, sequence length 6
                            (weight-free: its external data is never written)
  gpt-1layer.onnx           GPT, 1 layer (weight-free)
"""
import argparse
import os
import subprocess
import sys

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper


def save(model, out, name):
    path = os.path.join(out, name)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    onnx.save(model, path)


def small(nodes, inits=None, opset=17, x_type=TensorProto.FLOAT, domains=()):
    """y = nodes(x) over a [2, 4] input and a ones [4, 4] weight 'w'."""
    w = numpy_helper.from_array(np.ones((4, 4), np.float32), "w")
    graph = helper.make_graph(
        nodes, "g", [helper.make_tensor_value_info("x", x_type, [2, 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 4])],
        [w] if inits is None else inits)
    opsets = [helper.make_opsetid("", opset)]
    opsets += [helper.make_opsetid(d, 1) for d in domains]
    return helper.make_model(graph, opset_imports=opsets)


def matmul(out="y", b="w"):
    return helper.make_node("MatMul", ["x", b], [out], name="fc")


def external(model, location):
    w = model.graph.initializer[0]
    w.ClearField("raw_data")
    w.data_location = TensorProto.EXTERNAL
    w.external_data.add(key="location", value=location)
    w.external_data.add(key="offset", value="0")
    w.external_data.add(key="length", value="64")
    return model


def main():
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("out")
    ap.add_argument("--models", required=True, help="the repository's models/ folder")
    args = ap.parse_args()
    out = args.out
    os.makedirs(out, exist_ok=True)
    tiny = os.path.join(args.models, "tiny", "gpt-tiny.onnx")

    open(os.path.join(out, "empty.onnx"), "wb").close()
    with open(os.path.join(out, "not-a-model.onnx"), "w") as f:
        f.write("this is not a model\n")
    with open(tiny, "rb") as f:
        head = f.read(200000)
    with open(os.path.join(out, "truncated.onnx"), "wb") as f:
        f.write(head)

    save(small([matmul()], opset=11), out, "opset11.onnx")
    save(small([matmul()], opset=18), out, "opset18.onnx")
    m = small([matmul()])
    m.ClearField("opset_import")
    save(m, out, "no-opset.onnx")
    save(small([matmul("h"), helper.make_node("Celu", ["h"], ["y"], name="act/Celu")]),
         out, "unsupported-op.onnx")
    save(small([helper.make_node("FusedGemm", ["x", "w"], ["y"], name="fused",
                                 domain="com.microsoft")], domains=["com.microsoft"]),
         out, "foreign-domain.onnx")
    save(small([matmul(b="nosuch")]), out, "undefined-input.onnx")
    save(small([helper.make_node("MatMul", ["x", "z"], ["h"], name="first"),
                helper.make_node("Relu", ["h"], ["z"], name="second"),
                helper.make_node("Identity", ["h"], ["y"], name="third")]),
         out, "not-sorted.onnx")
    save(small([matmul("h"), helper.make_node("Relu", ["h"], ["h"], name="again"),
                helper.make_node("Identity", ["h"], ["y"], name="copy")]),
         out, "defined-twice.onnx")
    w = numpy_helper.from_array(np.ones((4, 4), np.float32), "w")
    w.raw_data = w.raw_data[:10]
    save(small([matmul()], inits=[w]), out, "short-initializer.onnx")
    w = helper.make_tensor("w", TensorProto.COMPLEX64, [4, 4],
                           np.zeros(32, np.float32).tobytes(), raw=True)
    save(small([matmul()], inits=[w]), out, "complex-initializer.onnx")
    save(small([matmul()], x_type=TensorProto.STRING), out, "string-input.onnx")
    m = small([matmul()])
    m.graph.ClearField("output")
    save(m, out, "no-outputs.onnx")
    save(external(small([matmul()]), "../secret.bin"), out, "escape/model.onnx")
    save(external(small([matmul()]), "/etc/hostname"), out, "absolute-external.onnx")
    save(small([matmul("h"), helper.make_node("Erf", ["h"], ["y"], name="act")]),
         out, "mlp.onnx")

    m = onnx.load(tiny)
    dim = m.graph.input[0].type.tensor_type.shape.dim[0]
    dim.ClearField("dim_value")
    dim.dim_param = "batch"
    save(m, out, "symbolic-batch.onnx")

    gen = os.path.join(args.models, "gen_paper_graph.py")
    for name, layers, seq in [("gpt-seq6.onnx", 2, 6), ("gpt-1layer.onnx", 1, 8)]:
        subprocess.run([sys.executable, gen, "--layers", str(layers), "--hidden", "32",
                        "--heads", "4", "--seq", str(seq), "--vocab", "64", "--batch", "2",
                        "-o", os.path.join(out, name)],
                       check=True, stdout=subprocess.DEVNULL)


if __name__ == "__main__":
    main()
