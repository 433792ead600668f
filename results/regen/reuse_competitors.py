"""Keep a copied results.json's finished runs but DQ's, so ``compare --resume`` reuses them.

Usage: python results/regen/reuse_competitors.py OUT/results.json
"""

import json
import sys

path = sys.argv[1]
data = json.load(open(path))
data["pending"] = [r for r in data["runs"] if r["label"] != "dq"]
data["runs"] = []
json.dump(data, open(path, "w"), indent=1)
