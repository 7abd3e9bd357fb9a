"""The package's layers import one way: registry and keys, then data and models, parts, client,
engine, host; each module imports only its own layer and the ones before it."""

import ast
import os

ROOT = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "fedjax_sel")
RANK = {"registry": 0, "keys": 0, "data": 1, "models": 1, "parts": 2, "client": 3, "engine": 4,
        "host": 5}


def test_imports_flow_one_way():
  upward = []
  for folder, _, files in os.walk(ROOT):
    for name in files:
      if not name.endswith(".py"):
        continue
      path = os.path.join(folder, name)
      layer = os.path.relpath(path, ROOT).split(os.sep)[0].removesuffix(".py")
      if layer not in RANK:
        continue
      with open(path, encoding="utf-8") as f:
        tree = ast.parse(f.read())
      for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("fedjax_sel"):
          parts = node.module.split(".")
          targets = [parts[1]] if len(parts) > 1 else [a.name for a in node.names]
          upward += [(os.path.relpath(path, ROOT), node.module, t) for t in targets
                     if RANK.get(t, -1) > RANK[layer]]
  assert not upward, upward
