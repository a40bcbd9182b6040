#!/usr/bin/python3
"""Milliseconds per step of each op in an `sp-run --trace` file: the compute and communication
events of every rank summed by op name and divided by the traced steps, largest first.

    build/bin/sp-run PLAN --data DATA --steps 8 --trace t.json
    /usr/bin/python3 tools/trace_ops.py t.json --steps 8 [--top 12]
    /usr/bin/python3 tools/trace_ops.py t.json --step 3     # step 3 alone (no warm-up step)
    /usr/bin/python3 tools/trace_ops.py t.json --step 3 --instructions   # and each instruction, with the gaps
"""
import argparse
import collections
import json


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("trace")
    which = ap.add_mutually_exclusive_group(required=True)
    which.add_argument("--steps", type=int, help="the steps the trace holds (sp-run --steps): their mean")
    which.add_argument("--step", type=int, help="that step alone")
    ap.add_argument("--top", type=int, default=12, help="ops to list (default 12)")
    ap.add_argument("--instructions", action="store_true",
                    help="also list each instruction in start order: its time, the idle gap before it on the "
                         "device, and the span from the first start to the last end (a device-timed trace)")
    args = ap.parse_args()
    with open(args.trace) as f:
        events = json.load(f)["traceEvents"]
    us = collections.Counter()
    for e in events:
        if e.get("ph") == "X" and (args.step is None or e.get("args", {}).get("step") == args.step):
            us[e.get("name", "").split(" ")[0]] += e["dur"]
    steps = args.steps or 1
    print(f"{sum(us.values()) / 1000 / steps:.2f} ms per step in all")
    if args.instructions:
        chosen = sorted((e for e in events if e.get("ph") == "X" and
                         (args.step is None or e.get("args", {}).get("step") == args.step)), key=lambda e: e["ts"])
        end = None
        for e in chosen:
            a = e.get("args", {})
            gap = 0.0 if end is None else max(0.0, e["ts"] - end)
            end = max(end or 0.0, e["ts"] + e["dur"])
            print(f"  {a.get('instruction', -1):5d} {a.get('phase', ''):9s} layer {a.get('layer', -1):3d} "
                  f"{e['dur']:9.1f} us  gap {gap:7.1f} us  {e.get('name', '')}")
        if chosen:
            span = end - chosen[0]["ts"]
            print(f"  span {span / 1000:.3f} ms from the first start to the last end")
    for op, t in us.most_common(args.top):
        print(f"  {op:<28} {t / 1000 / steps:8.2f} ms/step")


if __name__ == "__main__":
    main()
