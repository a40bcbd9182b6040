#!/usr/bin/python3
"""Test that gen_paper_graph.py writes the same graph as torch's export of gpt.py.

Exports a small config with export_gpt.py (opset 17, default variants, static
shapes; tied and untied) and generates the same config with gen_paper_graph.py,
then compares them node by node: op type, attributes, and every input by role
(an initializer by name, the graph input, a constant by value, or output k of
the n-th non-Constant node). Constant nodes themselves are not compared one to
one, because torch pools equal Python ints across the graph by value. Also
compares the initializers (name, dtype, shape, order), the graph inputs and
outputs, and the opset. Exits 1 with the first difference if they differ.

    /usr/bin/python3 models/check_paper_graph_structure.py

Needs torch and onnx.
"""

import argparse
import dataclasses
import os
import sys
import tempfile

import onnx
from onnx import helper, numpy_helper

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import export_gpt  # noqa: E402
import gen_paper_graph  # noqa: E402

SMALL = gen_paper_graph.GPTSize(layers=2, hidden=64, heads=4, seq=32, vocab=128, batch=2)


def torch_export(size, directory):
    path = os.path.join(directory, f"torch-{'tied' if size.tied else 'untied'}.onnx")
    export_gpt.main(["-o", path, "--opset", str(gen_paper_graph.OPSET), "--layers", str(size.layers),
                     "--hidden", str(size.hidden), "--heads", str(size.heads), "--seq", str(size.seq),
                     "--vocab", str(size.vocab), "--batch", str(size.batch), "--dropout", str(size.dropout),
                     "--tied" if size.tied else "--untied"])
    return onnx.load(path)


def constant_value(node):
    """The Constant's value as text; a tensor in external data by its type and shape alone."""
    tensor = node.attribute[0].t
    if tensor.data_location == onnx.TensorProto.EXTERNAL:
        return f"{onnx.TensorProto.DataType.Name(tensor.data_type)}{list(tensor.dims)}=external"
    array = numpy_helper.to_array(tensor)
    return f"{array.dtype}{list(array.shape)}={array.tolist()}"


def canonical_nodes(graph):
    """The non-Constant nodes as strings (op type, attributes, inputs by role), and the outputs' producers."""
    initializers = {t.name for t in graph.initializer}
    graph_inputs = {i.name for i in graph.input}
    constants, producers, nodes = {}, {}, []
    for node in graph.node:
        if node.op_type == "Constant":
            constants[node.output[0]] = constant_value(node)
            continue
        inputs = []
        for name in node.input:
            if name in initializers or name in graph_inputs:
                inputs.append(name)
            elif name in constants:
                inputs.append(f"const {constants[name]}")
            else:
                inputs.append(producers[name])
        attrs = sorted(f" {a.name}={helper.get_attribute_value(a)!r}" for a in node.attribute)
        nodes.append((node.name, f"{node.op_type}({', '.join(inputs)}){''.join(attrs)} -> {len(node.output)} outputs"))
        for k, name in enumerate(node.output):
            producers[name] = f"node {len(nodes) - 1} ({node.op_type}) output {k}"
    outputs = [producers.get(o.name, o.name) for o in graph.output]
    return nodes, outputs


def value_infos(values):
    return [helper.printable_value_info(v) for v in values]


def initializer_decls(graph):
    return [(t.name, t.data_type, list(t.dims)) for t in graph.initializer]


def first_difference(expected, actual):
    """A message naming the first difference between the torch and generated graphs, or None."""
    if [(o.domain, o.version) for o in expected.opset_import] != [(o.domain, o.version) for o in actual.opset_import]:
        return f"opsets differ: torch {expected.opset_import} vs generated {actual.opset_import}"
    for what, get in (("graph inputs", lambda g: value_infos(g.input)),
                      ("graph outputs", lambda g: value_infos(g.output)),
                      ("initializers", initializer_decls)):
        e, a = get(expected.graph), get(actual.graph)
        if e != a:
            diff = next((i for i, (x, y) in enumerate(zip(e, a)) if x != y), min(len(e), len(a)))
            return (f"{what} differ at #{diff}: torch {e[diff] if diff < len(e) else '(none)'} "
                    f"vs generated {a[diff] if diff < len(a) else '(none)'}")
    (e_nodes, e_outputs), (a_nodes, a_outputs) = canonical_nodes(expected.graph), canonical_nodes(actual.graph)
    for i, ((e_name, e), (a_name, a)) in enumerate(zip(e_nodes, a_nodes)):
        if e != a:
            return f"node #{i} differs:\n  torch     {e_name}: {e}\n  generated {a_name}: {a}"
    if len(e_nodes) != len(a_nodes):
        return f"torch has {len(e_nodes)} non-Constant nodes, the generator {len(a_nodes)}"
    if e_outputs != a_outputs:
        return f"graph outputs come from different nodes: torch {e_outputs} vs generated {a_outputs}"
    return None


def report(label, expected, actual):
    """Shape-check the generated graph, compare it with torch's and print one line; True if they match."""
    onnx.shape_inference.infer_shapes(actual, check_type=True, strict_mode=True)  # the checker wants the weights
    difference = first_difference(expected, actual)
    counts = f"torch {len(expected.graph.node)} nodes, generated {len(actual.graph.node)}"
    print(f"{'FAIL' if difference else 'PASS'} {label}: {counts}" + (f"\n{difference}" if difference else ""))
    return difference is None


def check(size, directory):
    """Compare one config; returns True if the graphs match."""
    label = f"L{size.layers} h{size.hidden} a{size.heads} s{size.seq} v{size.vocab} b{size.batch} " \
            f"{'tied' if size.tied else 'untied'}"
    return report(label, torch_export(size, directory), gen_paper_graph.build_model(size, "weights.bin"))


def main(argv=None):
    argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter).parse_args(argv)
    with tempfile.TemporaryDirectory() as directory:
        results = [check(dataclasses.replace(SMALL, tied=tied), directory) for tied in (True, False)]
    if not all(results):
        sys.exit("gen_paper_graph.py no longer writes what torch writes for gpt.py: update one or the other")


if __name__ == "__main__":
    main()
