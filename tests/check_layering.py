#!/usr/bin/python3
"""The include layering of the source folders (docs/architecture.md "Layout"; cmake/Layering.cmake checks the
same on the link graph):

  ir/        nothing of ours
  plan/      ir/
  frontend/  ir/, plan/
  lower/     ir/, plan/
  analysis/  ir/, plan/, lower/
  passes/    ir/, plan/, lower/, analysis/
  reports/   ir/, plan/, lower/, analysis/, passes/
  driver/    ir/, plan/, lower/, analysis/, passes/, reports/
  planner/   ir/, plan/, lower/, analysis/, passes/, reports/, driver/
  runtime/   ir/, plan/ (runtime/cuda/ too: the CUDA backend)
  tools/, tests/  anything

Every `#include "DIR/..."` of a .h, .cpp, .cu or .cuh file under a layered folder must name an allowed DIR.
Prints each violation (file, line, include) and exits 1 if there is any.

    /usr/bin/python3 tests/check_layering.py [REPO]
"""

import os
import re
import sys

ALLOWED = {
    "ir": {"ir"},
    "plan": {"ir", "plan"},
    "frontend": {"ir", "plan", "frontend"},
    "lower": {"ir", "plan", "lower"},
    "analysis": {"ir", "plan", "lower", "analysis"},
    "passes": {"ir", "plan", "lower", "analysis", "passes"},
    "reports": {"ir", "plan", "lower", "analysis", "passes", "reports"},
    "driver": {"ir", "plan", "lower", "analysis", "passes", "reports", "driver"},
    "planner": {"ir", "plan", "lower", "analysis", "passes", "reports", "driver", "planner"},
    "runtime": {"ir", "plan", "runtime"},
}
INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"/]+)/')


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
                        if m and m.group(1) in ALLOWED and m.group(1) not in allowed:
                            yield os.path.relpath(path, repo), number, line.strip(), folder


def main():
    repo = sys.argv[1] if len(sys.argv) > 1 else os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    bad = list(violations(repo))
    for path, number, line, folder in bad:
        print(f"{path}:{number}: {line}: {folder}/ may include only from "
              f"{', '.join(d + '/' for d in sorted(ALLOWED[folder]))}")
    files = sum(1 for folder in ALLOWED for _, _, fs in os.walk(os.path.join(repo, folder)) for _ in fs)
    print(f"layering: {len(bad)} violation(s) in {files} files of {', '.join(ALLOWED)}")
    sys.exit(1 if bad else 0)


if __name__ == "__main__":
    main()
