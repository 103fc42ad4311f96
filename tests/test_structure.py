"""The import map of docs/structure.md holds: every import of c2jax/ (module level and
inside functions) goes down the layers, and no modules import each other round a loop.

LAYERS is the design note's table, bottom row first; a package imports only packages of
lower rows. Run directly (`python tests/test_structure.py`) it prints the layer edges.
"""

from __future__ import annotations

import ast
import collections
import pathlib

import pytest

REPO = pathlib.Path(__file__).resolve().parents[1]

# docs/structure.md, "row / packages", bottom first. Top-level packages and modules of
# c2jax (`c2jax` itself is its __init__). pipeline and preemption are the library homes
# of `c2jax pipeline` and preemption handling, arriving from parallel branches.
LAYERS = (
    ("c2jax", "config", "storage", "host_memory", "toolcalls", "verbs", "preemption",
     "compile_cache"),
    ("parallel", "quant"),
    ("model", "data", "env"),
    ("rollout", "hf"),
    ("train",),
    ("serve",),
    ("agent",),
    ("eval",),
    ("rl",),
    ("plan",),
    ("sweep", "pipeline"),
    ("cli", "commands"),
)
ROW = {package: row for row, packages in enumerate(LAYERS) for package in packages}


def _modules(root: pathlib.Path) -> dict[str, tuple[pathlib.Path, bool]]:
  """{dotted name: (file, is a package __init__)} for every module under root/c2jax."""
  found = {}
  for path in sorted((root / "c2jax").rglob("*.py")):
    parts = list(path.relative_to(root).with_suffix("").parts)
    is_package = parts[-1] == "__init__"
    found[".".join(parts[:-1] if is_package else parts)] = (path, is_package)
  return found


def _targets(node, package: str, modules) -> list[str]:
  """The c2jax modules an Import / ImportFrom node names (a `from P import name` names P's
  submodule P.name when there is one, else P)."""
  if isinstance(node, ast.Import):
    names = [alias.name for alias in node.names]
  else:
    if node.level:
      base = ".".join(package.split(".")[:len(package.split(".")) - node.level + 1])
      base += "." + node.module if node.module else ""
    else:
      base = node.module
    names = [f"{base}.{alias.name}" if f"{base}.{alias.name}" in modules else base
             for alias in node.names]
  out = []
  for name in names:
    if name != "c2jax" and not name.startswith("c2jax."):
      continue
    while name not in modules:  # `import c2jax.a.b.attr`-style names: the module holding it
      name = name.rsplit(".", 1)[0]
    out.append(name)
  return out


def import_edges(root: pathlib.Path = REPO) -> list[tuple[str, str, str]]:
  """(importer, imported module, 'file:line') for every c2jax import under root/c2jax,
  inside functions too. Importing a.b.c also runs the __init__ of a.b: that counts as an
  import of a.b unless the importer lives inside a.b (then a.b is already importing)."""
  modules = _modules(root)
  edges = []
  for name, (path, is_package) in modules.items():
    package = name if is_package else name.rsplit(".", 1)[0]
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
      if not isinstance(node, (ast.Import, ast.ImportFrom)):
        continue
      where = f"{path.relative_to(root)}:{node.lineno}"
      for target in _targets(node, package, modules):
        parts = target.split(".")
        for depth in range(2, len(parts) + 1):
          imported = ".".join(parts[:depth])
          inside = name == imported or name.startswith(imported + ".")
          if imported in modules and (depth == len(parts) or not inside):
            edges.append((name, imported, where))
  return edges


def layer_of(module: str) -> str:
  return module.split(".")[1] if "." in module else "c2jax"


def layer_violations(edges) -> list[str]:
  problems = []
  # One message per import statement and layer: the module it names, not its packages.
  deepest = {}
  for importer, imported, where in edges:
    key = (where, importer, layer_of(imported))
    if len(imported) > len(deepest.get(key, "")):
      deepest[key] = imported
  for (where, importer, _), imported in deepest.items():
    here, there = layer_of(importer), layer_of(imported)
    for layer in (here, there):
      if layer not in ROW:
        problems.append(f"c2jax.{layer} has no row in LAYERS (tests/test_structure.py) "
                        "and docs/structure.md: add it to the layer it belongs to.")
    if here == there or here not in ROW or there not in ROW:
      continue
    if ROW[there] >= ROW[here]:
      relation = "the same row as" if ROW[there] == ROW[here] else "a higher row than"
      problems.append(f"{where}: {importer} imports {imported}, which is in {relation} "
                      f"{here} (docs/structure.md): move the shared piece down or pass it "
                      "in.")
  return sorted(set(problems))


def module_cycles(edges) -> list[list[str]]:
  """Strongly connected sets of more than one module (Tarjan, iterative)."""
  graph = collections.defaultdict(set)
  for importer, imported, _ in edges:
    if importer != imported:
      graph[importer].add(imported)
  index, low, on_stack, stack, cycles = {}, {}, set(), [], []
  for start in sorted(graph):
    if start in index:
      continue
    work = [(start, iter(sorted(graph[start])))]
    index[start] = low[start] = len(index)
    stack.append(start)
    on_stack.add(start)
    while work:
      node, children = work[-1]
      child = next(children, None)
      if child is not None:
        if child not in index:
          index[child] = low[child] = len(index)
          stack.append(child)
          on_stack.add(child)
          work.append((child, iter(sorted(graph[child]))))
        elif child in on_stack:
          low[node] = min(low[node], index[child])
        continue
      work.pop()
      if work:
        low[work[-1][0]] = min(low[work[-1][0]], low[node])
      if low[node] == index[node]:
        component = []
        while True:
          member = stack.pop()
          on_stack.discard(member)
          component.append(member)
          if member == node:
            break
        if len(component) > 1:
          cycles.append(sorted(component))
  return cycles


@pytest.fixture(scope="module")
def edges():
  return import_edges()


def test_every_import_goes_down_the_layers(edges):
  assert len(edges) > 500  # the scan saw the package
  assert not layer_violations(edges), "\n".join(layer_violations(edges))


def test_of_the_agent_only_external_harnesses_talk_to_the_server(edges):
  # docs/structure.md row 6: the loop drives an engine; agent/external drives a server.
  offending = [f"{where}: {importer} imports {imported}" for importer, imported, where in edges
               if importer.startswith("c2jax.agent") and imported.startswith("c2jax.serve")
               and not importer.startswith("c2jax.agent.external")]
  assert not offending, "\n".join(offending)


def test_no_modules_import_each_other_round_a_loop(edges):
  cycles = module_cycles(edges)
  assert not cycles, "import cycles (module imports included in functions):\n" + "\n".join(
      " <-> ".join(cycle) for cycle in cycles)


def test_the_layer_table_is_the_design_notes():
  rows = {}
  for line in (REPO / "docs" / "structure.md").read_text().splitlines():
    cells = [cell.strip() for cell in line.strip().strip("|").split("|")]
    if line.startswith("|") and cells[0].isdigit():
      rows[int(cells[0])] = tuple(p.strip(" `") for p in cells[1].split(","))
  assert rows == dict(enumerate(LAYERS)), (
      "docs/structure.md's layer table and LAYERS in tests/test_structure.py differ; make "
      "them the same map.")


def test_the_scan_catches_a_wrong_way_import_and_a_hidden_cycle(tmp_path):
  root = tmp_path / "repo"
  for name, text in {
      "c2jax/__init__.py": "",
      "c2jax/model/__init__.py": "",
      "c2jax/model/layers.py": "def f():\n  from c2jax.train import loop\n",
      "c2jax/train/__init__.py": "",
      "c2jax/train/loop.py": "from c2jax.train import step\n",
      "c2jax/train/step.py": "def g():\n  from . import loop\n",
  }.items():
    (root / name).parent.mkdir(parents=True, exist_ok=True)
    (root / name).write_text(text)
  found = import_edges(root)
  assert layer_violations(found) == [
      "c2jax/model/layers.py:2: c2jax.model.layers imports c2jax.train.loop, which is in a "
      "higher row than model (docs/structure.md): move the shared piece down or pass it in."]
  assert module_cycles(found) == [["c2jax.train.loop", "c2jax.train.step"]]


if __name__ == "__main__":
  counts = collections.Counter((layer_of(a), layer_of(b)) for a, b, _ in import_edges()
                               if layer_of(a) != layer_of(b))
  for (here, there), n in sorted(counts.items()):
    print(f"{here:>10} -> {there:<10} {n}")
