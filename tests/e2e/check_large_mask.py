#!/usr/bin/python3
"""End-to-end test: a causal mask buffer too large to fold is checked by its data.

GPT-style exports slice each layer's causal buffer ([1, 1, n, n] bool, the lower triangle) and
mask the scores with a Where: nanoGPT's `masked_fill(~bias[..], -inf)` tests the slice for zero,
HuggingFace's `torch.where(bias[..], scores, min)` keeps where it is set. sp-compile folds
constants up to 2^20 elements (ir/Fold.h); at n = 2048 (GPT-Neo's and GPT-J's n_positions, or
the paper's s) the buffer has 4M, so it is not folded, and the canonicalizer must read the
sliced block's data itself (passes/Canonicalize.cpp, isTrilBufferSlice). The models:

  tril        models/gen_paper_graph.py (one layer, h 64, 4 heads, s 2048, vocabulary 256, with
              weights; the nanoGPT form): sp-compile accepts it (a causal mask)
  not-tril    the same with one key above the diagonal made visible (row 0 sees key 5):
              sp-compile refuses it, naming the attention core, instead of training a model
              that sees the future
  weight-free the same graph without its weights file: accepted by its form (a weight-free
              graph compiles for the reports only; sp-run refuses to train it)
  hf-2048     models/export_family.py's HuggingFace GPT-2 (transformers 4.30's persistent
              buffer) with n_positions 2048, s 64: accepted; with row 0 seeing key 5, refused

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
    """The file and offset of the (only) bool [.., SEQ, SEQ] initializer's external data."""
    model = onnx.load(path, load_external_data=False)
    for t in model.graph.initializer:
        if t.data_type == onnx.TensorProto.BOOL and list(t.dims[-2:]) == [SEQ, SEQ]:
            info = {e.key: e.value for e in t.external_data}
            return os.path.join(os.path.dirname(path), info["location"]), int(info["offset"])
    raise SystemExit(f"error: {path} has no [{SEQ}, {SEQ}] bool buffer")


def see_the_future(path):
    """Row 0 of the causal buffer sees key 5."""
    data, offset = mask_offset(path)
    with open(data, "r+b") as f:
        f.seek(offset + 5)
        f.write(b"\x01")


def export_hf(path):
    subprocess.run([sys.executable, os.path.join(REPO, "models", "export_family.py"), "--family", "gpt2",
                    "-o", path, "--layers", "1", "--hidden", "64", "--heads", "4", "--seq", "64",
                    "--max-positions", str(SEQ), "--vocab", "256", "--batch", "2", "--buffers", "hf430",
                    "--external-data"], check=True, capture_output=True)


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
    see_the_future(bad)
    r = compile_(args.sp_compile, bad, os.path.join(args.workdir, "not-tril.plan"))
    check("not-tril", r.returncode == 1 and "attention core" in r.stderr
          and not os.path.exists(os.path.join(args.workdir, "not-tril.plan")),
          f"exit {r.returncode} {r.stderr.strip()}")

    free = os.path.join(args.workdir, "free.onnx")
    write(free, weights=False)
    r = compile_(args.sp_compile, free, os.path.join(args.workdir, "free.plan"))
    check("weight-free", r.returncode == 0, f"exit {r.returncode} {r.stderr.strip()}")

    for name, future in (("hf-2048", False), ("hf-2048-not-tril", True)):
        directory = os.path.join(args.workdir, name)
        os.makedirs(directory)
        hf = os.path.join(directory, "gpt2.onnx")
        export_hf(hf)
        if future:
            see_the_future(hf)
        r = compile_(args.sp_compile, hf, os.path.join(directory, "plan"))
        ok = (r.returncode == 1 and "attention core" in r.stderr) if future else r.returncode == 0
        check(name, ok, f"exit {r.returncode} {r.stderr.strip()}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
