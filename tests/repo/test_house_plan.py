"""The house plan (ARCHITECTURE.md) holds: data flows down only, the rooms above the analysis reach it through its
facade, no source file outgrows a room, and ruff's line length holds everywhere."""

from __future__ import annotations

import ast
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

from paths import REPO

PACKAGE = REPO / "src" / "ingero_mcp"

# Each room and its floor: a module may import from its own room or from a lower floor, never from a higher one or
# from another room on its floor.
FLOORS = {
    "__init__": 0, "charclasses": 0, "units": 0,
    "sanitize": 1,
    "store": 2,
    "analysis": 3, "importers": 3,
    "render": 4, "demo": 4,
    "collector": 5, "export": 5,
    "mcp": 6,
    "cli": 7,
}
FACADE_USERS = {"cli", "mcp", "export", "render", "demo"}  # they import the analysis only from ingero_mcp.analysis
LONG_FILES = {"importers/ingero.py", "demo/synth.py"}  # each holds one question end to end
MAX_LINES = 600


def _room(path: Path) -> str:
    rel = path.relative_to(PACKAGE)
    return rel.parts[0].removesuffix(".py")


def _imports(path: Path) -> list[tuple[int, str, list[str]]]:
    """(line, module, names) of every import of ingero_mcp in the file, those inside functions included."""
    got = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] == "ingero_mcp":
            got.append((node.lineno, node.module, [a.name for a in node.names]))
        elif isinstance(node, ast.Import):
            got += [(node.lineno, a.name, []) for a in node.names if a.name.split(".")[0] == "ingero_mcp"]
    return got


def test_data_flows_down_only() -> None:
    wrong = []
    for path in sorted(PACKAGE.rglob("*.py")):
        room = _room(path)
        assert room in FLOORS, f"{path}: a room the plan does not name ({room}): add it to FLOORS and ARCHITECTURE.md"
        for line, module, names in _imports(path):
            parts = module.split(".")
            targets = [parts[1]] if len(parts) > 1 else [n for n in names if n in FLOORS]
            for target in targets:
                if target != room and FLOORS[target] >= FLOORS[room]:
                    wrong.append(f"{path.relative_to(REPO)}:{line} ({room}, floor {FLOORS[room]}) imports {module} "
                                 f"({target}, floor {FLOORS[target]})")
    assert not wrong, "\n".join(wrong)


def test_the_rooms_above_reach_the_analysis_through_its_facade() -> None:
    wrong = []
    for path in sorted(PACKAGE.rglob("*.py")):
        if _room(path) not in FACADE_USERS:
            continue
        for line, module, _ in _imports(path):
            if module.startswith("ingero_mcp.analysis."):
                wrong.append(f"{path.relative_to(REPO)}:{line} imports {module}")
    assert not wrong, "import these from ingero_mcp.analysis (add them to its facade):\n" + "\n".join(wrong)


def test_no_cycle_between_modules() -> None:
    """Module-level imports (those a module runs when it is loaded) form no cycle."""
    modules = {}
    for path in PACKAGE.rglob("*.py"):
        rel = path.relative_to(PACKAGE.parent).with_suffix("")
        name = ".".join(rel.parts[:-1] if rel.name == "__init__" else rel.parts)
        modules[name] = path
    edges: dict[str, set[str]] = {}
    for name, path in modules.items():
        out = set()
        for node in ast.parse(path.read_text()).body:
            if isinstance(node, ast.ImportFrom) and node.module and node.module in modules:
                subs = {f"{node.module}.{a.name}" for a in node.names if f"{node.module}.{a.name}" in modules}
                out |= subs  # `from package import module` loads the module (the package is loaded already)
                if len(subs) < len(node.names):
                    out.add(node.module)
            elif isinstance(node, ast.Import):
                out |= {a.name for a in node.names if a.name in modules}
        edges[name] = out - {name}
    state: dict[str, int] = {}
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        path.append(node)
        for nxt in sorted(edges[node]):
            if state.get(nxt) == 1:
                return path[path.index(nxt):] + [nxt]
            if nxt not in state and (cycle := visit(nxt)):
                return cycle
        path.pop()
        state[node] = 2
        return None

    for start in sorted(edges):
        if start not in state:
            cycle = visit(start)
            assert cycle is None, "import cycle: " + " -> ".join(cycle)


def test_no_source_file_outgrows_a_room() -> None:
    big = []
    for path in sorted(PACKAGE.rglob("*.py")):
        n = len(path.read_text().splitlines())
        if n > MAX_LINES and str(path.relative_to(PACKAGE)) not in LONG_FILES:
            big.append(f"{path.relative_to(REPO)}: {n} lines")
    assert not big, f"over {MAX_LINES} lines (split it along its seams):\n" + "\n".join(big)


def test_lines_within_120_characters() -> None:
    ruff = shutil.which("ruff", path=str(Path(sys.executable).parent))
    assert ruff, "ruff is missing: pip install -e '.[test]'"
    got = subprocess.run([ruff, "check", "--select", "E501", "--no-cache", "--output-format", "concise",
                          "src", "tests", "bench", "collectors"], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert got.returncode == 0, got.stdout[-4000:] + got.stderr[-2000:]


def test_every_name_taken_from_the_facade_is_there() -> None:
    """The facade loads its names on first use: a name it lacks fails only when that code runs, so check them all
    here; and a name that is a module (`timeline`) is not the function of the same name."""
    import importlib
    import types

    import ingero_mcp.analysis as facade

    wrong = []
    for path in sorted(PACKAGE.rglob("*.py")):
        if _room(path) == "analysis":
            continue  # the analysis imports its own modules by name
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module == "ingero_mcp.analysis":
                for alias in node.names:
                    try:
                        value = getattr(facade, alias.name)
                    except AttributeError:
                        try:
                            value = importlib.import_module(f"ingero_mcp.analysis.{alias.name}")
                        except ImportError:
                            wrong.append(f"{path.relative_to(REPO)}:{node.lineno}: {alias.name} is not in the facade")
                            continue
                    if isinstance(value, types.ModuleType) and alias.name != "recommend":
                        wrong.append(f"{path.relative_to(REPO)}:{node.lineno}: {alias.name} is a module")
    assert not wrong, "\n".join(wrong)


def test_explains_connection_visits_each_analysis_module_at_most_twice() -> None:
    """The report hands on what it has read (window, origin, names, derived views) instead of modules asking each
    other again: an entry is a call into an analysis module, with the connection, from another module."""
    import collections

    from ingero_mcp.analysis import diagnose
    from ingero_mcp.store import open_store

    con = open_store(REPO / "investigations" / "h200-seed-benchmark.duckdb")
    seq: list[str] = []

    def profile(frame: Any, event: str, _arg: Any) -> None:
        module = str(frame.f_globals.get("__name__", ""))
        runner = module.endswith(("._sql", ".answers"))  # they run the queries every module asks: not visits
        if event == "call" and module.startswith("ingero_mcp.analysis.") and not runner:
            if any(value is con for value in frame.f_locals.values()) and (not seq or seq[-1] != module):
                seq.append(module)

    sys.setprofile(profile)
    try:
        diagnose(con)
    finally:
        sys.setprofile(None)
        con.close()
    over = {m: n for m, n in collections.Counter(seq).items() if n > 2}
    assert seq and not over, f"entered more than twice: {over}\n" + " -> ".join(seq)
