#!/usr/bin/python3
"""Compares sp-run --dump folders against a reference one, within bounds
derived from the reference's own float32 rounding.

  compare_dumps.py --ref64 REF64 REF OTHER...

REF is the reference layout's dump (float32), REF64 the same plan and flags
run with sp-run --float64, OTHER the dumps of other layouts (float32) of the
same model, data and steps. The rule is the unit-test harness's
(tests/unit/TrainHarness.h):

  scale(x) = max(rel(REF.x, REF64.x), u),   u = 2^-24

is the measured float32 rounding of quantity x in the reference run (u,
float32's unit roundoff, when the measure is smaller), and each OTHER must
satisfy rel(OTHER.x, REF.x) <= K scale(x), K = 8: two float32 runs that
order the same sums differently each deviate from the exact result by about
scale(x), so they differ by about 2 scale(x) at most; K = 8 leaves a factor
4 for the spread of that estimate. The quantities: every step's loss (one
scale, the largest over the steps: each step is the same computation),
every grads/<name>.npy and logits.npy (when OTHER has them: pipelined runs
do not). rel(a, b) = max |a - b| / max(max |b|, 1e-5 G), G the largest
gradient of the model: a gradient that is analytically zero, such as BERT's
key biases whose shift softmax cancels, is rounding noise of order eps G and
is compared at that scale (so a layout bug that makes it O(G) is caught).

With --resumed, each OTHER resumed a checkpoint of another layout part way
(its gradients are of its first step, not the reference's): every loss and
every final weights/<name>.npy are compared instead, by the same rule (a
weight's scale from the reference's weights against REF64's), except that
weights are compared in the 2-norm, rel2(a, b) = |a - b|_2 / |b|_2, not
element by element: AdamW's update m/(sqrt(v) + eps) amplifies the relative
rounding of an element whose gradients are near zero and cancel (seen: one
element of 3072, gradient 3.5e-7 against a median of 2e-5, moved 8 times
its tensor's largest f32-f64 difference while every other element stayed
within 2.3), so the largest element measures one element's conditioning,
different in every run, where the 2-norm measures the tensor's rounding. A
layout bug still shows: a weight off by a step's update (lr) is thousands of
times the 2-norm scale.

Prints "<name>: N losses, M gradients, logits equal (largest ratio to the
rounding scale: ...; bound 8)" (with --resumed, "N losses, M weights") or
what differs, and exits 1 on a difference.
"""
import argparse
import csv
import glob
import os
import sys

import numpy as np

K = 8.0
U = 2.0 ** -24
FLOOR = 1e-5  # of the largest gradient: below it a gradient is rounding noise


def losses(d):
    with open(os.path.join(d, "loss.csv")) as f:
        return [float(r["loss"]) for r in csv.DictReader(f)]


def rel(a, b, floor=1e-30):
    a = np.asarray(a, dtype=np.float64)
    b = np.asarray(b, dtype=np.float64)
    return float(np.abs(a - b).max() / max(np.abs(b).max(), floor))


def rel2(a, b):
    a = np.asarray(a, dtype=np.float64)
    b = np.asarray(b, dtype=np.float64)
    return float(np.linalg.norm(a - b) / max(np.linalg.norm(b), 1e-30))


def compare_resumed(ref64, ref, others):
    l32, l64 = losses(ref), losses(ref64)
    loss_scale = max([U] + [abs(x - y) / abs(y) for x, y in zip(l32, l64)])
    names = sorted(os.path.basename(w) for w in glob.glob(os.path.join(ref, "weights", "*.npy")))
    if not names:
        return f"compare_dumps.py: {ref} has no weights/*.npy"
    w32 = {n: np.load(os.path.join(ref, "weights", n)) for n in names}
    w64 = {n: np.load(os.path.join(ref64, "weights", n)) for n in names}
    scale = {n: max(rel2(w32[n], w64[n]), U) for n in names}
    ok = True
    for d in others:
        name = os.path.basename(d.rstrip("/"))
        problems = []
        lo = losses(d)
        if len(lo) != len(l32):
            problems.append(f"{len(lo)} losses, expected {len(l32)}")
        worst_loss = max([0.0] + [abs(y - x) / abs(x) / loss_scale for x, y in zip(l32, lo)])
        if worst_loss > K:
            problems.append(f"a loss is {worst_loss:.1f} x the rounding scale {loss_scale:.1e}")
        worst_w = 0.0
        for n in names:
            other = os.path.join(d, "weights", n)
            if not os.path.exists(other):
                problems.append(f"missing {other}")
                continue
            r = rel2(np.load(other), w32[n]) / scale[n]
            worst_w = max(worst_w, r)
            if r > K:
                problems.append(f"{n}: {r:.1f} x the rounding scale {scale[n]:.1e}")
        if problems:
            ok = False
            print(f"{name}: DIFFERS: " + "; ".join(problems))
        else:
            print(f"{name}: {len(lo)} losses, {len(names)} weights (largest ratio to the "
                  f"rounding scale: loss {worst_loss:.2f}, weight {worst_w:.2f}; bound {K:g})")
    return 0 if ok else 1


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ref64", required=True,
                    help="the reference plan's dump from sp-run --float64")
    ap.add_argument("--resumed", action="store_true",
                    help="OTHER runs resumed part way: compare losses and "
                         "final weights")
    ap.add_argument("ref")
    ap.add_argument("others", nargs="+")
    a = ap.parse_args()
    ref, ref64 = a.ref, a.ref64
    if a.resumed:
        sys.exit(compare_resumed(ref64, ref, a.others))

    l32, l64 = losses(ref), losses(ref64)
    if len(l32) != len(l64):
        sys.exit(f"compare_dumps.py: {ref64} has {len(l64)} losses, {ref} {len(l32)}")
    loss_scale = max([U] + [abs(x - y) / abs(y) for x, y in zip(l32, l64)])
    grads = sorted(glob.glob(os.path.join(ref, "grads", "*.npy")))
    if not grads:
        sys.exit(f"compare_dumps.py: {ref} has no grads/*.npy")
    g64 = {os.path.basename(g): np.load(os.path.join(ref64, "grads", os.path.basename(g)))
           for g in grads}
    if any(v.dtype != np.float64 for v in g64.values()):
        sys.exit(f"compare_dumps.py: {ref64} is not a float64 dump (sp-run --float64)")
    largest = max(float(np.abs(v).max()) for v in g64.values())
    floor = max(FLOOR * largest, 1e-30)
    g32 = {os.path.basename(g): np.load(g) for g in grads}
    grad_scale = {n: max(rel(g32[n], g64[n], floor), U) for n in g32}
    have_ref_logits = os.path.exists(os.path.join(ref, "logits.npy"))
    if have_ref_logits:
        lg32 = np.load(os.path.join(ref, "logits.npy"))
        logit_scale = max(rel(lg32, np.load(os.path.join(ref64, "logits.npy"))), U)

    ok = True
    for d in a.others:
        name = os.path.basename(d.rstrip("/"))
        problems = []
        lo = losses(d)
        if len(lo) != len(l32):
            problems.append(f"{len(lo)} losses, expected {len(l32)}")
        worst_loss = 0.0
        for i, (x, y) in enumerate(zip(l32, lo)):
            r = abs(y - x) / abs(x) / loss_scale
            worst_loss = max(worst_loss, r)
            if r > K:
                problems.append(f"step {i + 1}: loss {y} != {x} "
                                f"({r:.1f} x the rounding scale {loss_scale:.1e})")
        worst_grad = 0.0
        for n in sorted(g32):
            other = os.path.join(d, "grads", n)
            if not os.path.exists(other):
                problems.append(f"missing {other}")
                continue
            r = rel(np.load(other), g32[n], floor) / grad_scale[n]
            worst_grad = max(worst_grad, r)
            if r > K:
                problems.append(f"{n}: {r:.1f} x the rounding scale {grad_scale[n]:.1e}")
        # A dump without logits (an older pipelined run) compares the rest.
        have_logits = have_ref_logits and os.path.exists(os.path.join(d, "logits.npy"))
        worst_logits = 0.0
        if have_logits:
            worst_logits = rel(np.load(os.path.join(d, "logits.npy")), lg32) / logit_scale
            if worst_logits > K:
                problems.append(f"logits: {worst_logits:.1f} x the rounding scale "
                                f"{logit_scale:.1e}")
        if problems:
            ok = False
            print(f"{name}: DIFFERS: " + "; ".join(problems))
        else:
            what = "logits equal" if have_logits else "no logits"
            print(f"{name}: {len(lo)} losses, {len(grads)} gradients, {what} "
                  f"(largest ratio to the rounding scale: loss {worst_loss:.2f}, "
                  f"gradient {worst_grad:.2f}"
                  + (f", logits {worst_logits:.2f}" if have_logits else "")
                  + f"; bound {K:g})")
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
