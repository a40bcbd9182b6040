"""Checks sp-compile --export-graphs DIR against the plan PLAN it exported.

    check_graphs.py DIR PLAN

For every program of the plan (program.json, or program-K.json per pipeline
rank) DIR holds the matching .onnx file, and:
  - onnx.checker.check_model(full_check=True) accepts it (ONNX's own checker
    and strict shape inference over the ONNX-domain nodes);
  - node K is instruction K: the same op (ONNX's Add/Mul/Softmax/Relu, or
    the op's name in domain "sp"), and its inputs and outputs are the
    instruction's buffers (each value's doc_string names its buffer=ID), in
    the program's order; in-place writes (adamw, accumulate, gather_param)
    are extra outputs, new versions of the buffers they update;
  - each node's doc_string has layer= (when the instruction has a layer),
    role=, phase= and stage=, each equal to the instruction's, and each
    sp-domain node carries them as sp.* attributes too;
  - each value's doc_string has the buffer's kind and sharding;
  - the graph is in static single assignment form (the checker's rule too).
Prints one line per file: "FILE: N nodes (ops...) OK", then the domains and
phases seen over all files, and the collectives; exits 1 on the first
mismatch with what differs.
"""

import json
import os
import sys

import onnx

PHASES = {"fwd": "forward", "bwd": "backward", "recompute": "recompute", "opt": "optimizer"}
ONNX_OPS = {"add": "Add", "mul": "Mul", "softmax": "Softmax", "relu": "Relu"}
IN_PLACE = {"adamw": (0, 2, 3), "accumulate": (0,), "gather_param": None}
COLLECTIVES = {"all_reduce", "all_gather", "reduce_scatter", "send", "recv",
               "pipe_all_reduce", "pipe_broadcast", "gather_param"}


def fail(msg):
    print("FAIL " + msg)
    sys.exit(1)


def meta(doc):
    return dict(kv.split("=", 1) for kv in doc.split())


def main():
    out_dir, plan = sys.argv[1], sys.argv[2]
    # The plan holds program.json, and program-K.json for pipeline ranks
    # K >= 1; the export names every pipeline rank's file program-K.onnx.
    stages = 1 + sum(f.startswith("program-") and f.endswith(".json") for f in os.listdir(plan))
    files = sorted(os.listdir(out_dir))
    want = ["program.onnx"] if stages == 1 else [f"program-{k}.onnx" for k in range(stages)]
    if files != want:
        fail(f"{out_dir} holds {files}, want {want}")
    domains, phases, collectives = set(), set(), set()
    for stage in range(stages):
        prog = json.load(open(os.path.join(plan, f"program-{stage}.json" if stage else "program.json")))
        path = os.path.join(out_dir, want[stage])
        model = onnx.load(path)
        try:
            onnx.checker.check_model(model, full_check=True)
        except Exception as e:  # noqa: BLE001 (any checker error fails)
            fail(f"{path}: onnx.checker: {e}")
        g = model.graph
        values = {}
        for v in list(g.input) + list(g.value_info) + list(g.output):
            m = meta(v.doc_string.split("; ")[-1])
            if "buffer" not in m or "kind" not in m or "sharding" not in m:
                fail(f"{path}: value {v.name} lacks buffer/kind/sharding: {v.doc_string!r}")
            buf = prog["buffers"][int(m["buffer"])]
            if m["kind"] != buf["kind"]:
                fail(f"{path}: value {v.name} is kind {m['kind']}, buffer says {buf['kind']}")
            dims = [d.dim_value for d in v.type.tensor_type.shape.dim]
            if dims != buf["shape"]:
                fail(f"{path}: value {v.name} has shape {dims}, buffer {buf['shape']}")
            values[v.name] = int(m["buffer"])
        instrs = prog["instructions"]
        if len(g.node) != len(instrs):
            fail(f"{path}: {len(g.node)} nodes for {len(instrs)} instructions")
        produced = set()
        ops = {}
        for k, (node, ins) in enumerate(zip(g.node, instrs)):
            op = ins["op"]
            if node.domain == "":
                if ONNX_OPS.get(op) != node.op_type:
                    fail(f"{path}: node {k} is ONNX {node.op_type}, instruction {op}")
            elif node.domain != "sp" or node.op_type != op:
                fail(f"{path}: node {k} is {node.domain}:{node.op_type}, instruction {op}")
            domains.add(node.domain or "onnx")
            if [values.get(i) for i in node.input] != ins["in"]:
                fail(f"{path}: node {k} ({op}) reads {[values.get(i) for i in node.input]}, "
                     f"instruction {ins['in']}")
            extra = []
            if op in IN_PLACE and not ins["out"]:
                idx = IN_PLACE[op]
                extra = [ins["in"][i] for i in (idx if idx is not None else range(len(ins["in"])))]
            if [values.get(o) for o in node.output] != ins["out"] + extra:
                fail(f"{path}: node {k} ({op}) writes {[values.get(o) for o in node.output]}, "
                     f"instruction {ins['out']} + in place {extra}")
            for o in node.output:
                if o in produced:
                    fail(f"{path}: {o} is produced twice")
                produced.add(o)
            m = meta(node.doc_string)
            expect = {"role": ins.get("role", ""), "phase": PHASES[ins["phase"]], "stage": str(stage)}
            if "layer" in ins and ins["layer"] >= 0:
                expect["layer"] = str(ins["layer"])
            for key, val in expect.items():
                if m.get(key) != val:
                    fail(f"{path}: node {k} ({op}) has {key}={m.get(key)!r}, want {val!r}")
                if node.domain == "sp":
                    attr = {a.name: a.s.decode() for a in node.attribute if a.name.startswith("sp.")}
                    if attr.get("sp." + key) != val:
                        fail(f"{path}: node {k} ({op}) attribute sp.{key} is {attr.get('sp.' + key)!r}")
            phases.add(m["phase"])
            ops[op] = ops.get(op, 0) + 1
            if op in COLLECTIVES:
                collectives.add(op)
        if "templates" in prog and not any(n.doc_string.count("template=") for n in g.node):
            fail(f"{path}: a compact program's nodes name no template")
        print(f"{os.path.basename(path)}: {len(g.node)} nodes, {len(g.input)} inputs, "
              f"{len(g.output)} outputs OK")
    print("domains: " + " ".join(sorted(domains)))
    print("phases: " + " ".join(p for p in ("forward", "backward", "recompute", "optimizer") if p in phases))
    print("collectives: " + (" ".join(sorted(collectives)) or "none"))


if __name__ == "__main__":
    main()
