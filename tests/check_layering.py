#!/usr/bin/python3
"""The include layering of the source folders (docs/architecture.md "Layout"; cmake/Layering.cmake checks the
same on the link graph):

  support/   nothing of ours (number formats, errors, the XML/SVG writer)
  ir/        support/
  plan/      ir/, support/
  frontend/  ir/, plan/, support/
  lower/     ir/, plan/, support/
  analysis/  ir/, plan/, lower/, support/
  passes/    ir/, plan/, lower/, analysis/, support/
  reports/   ir/, plan/, lower/, analysis/, passes/, support/
  driver/    ir/, plan/, frontend/, lower/, analysis/, passes/, reports/, html/,
             support/
  planner/   ir/, plan/, frontend/, lower/, analysis/, passes/, reports/,
             driver/, html/,
             support/
  text/      support/ (the tokenizer and the token file's sidecar)
  runtime/   ir/, plan/, text/, support/ (runtime/cuda/ too: the CUDA
             backend; of text/ only the token file's sidecar)
  html/      plan/, support/ (ir/ through the plan's headers): the HTML page
  train/     ir/, plan/, runtime/, frontend/, support/, html/, text/ (the
             training library; no backend header: runtime/BackendRegistry.h)
  tools/, tests/  anything

Every `#include "DIR/..."` of a .h, .cpp, .cu or .cuh file under a layered folder must name an allowed DIR.
Prints each violation (file, line, include) and exits 1 if there is any.

    /usr/bin/python3 tests/check_layering.py [REPO]
"""

import os
import re
import sys

ALLOWED = {
    "support": {"support"},
    "ir": {"ir", "support"},
    "plan": {"ir", "plan", "support"},
    "frontend": {"ir", "plan", "frontend", "support"},
    "lower": {"ir", "plan", "lower", "support"},
    "analysis": {"ir", "plan", "lower", "analysis", "support"},
    "passes": {"ir", "plan", "lower", "analysis", "passes", "support"},
    "reports": {"ir", "plan", "lower", "analysis", "passes", "reports", "support"},
    "driver": {"ir", "plan", "frontend", "lower", "analysis", "passes", "reports", "driver", "html",
               "support"},
    "planner": {"ir", "plan", "frontend", "lower", "analysis", "passes", "reports", "driver", "planner",
                "html", "support"},
    "text": {"text", "support"},
    "runtime": {"ir", "plan", "runtime", "text", "support"},
    "html": {"ir", "plan", "html", "support"},
    "train": {"ir", "plan", "runtime", "frontend", "support", "html", "train", "text"},
}
# Headers of the backends, which train/ reaches only through the registry.
FORBIDDEN_PREFIXES = {
    "train": ("runtime/cpu/", "runtime/cuda/"),
}
INCLUDE = re.compile(r'^\s*#\s*include\s+"(([^"/]+)/[^"]*)"')


def violations(repo):
    for folder, allowed in ALLOWED.items():
        for root, _, files in os.walk(os.path.join(repo, folder)):
            for name in sorted(files):
                if not name.endswith((".h", ".cpp", ".cu", ".cuh", ".def")):
                    continue
                path = os.path.join(root, name)
                with open(path, encoding="utf-8") as f:
                    for number, line in enumerate(f, 1):
                        m = INCLUDE.match(line)
                        if not m:
                            continue
                        if m.group(2) in ALLOWED and m.group(2) not in allowed:
                            yield os.path.relpath(path, repo), number, line.strip(), folder
                        elif m.group(1).startswith(FORBIDDEN_PREFIXES.get(folder, ())):
                            yield os.path.relpath(path, repo), number, line.strip(), folder


def main():
    repo = sys.argv[1] if len(sys.argv) > 1 else os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    bad = list(violations(repo))
    for path, number, line, folder in bad:
        print(f"{path}:{number}: {line}: {folder}/ may include only from "
              f"{', '.join(d + '/' for d in sorted(ALLOWED[folder]))}"
              + "".join(f", not {p}" for p in FORBIDDEN_PREFIXES.get(folder, ())))
    files = sum(1 for folder in ALLOWED for _, _, fs in os.walk(os.path.join(repo, folder)) for _ in fs)
    print(f"layering: {len(bad)} violation(s) in {files} files of {', '.join(ALLOWED)}")
    sys.exit(1 if bad else 0)


if __name__ == "__main__":
    main()
