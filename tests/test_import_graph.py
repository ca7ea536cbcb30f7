"""The library's import graph is a DAG: no two modules import each other, directly or through
others, counting the imports inside functions (which would otherwise hide a cycle).  Read from the
source with `ast`; nothing is imported."""
import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
#: package name -> its folder (setup.py maps monet.solver, monet.profiling and monet.zoo to these)
PACKAGES = {"monet": ROOT / "monet", "monet.solver": ROOT / "solver", "monet.profiling": ROOT / "profiling",
            "monet.zoo": ROOT / "zoo"}


def modules() -> dict[str, Path]:
    """Every module of the library by its dotted name (a package by its own name)."""
    found = {}
    for package, folder in PACKAGES.items():
        for path in folder.rglob("*.py"):
            parts = list(path.relative_to(folder).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts = parts[:-1]
            found[".".join([package, *parts])] = path
    return found


def imports(name: str, path: Path, known: set[str]) -> set[str]:
    """The library modules ``name`` imports anywhere in its source (``from a import b`` counts as
    ``a`` and, where it is a module, ``a.b``)."""
    out = set()
    package = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            out |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = ".".join(package[:len(package) - node.level + 1] + ([base] if base else []))
            out |= {base} | {f"{base}.{a.name}" for a in node.names}
    return (out & known) - {name}


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan)."""
    index, low, stack, on, found = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                found.append(sorted(comp))

    for v in graph:
        if v not in index:
            visit(v)
    return found


def test_the_import_graph_has_no_cycle():
    mods = modules()
    graph = {name: imports(name, path, set(mods)) for name, path in mods.items()}
    assert sum(map(len, graph.values())) > 100, "the walk finds the imports"
    assert cycles(graph) == []


def test_the_cycle_finder_finds_a_cycle_through_a_third_module():
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": set()}) == []
