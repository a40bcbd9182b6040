#!/usr/bin/python3
"""Compares sp-run --dump folders against a reference one.

  compare_dumps.py REF OTHER...

For each OTHER: loss.csv (every step within 1e-6 relative), every
grads/<name>.npy (max |a - b| / max(max |a|, 1e-5 G) within 1e-6, G the
largest gradient of the model: a gradient that is analytically zero, such as
BERT's key biases whose shift softmax cancels, is rounding noise of order
eps G, and is compared at that scale, as tests/e2e/check_families.py does)
and logits.npy (max |a - b| / max |a|, when OTHER has them: pipelined runs do
not).
Prints "<name>: N losses, M gradients, logits equal (worst relative error:
...)" or what differs, and
exits 1 on a difference.
"""
import csv
import glob
import os
import sys

import numpy as np

TOL = 1e-6


def losses(d):
    with open(os.path.join(d, "loss.csv")) as f:
        return [float(r["loss"]) for r in csv.DictReader(f)]


FLOOR = 1e-5  # of the largest gradient: below it a gradient is rounding noise


def rel(a, b, floor=1e-30):
    return float(np.abs(a - b).max() / max(np.abs(a).max(), floor))


def main():
    ref, others = sys.argv[1], sys.argv[2:]
    ok = True
    for d in others:
        name = os.path.basename(d.rstrip("/"))
        problems = []
        la, lb = losses(ref), losses(d)
        if len(la) != len(lb):
            problems.append(f"{len(lb)} losses, expected {len(la)}")
        for i, (x, y) in enumerate(zip(la, lb)):
            if abs(x - y) > TOL * abs(x):
                problems.append(f"step {i + 1}: loss {y} != {x}")
        grads = sorted(glob.glob(os.path.join(ref, "grads", "*.npy")))
        largest = max((float(np.abs(np.load(g)).max()) for g in grads), default=0.0)
        worst_grad = 0.0
        for g in grads:
            other = os.path.join(d, "grads", os.path.basename(g))
            if not os.path.exists(other):
                problems.append(f"missing {other}")
                continue
            e = rel(np.load(g), np.load(other), max(FLOOR * largest, 1e-30))
            worst_grad = max(worst_grad, e)
            if e > TOL:
                problems.append(f"{os.path.basename(g)}: relative error {e:.2e}")
        # Pipelined plans dump no logits (they have no forward-only run).
        have_logits = os.path.exists(os.path.join(d, "logits.npy"))
        logits = 0.0
        if have_logits:
            logits = rel(np.load(os.path.join(ref, "logits.npy")), np.load(os.path.join(d, "logits.npy")))
            if logits > TOL:
                problems.append(f"logits: relative error {logits:.2e}")
        worst_loss = max((abs(x - y) / abs(x) for x, y in zip(la, lb)), default=0.0)
        if problems:
            ok = False
            print(f"{name}: DIFFERS: " + "; ".join(problems))
        else:
            what = "logits equal" if have_logits else "no logits"
            print(f"{name}: {len(lb)} losses, {len(grads)} gradients, {what} "
                  f"(worst relative error: loss {worst_loss:.1e}, gradient {worst_grad:.1e}"
                  + (f", logits {logits:.1e})" if have_logits else ")"))
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
