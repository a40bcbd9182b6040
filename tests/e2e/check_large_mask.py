#!/usr/bin/python3
"""End-to-end test: a causal mask buffer too large to fold is checked by its data.

torch's export of GPT-2 slices each layer's "bias" buffer ([1, 1, n, n] bool, the lower
triangle) and tests it for zero before the Where that masks the scores. sp-compile folds
constants up to 2^20 elements (ir/Fold.h); at s = 2048 the buffer has 4M, so it is not folded,
and the canonicalizer must read the sliced block's data itself (passes/Canonicalize.cpp,
isTrilBufferTest). Three models, written by models/gen_paper_graph.py (one layer, h 64, 4 heads,
s 2048, vocabulary 256, with weights):

  tril        the buffer as torch writes it: sp-compile accepts the model (a causal mask)
  not-tril    one key above the diagonal made visible (row 0 sees key 5): sp-compile refuses
              it, naming the attention core, instead of training a model that sees the future
  weight-free the same graph without its weights file: accepted by its form (a weight-free
              graph compiles for the reports only; sp-run refuses to train it)

Prints one PASS/FAIL line per check and exits 1 if any failed.

    /usr/bin/python3 tests/e2e/check_large_mask.py --sp-compile build/bin/sp-compile --workdir /tmp/m
"""

import argparse
import os
import shutil
import subprocess
import sys

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(REPO, "models"))
import gen_paper_graph as gen  # noqa: E402
import onnx  # noqa: E402

SEQ = 2048


def write(path, weights):
    size = gen.GPTSize(layers=1, hidden=64, heads=4, seq=SEQ, vocab=256, batch=1, dropout=0.1)
    gen.write_graph(size, path, "large mask", weights=weights, seed=1)


def mask_offset(path):
    """The offset of the (only) bool [.., SEQ, SEQ] initializer in the weights file."""
    model = onnx.load(path, load_external_data=False)
    for t in model.graph.initializer:
        if t.data_type == onnx.TensorProto.BOOL and list(t.dims[-2:]) == [SEQ, SEQ]:
            info = {e.key: e.value for e in t.external_data}
            return os.path.join(os.path.dirname(path), info["location"]), int(info["offset"])
    raise SystemExit(f"error: {path} has no [{SEQ}, {SEQ}] bool buffer")


def compile_(sp_compile, path, out):
    return subprocess.run([sp_compile, path, "-o", out, "--quiet"], capture_output=True, text=True)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sp-compile", required=True)
    ap.add_argument("--workdir", required=True)
    args = ap.parse_args()
    shutil.rmtree(args.workdir, ignore_errors=True)
    os.makedirs(args.workdir)
    failed = 0

    def check(name, ok, detail):
        nonlocal failed
        print(f"{'PASS' if ok else 'FAIL'} {name}: {detail}")
        failed += not ok

    tril = os.path.join(args.workdir, "tril.onnx")
    write(tril, weights=True)
    r = compile_(args.sp_compile, tril, os.path.join(args.workdir, "tril.plan"))
    check("tril", r.returncode == 0, f"exit {r.returncode} {r.stderr.strip()}")

    bad = os.path.join(args.workdir, "not-tril.onnx")
    write(bad, weights=True)
    data, offset = mask_offset(bad)
    with open(data, "r+b") as f:  # row 0, key 5: made visible
        f.seek(offset + 5)
        f.write(b"\x01")
    r = compile_(args.sp_compile, bad, os.path.join(args.workdir, "not-tril.plan"))
    check("not-tril", r.returncode == 1 and "attention core" in r.stderr
          and not os.path.exists(os.path.join(args.workdir, "not-tril.plan")),
          f"exit {r.returncode} {r.stderr.strip()}")

    free = os.path.join(args.workdir, "free.onnx")
    write(free, weights=False)
    r = compile_(args.sp_compile, free, os.path.join(args.workdir, "free.plan"))
    check("weight-free", r.returncode == 0, f"exit {r.returncode} {r.stderr.strip()}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
