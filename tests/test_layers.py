"""The package's layering, read from its source: which room may import which, and no import cycles.

The imports are read with ``ast`` (nothing is executed), so every import counts: module level, inside
functions, under ``if TYPE_CHECKING:``, and ``importlib.import_module("...")`` / ``__import__("...")`` calls
with a literal name. Relative imports are resolved. Names looked up at run time from a table (the lazy
exports of ``entropy_law/__init__.py``) are not seen; the subprocess tests in test_tasks.py,
test_vlm_tasks.py and test_law_simulate.py check what importing the analysis really loads.
"""

from __future__ import annotations

import ast
import functools
from collections import deque
from dataclasses import dataclass
from pathlib import Path

import pytest

PACKAGE_DIR = Path(__file__).resolve().parents[1] / "entropy_law"

# room -> (what it never imports, why); a name covers its submodules
ANALYSIS_NEVER = ("torch", "transformers", "entropy_law.decoding", "entropy_law.drafters", "entropy_law.jobs",
                  "entropy_law.plots")
RULES = {
    "entropy_law.law": (ANALYSIS_NEVER + ("entropy_law.payoff", "entropy_law.outofcore", "entropy_law.glance",
                                          "entropy_law.analysis"),
                        "the law reads traces only, never imports torch, and the rooms built on it never the other way"),
    "entropy_law.payoff": (ANALYSIS_NEVER + ("entropy_law.outofcore", "entropy_law.glance", "entropy_law.analysis"),
                           "when drafting pays is priced from traces and the law, never with torch"),
    "entropy_law.outofcore": (ANALYSIS_NEVER + ("entropy_law.payoff", "entropy_law.glance", "entropy_law.analysis"),
                              "the out-of-core path reads trace shards with DuckDB and fits the law, never with torch"),
    "entropy_law.glance": (ANALYSIS_NEVER + ("entropy_law.payoff", "entropy_law.outofcore", "entropy_law.analysis"),
                           "GLANCE's law reads round data only and never imports torch"),
    "entropy_law.analysis": (ANALYSIS_NEVER, "the analysis facade reads traces and the rooms, never torch"),
    "entropy_law.traces": (("torch", "transformers", "entropy_law.decoding", "entropy_law.drafters",
                            "entropy_law.jobs", "entropy_law.plots"),
                           "the trace format is the contract between the layers and never imports torch"),
    "entropy_law.decoding": (("entropy_law.law", "entropy_law.plots", "entropy_law.jobs", "entropy_law.drafters"),
                             "decoding never imports the analysis, the figures, the jobs or a drafter"),
    "entropy_law.plots": (("entropy_law.decoding", "entropy_law.drafters"), "figures are drawn from traces and fits"),
    "entropy_law.importers": (("torch", "transformers", "entropy_law.decoding", "entropy_law.drafters",
                               "entropy_law.jobs", "entropy_law.plots"),
                              "importers read engine JSON and write through the trace layer; they never load a model"),
}


@dataclass(frozen=True)
class Import:
    importer: str  # dotted module name
    target: str  # dotted name of the imported module (a package's submodule where that is what is named)
    where: str  # "entropy_law/decoding/tree.py:12"


def within(name: str, prefix: str) -> bool:
    return name == prefix or name.startswith(prefix + ".")


@functools.cache  # the package's source is read once per test process; every rule below checks the same scan
def package_imports(package_dir: Path) -> tuple[frozenset[str], tuple[Import, ...]]:
    """Every module under ``package_dir`` and every import in them."""
    files = {}
    for path in sorted(package_dir.rglob("*.py")):
        parts = path.relative_to(package_dir.parent).with_suffix("").parts
        is_package = parts[-1] == "__init__"
        files[".".join(parts[:-1] if is_package else parts)] = (path, is_package)
    modules = set(files)
    imports = []
    for module, (path, is_package) in files.items():
        here = module if is_package else module.rpartition(".")[0]  # the package relative imports start from
        where = str(path.relative_to(package_dir.parent))
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            for target in imported_names(node, here, modules):
                imports.append(Import(module, target, f"{where}:{node.lineno}"))
    return frozenset(modules), tuple(imports)


def imported_names(node: ast.AST, here: str, modules: set[str]) -> list[str]:
    """The modules ``node`` imports (none if it is not an import), relative names resolved against ``here``."""
    if isinstance(node, ast.Import):
        return [alias.name for alias in node.names]
    if isinstance(node, ast.ImportFrom):
        base = resolve("." * node.level + (node.module or ""), here)
        # `from pkg import name`: the submodule pkg.name if there is one, else pkg itself
        return [f"{base}.{alias.name}" if f"{base}.{alias.name}" in modules else base for alias in node.names]
    if isinstance(node, ast.Call) and node.args and isinstance(node.args[0], ast.Constant) \
            and isinstance(node.args[0].value, str):
        func = node.func
        name = func.attr if isinstance(func, ast.Attribute) else func.id if isinstance(func, ast.Name) else None
        if name in ("import_module", "__import__"):
            package = next((k.value.value for k in node.keywords if k.arg == "package"
                            and isinstance(k.value, ast.Constant) and isinstance(k.value.value, str)), here)
            return [resolve(node.args[0].value, package)]
    return []


def resolve(name: str, here: str) -> str:
    """An absolute dotted name for ``name`` (``..x`` climbs one package above ``here``)."""
    level = len(name) - len(name.lstrip("."))
    if level == 0:
        return name
    parts = here.split(".")
    base = parts[: len(parts) - (level - 1)]
    rest = name[level:]
    return ".".join(base + ([rest] if rest else []))


def layering_violations(package_dir: Path, rules: dict = RULES) -> list[str]:
    """One line per import that breaks a room's rule, naming the file and line of the import."""
    _, imports = package_imports(package_dir)
    found = []
    for imp in imports:
        for room, (forbidden, why) in rules.items():
            if within(imp.importer, room) and any(within(imp.target, f) for f in forbidden):
                found.append(f"{imp.where}: {imp.importer} imports {imp.target} ({why})")
    return sorted(found)


def import_cycles(package_dir: Path) -> list[str]:
    """Import cycles between the package's modules, one readable path per cycle: for every module that
    lies on a cycle, the shortest cycle through it (rotations of one cycle are reported once)."""
    modules, imports = package_imports(package_dir)
    edges: dict[str, dict[str, str]] = {m: {} for m in modules}  # importer -> {imported: first file:line}
    for imp in sorted(imports, key=lambda i: i.where):
        if imp.target in modules and imp.target != imp.importer:
            edges[imp.importer].setdefault(imp.target, imp.where)
    cycles = {}
    for start in sorted(modules):
        path = shortest_path_back(edges, start)
        if path is None:
            continue
        turn = path.index(min(path))  # one cycle, whichever member it was found from: start at its first name
        path = path[turn:] + path[:turn]
        steps = [f"{a} ({edges[a][b]})" for a, b in zip(path, path[1:] + path[:1])]
        cycles.setdefault(tuple(path), " -> ".join(steps + [path[0]]))
    return list(cycles.values())


def shortest_path_back(edges: dict[str, dict[str, str]], start: str) -> list[str] | None:
    """The modules of a shortest cycle start -> ... -> start (breadth first), or None."""
    came_from = {start: None}
    queue = deque([start])
    while queue:
        node = queue.popleft()
        for nxt in sorted(edges[node]):
            if nxt == start:
                path = [node]
                while came_from[path[-1]] is not None:
                    path.append(came_from[path[-1]])
                return path[::-1]
            if nxt not in came_from:
                came_from[nxt] = node
                queue.append(nxt)
    return None


def write_tree(root: Path, files: dict[str, str]) -> None:
    for name, text in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)


def test_the_checker_catches_hidden_forbidden_imports_and_cycles(tmp_path):
    write_tree(tmp_path, {
        "entropy_law/__init__.py": "",
        "entropy_law/decoding/__init__.py": "",
        "entropy_law/decoding/tree.py": "import math\n\n\ndef lazy():\n    import entropy_law.law.fit\n",
        "entropy_law/decoding/round.py": "from ..plots import figures  # relative, two levels\n",
        "entropy_law/law/__init__.py": "from . import fit\n",
        "entropy_law/law/fit.py": "from entropy_law.law import cost\n\nimport numpy\n",
        "entropy_law/law/cost.py": "def lazy():\n    from .fit import x\n",
        "entropy_law/traces/__init__.py": "",
        "entropy_law/traces/reader.py": "import importlib\n\n\ndef lazy():\n    return importlib.import_module('torch')\n",
        "entropy_law/plots/__init__.py": "",
        "entropy_law/plots/figures.py": "import entropy_law.traces.reader\n",
    })
    violations = layering_violations(tmp_path / "entropy_law")
    assert violations == [
        "entropy_law/decoding/round.py:1: entropy_law.decoding.round imports entropy_law.plots.figures "
        f"({RULES['entropy_law.decoding'][1]})",
        "entropy_law/decoding/tree.py:5: entropy_law.decoding.tree imports entropy_law.law.fit "
        f"({RULES['entropy_law.decoding'][1]})",
        f"entropy_law/traces/reader.py:5: entropy_law.traces.reader imports torch ({RULES['entropy_law.traces'][1]})",
    ]
    assert import_cycles(tmp_path / "entropy_law") == [
        "entropy_law.law.cost (entropy_law/law/cost.py:2) -> entropy_law.law.fit (entropy_law/law/fit.py:1) "
        "-> entropy_law.law.cost"]


def test_the_scan_sees_the_package():
    modules, imports = package_imports(PACKAGE_DIR)
    assert {"entropy_law.decoding.decoder", "entropy_law.law.fit", "entropy_law.traces.reader"} <= modules
    # the rooms split out of the law exist, and each imports the law: their rules below check real imports
    for room in ("payoff", "outofcore", "glance", "analysis"):
        assert any(within(i.importer, f"entropy_law.{room}") and within(i.target, "entropy_law.law") for i in imports)
    # the decoding room does import torch: a scan that saw no imports would pass every rule below
    assert any(within(i.importer, "entropy_law.decoding") and within(i.target, "torch") for i in imports)
    # the importers room exists and writes through the trace layer: its rule below checks real imports
    assert {"entropy_law.importers.vllm", "entropy_law.importers.writer"} <= modules
    assert any(within(i.importer, "entropy_law.importers") and within(i.target, "entropy_law.traces") for i in imports)


@pytest.mark.parametrize("room", sorted(RULES))
def test_rooms_import_only_what_their_layer_may(room):
    violations = layering_violations(PACKAGE_DIR, {room: RULES[room]})
    assert not violations, "\n".join(violations)


def test_no_import_cycles_between_modules():
    cycles = import_cycles(PACKAGE_DIR)
    assert not cycles, "import cycles (importer (file:line of its import) -> imported):\n" + "\n".join(cycles)
