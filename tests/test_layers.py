"""The package's layers, bottom-up, as data; every import (top-level and inside functions,
`if TYPE_CHECKING:` blocks aside) must go down the layers or stay in its layer, and no
imports may close a cycle.

Imports inside functions (kept there for start-up time: `ddpdeploy render` must not import
kubernetes or docker) follow the same rule: they may only go down. There is no exemption
list. A module that is in no layer fails: add it to LAYERS where it belongs.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "ddpdeploy"

# Bottom-up. "pkg.*" is the package and every module under it; other names are exact.
LAYERS: list[tuple[str, tuple[str, ...]]] = [
    # No project imports but one another: plain facts every room may read.
    # adapters.files (the one atomic writer and safe reader) imports only errors, and the
    # spec reads its file through it: it sits here, though it lives with the adapters.
    # text: outside text as one plain line, for every view and error line.
    (
        "ground",
        (
            "ddpdeploy",
            "errors",
            "image_layout",
            "rules",
            "paths",
            "streams",
            "text",
            "fs",
            "events",
            "signals",
            "obj",
            "formats",
            "report",
        ),
    ),
    ("spec", ("spec.*",)),
    ("contract", ("contract",)),
    # Pure renderers below the targets: the one pod, the policy, output, the Dockerfile.
    ("render", ("render", "render.pod", "render.policy", "render.output")),
    ("targets", ("targets.*",)),
    ("adapters", ("adapters.*",)),
    # Decisions and loops over the outside systems (cluster, smoke runs, image builds). The
    # cluster room (apply, find, labels, jobstate, plan, watch, collect) prints nothing: its
    # views are the commands' (commands.views).
    (
        "operations",
        (
            "cluster.*",
            "smoke.*",
            "image.*",
            "collect.*",
        ),
    ),
    ("commands", ("commands.*",)),
    ("cli", ("cli", "__main__")),
]


def _qualified(entry: str) -> str:
    return "ddpdeploy" if entry == "ddpdeploy" else f"ddpdeploy.{entry}"


def layer_of(module: str) -> int | None:
    """The layer index of ``module``: an exact entry, else the longest "pkg.*" above it."""
    best: tuple[int, int] | None = None  # (length of the match, layer)
    for i, (_, entries) in enumerate(LAYERS):
        for entry in entries:
            if entry.endswith(".*"):
                pkg = _qualified(entry[:-2])
                if module == pkg or module.startswith(pkg + "."):
                    best = max(best or (0, i), (len(pkg), i))
            elif module == _qualified(entry):
                return i
    return best[1] if best else None


def modules() -> dict[str, Path]:
    out = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
        name = ".".join(parts).removesuffix(".__init__")
        out[name] = path
    return out


MODULES = modules()


def _resolve(name: str) -> str | None:
    while name and name not in MODULES:
        name = name.rpartition(".")[0]
    return name or None


def imports(module: str) -> list[tuple[int, str, bool]]:
    """(line, imported module, inside a function) for each project import of ``module``."""
    path = MODULES[module]
    tree = ast.parse(path.read_text(), str(path))
    skipped: set[int] = set()
    in_function: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            skipped |= {id(n) for stmt in node.body for n in ast.walk(stmt)}
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            in_function |= {id(n) for stmt in node.body for n in ast.walk(stmt)}
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    out = []
    for node in ast.walk(tree):
        if id(node) in skipped:
            continue
        targets: list[str | None] = []
        if isinstance(node, ast.Import):
            targets = [_resolve(a.name) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                up = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                base = ".".join([*up, *([base] if base else [])])
            targets = [_resolve(f"{base}.{a.name}") or _resolve(base) for a in node.names]
        for target in targets:
            if target and target != module:
                out.append((node.lineno, target, id(node) in in_function))
    return out


def test_every_module_has_a_layer():
    missing = [m for m in MODULES if layer_of(m) is None]
    assert not missing, (
        f"{', '.join(missing)}: in no layer; add each to LAYERS in tests/test_layers.py "
        "where it belongs (it may import only its own layer and those below)"
    )


def test_imports_go_down_the_layers():
    wrong = []
    for module in MODULES:
        here = layer_of(module)
        for line, target, lazy in imports(module):
            there = layer_of(target)
            if here is None or there is None or there <= here:
                continue
            how = "inside a function (start-up time is no excuse upwards)" if lazy else ""
            wrong.append(
                f"{MODULES[module].relative_to(PACKAGE.parent)}:{line}: {module} "
                f"({LAYERS[here][0]}) imports {target} ({LAYERS[there][0]}) {how}".rstrip()
            )
    assert not wrong, "imports up the layers:\n" + "\n".join(wrong)


def test_no_import_cycle():
    graph = {m: {t for _, t, _ in imports(m)} for m in MODULES}
    lines = {(m, t): line for m in MODULES for line, t, _ in imports(m)}
    # Tarjan's strongly connected components: any with two or more modules is a cycle.
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    cycles: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while (w := stack.pop()) != v:
                comp.append(w)
            comp.append(v)
            if len(comp) > 1:
                cycles.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    described = [
        "; ".join(
            f"{MODULES[m].relative_to(PACKAGE.parent)}:{lines[m, t]}: {m} imports {t}"
            for m in comp
            for t in sorted(graph[m] & set(comp))
        )
        for comp in cycles
    ]
    assert not cycles, "import cycles:\n" + "\n".join(described)


@pytest.mark.parametrize(
    ("module", "layer"),
    [
        ("ddpdeploy.targets.pytorchjob.objects", "targets"),
        ("ddpdeploy.render.pod", "render"),
        ("ddpdeploy.spec.model", "spec"),
        ("ddpdeploy.cluster.apply", "operations"),
        ("ddpdeploy.cluster.find", "operations"),
        ("ddpdeploy.commands.views", "commands"),
        ("ddpdeploy.text", "ground"),
        ("ddpdeploy", "ground"),
        ("ddpdeploy.render.new_renderer", None),  # render's modules are placed one by one
        ("ddpdeploy.new_module", None),
    ],
)
def test_layer_table_matches_as_documented(module, layer):
    found = layer_of(module)
    assert (LAYERS[found][0] if found is not None else None) == layer


def test_the_checks_see_imports_inside_functions_and_skip_type_checking():
    found = {(t, lazy) for _, t, lazy in imports("ddpdeploy.commands.up")}
    assert ("ddpdeploy.cluster.apply", True) in found  # imported inside up() for start-up time
    assert not any(t == "ddpdeploy.spec" for _, t, _ in imports("ddpdeploy.targets.base"))
