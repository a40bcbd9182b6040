"""sp-run-logs.test: checks a loss.csv's columns against each other and the
plan. Usage: loss_columns.py LOSS.csv MANIFEST.json PEAK"""
import csv
import json
import sys

rows = list(csv.DictReader(open(sys.argv[1])))
flops = json.load(open(sys.argv[2]))["flops"]["model_flops_per_iteration"]
peak = float(sys.argv[3])
val = [int(r["step"]) for r in rows if r["val_loss"]]
# Printed with 9 significant digits: ratios hold to about 1e-8.
mfu = all(abs(float(r["mfu"]) * peak / float(r["model_flops_per_s"]) - 1) < 1e-7
          for r in rows)
per_token = all(abs(float(r["model_flops_per_s"]) / float(r["tokens_per_s"]) /
                    (flops / 256) - 1) < 1e-7 for r in rows)
norms = all(float(r["grad_norm"]) > 0 for r in rows)
print("%d rows; validation at %s; %s; %s; %s" %
      (len(rows), val, "mfu = flops/peak" if mfu else "MFU WRONG",
       "flops/token = model flops / 256" if per_token else "FLOPS WRONG",
       "grad_norm > 0" if norms else "NORM WRONG"))
