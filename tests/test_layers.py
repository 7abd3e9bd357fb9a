"""Imports flow one way. In `fedjax_sel/` the layers are registry, keys and version, then data and
models, parts, client, engine, host: each module imports only its own layer and the ones before it.
In `experiments/` the shared code (`launch/`) comes first, then the papers' reports (`reports/`),
then the launchers. `experiments/` and `benchmarks/` may import `fedjax_sel`, which imports
neither; nothing in `fedjax_sel/` or `experiments/` imports `benchmarks`. Within each tree the
modules' own imports (module level: what importing a module runs) form no cycle."""

import ast
import os

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TREES = ("fedjax_sel", "experiments", "benchmarks")
# Per tree, the rank of each top-level part (a module or folder under it); a module imports only
# parts of its own rank or lower. Parts not listed (a launcher) rank above every listed one.
RANK = {
    "fedjax_sel": {"__init__": 6, "version": 0, "registry": 0, "keys": 0, "data": 1, "models": 1,
                   "parts": 2, "client": 3, "engine": 4, "host": 5},
    "experiments": {"__init__": 0, "launch": 0, "reports": 1},
    "benchmarks": {},
}
# The trees each tree may import.
MAY_IMPORT = {"fedjax_sel": set(), "experiments": {"fedjax_sel"},
              "benchmarks": {"fedjax_sel", "experiments"}}


def _modules(tree: str) -> dict[str, str]:
  """{dotted module name: path} of every module of `tree`."""
  out = {}
  for folder, _, files in os.walk(os.path.join(REPO, tree)):
    for name in files:
      if name.endswith(".py"):
        path = os.path.join(folder, name)
        parts = os.path.relpath(path, REPO)[:-3].split(os.sep)
        out[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
  return out


MODULES = {name: path for tree in TREES for name, path in _modules(tree).items()}


def _imports(module: str, path: str, top_level: bool) -> list[str]:
  """The modules of the repository `module` imports (a name imported from a package is the
  package's module of that name when it has one): at module level only, or anywhere."""
  with open(path, encoding="utf-8") as f:
    tree = ast.parse(f.read())
  package = module if path.endswith("__init__.py") else module.rpartition(".")[0]
  nodes = []
  stack = list(tree.body)
  while stack:  # Module level: the body and the branches of its if / try, not functions.
    node = stack.pop()
    nodes.append(node)
    if top_level and isinstance(node, (ast.If, ast.Try)):
      stack += node.body + node.orelse + getattr(node, "finalbody", [])
      stack += [s for h in getattr(node, "handlers", []) for s in h.body]
  if not top_level:
    nodes = list(ast.walk(tree))
  found = []
  for node in nodes:
    if isinstance(node, ast.Import):
      found += [a.name for a in node.names]
    elif isinstance(node, ast.ImportFrom):
      base = node.module or ""
      if node.level:
        anchor = package.split(".")
        anchor = anchor[:len(anchor) - node.level + 1]
        base = ".".join(anchor + ([base] if base else []))
      for a in node.names:
        found.append(f"{base}.{a.name}" if f"{base}.{a.name}" in MODULES else base)
  return [m for m in found if m.split(".")[0] in TREES]


def _rank(tree: str, module: str) -> int:
  parts = module.split(".")
  head = parts[1] if len(parts) > 1 else "__init__"
  return RANK[tree].get(head, max(RANK[tree].values(), default=0) + 1)


@pytest.mark.parametrize("tree", TREES)
def test_imports_flow_one_way(tree):
  wrong = []
  for module, path in MODULES.items():
    if module.split(".")[0] != tree:
      continue
    for target in _imports(module, path, top_level=False):
      other = target.split(".")[0]
      if other != tree:
        if other not in MAY_IMPORT[tree]:
          wrong.append((module, target))
      elif _rank(tree, target) > _rank(tree, module):
        wrong.append((module, target))
  assert not wrong, wrong


def _cycle(graph: dict[str, set[str]]) -> list[str] | None:
  """A cycle of `graph` as the list of its modules, or None."""
  state, path = {}, []

  def visit(node):
    state[node] = "open"
    path.append(node)
    for nxt in sorted(graph.get(node, ())):
      if state.get(nxt) == "open":
        return path[path.index(nxt):] + [nxt]
      if nxt not in state:
        found = visit(nxt)
        if found:
          return found
    state[node] = "done"
    path.pop()
    return None

  for node in sorted(graph):
    if node not in state:
      found = visit(node)
      if found:
        return found
  return None


@pytest.mark.parametrize("tree", TREES)
def test_no_import_cycle(tree):
  graph = {module: {t for t in _imports(module, path, top_level=True)
                    if t.split(".")[0] == tree and t != module}
           for module, path in MODULES.items() if module.split(".")[0] == tree}
  assert _cycle(graph) is None, " -> ".join(_cycle(graph))


def test_the_check_sees_a_cycle_and_an_upward_import():
  assert _cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
  assert _cycle({"a": {"b"}, "b": set()}) is None
  assert _rank("fedjax_sel", "fedjax_sel.host.runner") > _rank("fedjax_sel", "fedjax_sel.engine")
  assert _rank("experiments", "experiments.run") > _rank("experiments", "experiments.launch.job")


def test_each_engine_module_holds_one_stage_or_place():
  """The engine reads room by room: no module of it over about 300 lines (a module that grows
  past it holds two things; split it where they part)."""
  engine = os.path.join(REPO, "fedjax_sel", "engine")
  lines = {}
  for name in sorted(os.listdir(engine)):
    if name.endswith(".py"):
      with open(os.path.join(engine, name), encoding="utf-8") as f:
        lines[name] = len(f.readlines())
  assert {name: n for name, n in lines.items() if n > 320} == {}
