#!/usr/bin/python3
"""Checks that a mixed-precision run tracks the fp32 run of the same plan,
data and flags: sp-run's loss.csv of each.

  precision_band.py --unit U REF.csv OTHER.csv [--window W]

U is the 16-bit format's unit roundoff (bf16 2^-8, fp16 2^-11): every
activation the run stores carries a relative rounding error of at most U,
and the loss is an average over tokens of smooth functions of them, so
rounding moves a step's loss by a relative amount of order U. The band:

  - step 1 (the same weights; only the forward and its rounding differ):
    |L16 - L32| <= U L32;
  - each window of W steps (default 20; the mean removes the step-to-step
    noise of updates that rounding moved): |mean L16 - mean L32| <=
    4 U mean L32, a factor 4 for the drift that the moved updates add up
    to over the run.

Prints each ratio to its bound and fails if one exceeds 1.
"""
import argparse
import csv
import sys


def losses(path):
    with open(path) as f:
        return [float(r["loss"]) for r in csv.DictReader(f)]


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--unit", type=float, required=True)
    p.add_argument("--window", type=int, default=20)
    p.add_argument("ref")
    p.add_argument("other")
    a = p.parse_args()
    ref, other = losses(a.ref), losses(a.other)
    if len(ref) != len(other) or len(ref) < a.window:
        sys.exit(f"{len(ref)} and {len(other)} losses: the runs differ in "
                 f"length or are shorter than a window of {a.window}")
    first = abs(other[0] - ref[0]) / (a.unit * ref[0])
    ratios = []
    for k in range(0, len(ref) - a.window + 1, a.window):
        r = sum(ref[k:k + a.window]) / a.window
        o = sum(other[k:k + a.window]) / a.window
        ratios.append(abs(o - r) / (4 * a.unit * r))
    worst = max(ratios)
    print(f"step 1: {first:.4f} of U L; {len(ratios)} windows of "
          f"{a.window} steps: largest {worst:.4f} of 4 U mean L; "
          f"loss {ref[0]:.3f} -> {ref[-1]:.3f}")
    if first > 1 or worst > 1:
        sys.exit("outside the band")
    print("within the band")


if __name__ == "__main__":
    main()
