"""No import cycles inside any package: the import graph of every module under packages/*/src is acyclic."""

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ["claw-sandbox", "claw-proxy", "claw-tree", "claw-rl", "claw-bench"]


def _modules(src: Path) -> dict[str, Path]:
    """Dotted module name -> file, for every .py under src (packages named by their __init__)."""
    out = {}
    for path in sorted(src.rglob("*.py")):
        parts = list(path.relative_to(src).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        out[".".join(parts)] = path
    return out


def _load_imports(tree: ast.Module):
    """Every import statement, at module level or deferred in a function, except `if TYPE_CHECKING:` ones.

    A deferred import still closes a cycle: it only moves the failure from import time to the
    first call that happens to run in the wrong order.
    """
    stack: list[ast.AST] = [tree]
    while stack:
        node = stack.pop()
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            yield node
            continue
        if isinstance(node, ast.If) and _is_type_checking(node.test):
            stack.extend(node.orelse)
            continue
        stack.extend(ast.iter_child_nodes(node))


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _edges(name: str, path: Path, modules: dict[str, Path]) -> set[str]:
    """Intra-package modules that `name` imports (absolute and relative, module-level and deferred)."""
    is_pkg = path.name == "__init__.py"
    pkg_parts = name.split(".") if is_pkg else name.split(".")[:-1]
    found = set()

    def add(target: str) -> None:
        # `import a.b.c` loads a, a.b and a.b.c; count the deepest one that is ours and each parent package.
        parts = target.split(".")
        for i in range(1, len(parts) + 1):
            candidate = ".".join(parts[:i])
            if candidate in modules and candidate != name:
                found.add(candidate)

    tree = ast.parse(path.read_text(), filename=str(path))
    for node in _load_imports(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                add(alias.name)
            continue
        if node.level:
            base = pkg_parts[: len(pkg_parts) - (node.level - 1)]
            module = ".".join(base + ([node.module] if node.module else []))
        else:
            module = node.module or ""
        add(module)
        for alias in node.names:  # `from pkg import submodule`
            add(f"{module}.{alias.name}")
    return found


def _find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One cycle in the graph as a list of modules (first == last), or None."""
    WHITE, GREY, BLACK = 0, 1, 2
    colour = dict.fromkeys(graph, WHITE)
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        colour[node] = GREY
        path.append(node)
        for nxt in sorted(graph[node]):
            if colour[nxt] == GREY:
                return path[path.index(nxt) :] + [nxt]
            if colour[nxt] == WHITE and (cycle := visit(nxt)):
                return cycle
        path.pop()
        colour[node] = BLACK
        return None

    for start in sorted(graph):
        if colour[start] == WHITE and (cycle := visit(start)):
            return cycle
    return None


def import_graph(package: str) -> dict[str, set[str]]:
    """The import graph of one package's modules: module name -> the package modules it imports."""
    modules = _modules(ROOT / "packages" / package / "src")
    graph = {name: _edges(name, path, modules) for name, path in modules.items()}
    # A parent package's __init__ is executed before any of its submodules; that is not a cycle
    # by itself, so the edge submodule -> its own parent package is dropped.
    for name, targets in graph.items():
        targets.difference_update({t for t in targets if name.startswith(t + ".")})
    return graph


def test_cycle_finder_names_a_cycle():
    """The finder reports a two-module cycle by name and accepts a chain."""
    assert _find_cycle({"a": {"b"}, "b": {"a"}}) == ["a", "b", "a"]
    assert _find_cycle({"a": {"b"}, "b": {"c"}, "c": set()}) is None


@pytest.mark.parametrize("package", PACKAGES)
def test_no_import_cycles(package):
    """No module of the package imports itself back, directly or through other modules."""
    found = _find_cycle(import_graph(package))
    assert found is None, "import cycle: " + " -> ".join(found)
