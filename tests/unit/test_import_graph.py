"""No import circles in services/ and shared/ (STYLE: the floors of the house): the Python
modules, and the portal's ES modules (services/portal/static/js).

Every import counts, wherever it stands: at the top of a module, inside a function, or
under `if TYPE_CHECKING:`. A circle hidden in a function body is still a circle: a reader
following a request down the floors comes back up, and moving the import to the top of
the file breaks at run time. No exemptions: move the shared names down a floor.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("services", "shared")
#: `import ... from "./x.js"`, `import "./x.js"`, `export ... from "./x.js"`, `import("./x.js")`.
JS_IMPORT = re.compile(r"""(?:\bfrom|\bimport)\s*\(?\s*["'](\.{1,2}/[^"']+)["']""")


def modules(root: Path) -> dict[str, Path]:
    """Dotted name -> file, for every Python module under the packages."""
    found: dict[str, Path] = {}
    for package in PACKAGES:
        for path in sorted((root / package).rglob("*.py")):
            parts = path.relative_to(root).with_suffix("").parts
            if parts[-1] == "__init__":
                parts = parts[:-1]
            found[".".join(parts)] = path
    return found


def _imported(tree: ast.AST, name: str, is_package: bool) -> Iterator[str]:
    """Every dotted name an import in `tree` asks for (module, or module.attribute)."""
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield alias.name
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                # Relative: resolve against the importing module's package.
                base = name.split(".")
                base = base if is_package else base[:-1]
                base = base[: len(base) - (node.level - 1)]
                module = ".".join([*base, node.module] if node.module else base)
            else:
                module = node.module or ""
            for alias in node.names:
                yield f"{module}.{alias.name}"
            yield module


def js_graph(root: Path) -> dict[str, set[str]]:
    """ES module (its path) -> the modules of ours it imports (relative specifiers)."""
    edges: dict[str, set[str]] = {}
    for package in PACKAGES:
        for path in sorted((root / package).rglob("*.js")):
            name = path.relative_to(root).as_posix()
            targets = set()
            for specifier in JS_IMPORT.findall(path.read_text()):
                target = (path.parent / specifier).resolve()
                if target.is_file():
                    targets.add(target.relative_to(root.resolve()).as_posix())
            edges[name] = targets
    return edges


def graph(root: Path) -> dict[str, set[str]]:
    """Module -> the project modules it imports (Python by dotted name, ES modules by
    path)."""
    files = modules(root)
    edges: dict[str, set[str]] = js_graph(root)
    for name, path in files.items():
        tree = ast.parse(path.read_text(), filename=str(path))
        targets: set[str] = set()
        for dotted in _imported(tree, name, path.name == "__init__.py"):
            # The longest prefix that is a module of ours: `from a.b import c` is a.b.c
            # when c is a module, else a.b.
            parts = dotted.split(".")
            for end in range(len(parts), 0, -1):
                candidate = ".".join(parts[:end])
                if candidate in files:
                    targets.add(candidate)
                    break
        targets.discard(name)
        edges[name] = targets
    return edges


def circles(edges: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    counter = 0
    for start in sorted(edges):
        if start in index:
            continue
        work = [(start, iter(sorted(edges[start])))]
        index[start] = low[start] = counter
        counter += 1
        stack.append(start)
        on_stack.add(start)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = counter
                    counter += 1
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(edges.get(child, ())))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                parent = work[-1][0]
                low[parent] = min(low[parent], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return found


def describe(edges: dict[str, set[str]], component: list[str]) -> str:
    members = set(component)
    ties = [f"  {a} -> {b}" for a in component for b in sorted(edges[a] & members)]
    return "\n".join([" <-> ".join(component), *ties])


def test_services_and_shared_have_no_import_circle() -> None:
    edges = graph(ROOT)
    found = circles(edges)
    assert not found, "import circles (move the shared names down a floor):\n" + "\n".join(
        describe(edges, component) for component in found
    )


def test_the_walk_sees_every_kind_of_import(tmp_path: Path) -> None:
    """The detector itself: a circle closed by a function-level import, one closed under
    TYPE_CHECKING, and one through `from package import module` are all found."""
    (tmp_path / "shared").mkdir()
    (tmp_path / "services" / "pkg").mkdir(parents=True)
    for init in ("shared", "services", "services/pkg"):
        (tmp_path / init / "__init__.py").write_text("")
    (tmp_path / "shared" / "a.py").write_text("from shared.b import X\n")
    (tmp_path / "shared" / "b.py").write_text("def f():\n    from shared.a import Y\n")
    (tmp_path / "services" / "c.py").write_text(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    import services.pkg.d\n"
    )
    (tmp_path / "services" / "pkg" / "d.py").write_text("from services import c\n")
    (tmp_path / "services" / "pkg" / "e.py").write_text("from . import d\nimport shared.a\n")
    js = tmp_path / "services" / "js"
    (js / "pages").mkdir(parents=True)
    (js / "app.js").write_text('import * as one from "./pages/one.js";\n')
    (js / "pages" / "one.js").write_text('import { go } from "../app.js";\n')
    (js / "pages" / "two.js").write_text('import { go } from "../nav.js";\n')
    (js / "nav.js").write_text("export function go() {}\n")
    edges = graph(tmp_path)
    assert sorted(circles(edges)) == [
        ["services.c", "services.pkg.d"],
        ["services/js/app.js", "services/js/pages/one.js"],
        ["shared.a", "shared.b"],
    ]
