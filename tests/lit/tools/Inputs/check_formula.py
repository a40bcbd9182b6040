#!/usr/bin/python3
"""Checks a plan's per-layer activation formula against what sp-run measured.

  check_formula.py PLAN DUMP

PLAN/manifest.json's memory.formula (the family's formula, reports/MemoryReport.cpp layerFormula)
must equal DUMP/memory.json's activation_bytes_per_layer, the bytes the executor measured as
stored between the forward and the backward of that layer: both count whole bytes of the same
buffers, so the comparison is exact. Prints "<family> <layout>: measured N bytes = formula".
"""
import json
import os
import sys


def main():
    plan, dump = sys.argv[1], sys.argv[2]
    with open(os.path.join(plan, "manifest.json")) as f:
        manifest = json.load(f)
    with open(os.path.join(dump, "memory.json")) as f:
        measured = json.load(f)["activation_bytes_per_layer"]
    formula = manifest["memory"]["formula"]
    want = formula["bytes_per_layer"]
    layout = f"t {manifest['tp']}{' sp' if manifest['sp'] else ''}"
    if measured <= 0 or abs(measured - want) > 0.5:
        print(f"{formula['family']} {layout}: measured {measured} bytes, formula {want} "
              f"({formula['text']})")
        sys.exit(1)
    print(f"{formula['family']} {layout}: measured {measured} bytes = formula")


if __name__ == "__main__":
    main()
