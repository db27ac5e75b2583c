"""The package's import graph against design.md §1 (issue 23, Structure): no import cycle outside
ggml/, no private name (`_x`) imported across modules, and imports only downwards — an inner
layer never imports a front end, and a front end reaches the families through the registry,
never by naming a family module.

The graph is read from the source with `ast` (every import, also those inside functions: a lazy
import closes a cycle as surely as a top-level one, only later), so nothing is imported to
check it."""

from __future__ import annotations

import ast
from pathlib import Path

from moss_tts.models.registry import FAMILIES

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "moss_tts"
INNER = ("models", "nn", "codec", "text", "ggml")
FRONT_ENDS = ("cli", "server", "batch")
# each family's modules, read from its registry row ("moss_tts.models.nano_tts:NanoTTS")
FAMILY_MODULES = {m for f in FAMILIES for m in (f.tts.split(":")[0],
                                                 f.tts.split(":")[0].removesuffix("_tts"))}


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}


def is_package(name: str) -> bool:
    return MODULES[name].name == "__init__.py"


def type_checking_only(tree: ast.AST) -> set[int]:
    """ids of the import nodes under `if TYPE_CHECKING:` (never run)."""
    skipped = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            skipped |= {id(n) for stmt in node.body for n in ast.walk(stmt)}
    return skipped


def imports_of(name: str) -> list[tuple[str, str, int]]:
    """(imported module, imported name or "", line) for each moss_tts import of module `name`;
    `from pkg import sub` of a submodule counts as importing pkg.sub."""
    tree = ast.parse(MODULES[name].read_text(encoding="utf-8"))
    skipped = type_checking_only(tree)
    here = name if is_package(name) else name.rpartition(".")[0]
    found = []
    for node in ast.walk(tree):
        if id(node) in skipped:
            continue
        if isinstance(node, ast.Import):
            found += [(a.name, "", node.lineno) for a in node.names if a.name in MODULES]
        elif isinstance(node, ast.ImportFrom):
            base = here
            for _ in range(node.level - 1):
                base = base.rpartition(".")[0]
            target = node.module if node.level == 0 else \
                ".".join(p for p in (base, node.module) if p)
            if target not in MODULES:
                continue
            for a in node.names:
                sub = f"{target}.{a.name}"
                found.append((sub, "", node.lineno) if sub in MODULES
                             else (target, a.name, node.lineno))
    return found


GRAPH = {name: imports_of(name) for name in MODULES}


def layer(name: str) -> str:
    parts = name.split(".")
    return parts[1] if len(parts) > 1 else ""


def cycles(graph: dict) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan), outside ggml/."""
    edges = {m: {t for t, _, _ in graph[m] if t != m and t in graph} for m in graph}
    index, low, stack, on_stack, found = {}, {}, [], set(), []

    def visit(m: str) -> None:
        index[m] = low[m] = len(index)
        stack.append(m)
        on_stack.add(m)
        for t in edges[m]:
            if t not in index:
                visit(t)
                low[m] = min(low[m], low[t])
            elif t in on_stack:
                low[m] = min(low[m], index[t])
        if low[m] == index[m]:
            component = []
            while True:
                t = stack.pop()
                on_stack.discard(t)
                component.append(t)
                if t == m:
                    break
            if len(component) > 1 and not all(layer(c) == "ggml" for c in component):
                found.append(sorted(component))

    for m in graph:
        if m not in index:
            visit(m)
    return found


def private_imports(graph: dict) -> list[str]:
    return [f"{m}:{line} imports {t}.{n}" for m in graph for t, n, line in graph[m]
            if t != m and n.startswith("_") and not n.startswith("__")]


def upward_imports(graph: dict) -> list[str]:
    return [f"{m}:{line} imports {t}" for m in graph if layer(m) in INNER
            for t, _, line in graph[m] if layer(t) in FRONT_ENDS]


def family_imports(graph: dict) -> list[str]:
    return [f"{m}:{line} imports {t}" for m in graph if layer(m) in FRONT_ENDS
            for t, _, line in graph[m] if t in FAMILY_MODULES]


def test_the_walk_sees_the_package():
    """Guards the checks below against passing on an empty or mis-read graph."""
    assert "moss_tts.models.registry" in MODULES and len(MODULES) > 50
    assert ("moss_tts.errors", "InputError") in {(t, n) for t, n, _ in
                                                 GRAPH["moss_tts.models.registry"]}
    assert FAMILY_MODULES >= {"moss_tts.models.nano", "moss_tts.models.nano_tts"}


def test_each_check_finds_what_it_looks_for():
    """Sensitivity guard: one planted import of each kind is reported."""
    planted = {m: list(edges) for m, edges in GRAPH.items()}
    planted["moss_tts.errors"] = planted["moss_tts.errors"] + [("moss_tts.voices", "", 1)]
    planted["moss_tts.voices"] = planted["moss_tts.voices"] + [("moss_tts.errors", "_x", 2)]
    planted["moss_tts.nn.rope"] = planted["moss_tts.nn.rope"] + [("moss_tts.batch.driver", "", 3)]
    planted["moss_tts.batch.driver"] = planted["moss_tts.batch.driver"] + [
        ("moss_tts.models.nano_tts", "", 4)]
    ggml = sorted(m for m in GRAPH if layer(m) == "ggml")[:2]
    planted[ggml[0]] = planted[ggml[0]] + [(ggml[1], "", 5)]
    planted[ggml[1]] = planted[ggml[1]] + [(ggml[0], "", 6)]
    assert any({"moss_tts.errors", "moss_tts.voices"} <= set(c) for c in cycles(planted))
    assert not [c for c in cycles(planted) if ggml[0] in c]     # ggml/ may cycle
    assert "moss_tts.voices:2 imports moss_tts.errors._x" in private_imports(planted)
    assert "moss_tts.nn.rope:3 imports moss_tts.batch.driver" in upward_imports(planted)
    assert "moss_tts.batch.driver:4 imports moss_tts.models.nano_tts" in family_imports(planted)


def test_no_import_cycle_outside_ggml():
    assert cycles(GRAPH) == []


def test_no_private_name_is_imported_across_modules():
    assert private_imports(GRAPH) == []


def test_no_inner_layer_imports_a_front_end():
    assert upward_imports(GRAPH) == []


def test_no_front_end_imports_a_family_module():
    assert family_imports(GRAPH) == []


# -- sibling families (issue 33, shared pieces in shared rooms) ------------------------------
# a family's own modules: models/<family>*.py and text/<family>_prompts.py, the family named by
# its registry kind where models/ holds a module of that name ("local-v15" → local_v15.py)
FAMILY_NAMES = sorted({f.kind.replace("-", "_") for f in FAMILIES
                       if f"moss_tts.models.{f.kind.replace('-', '_')}" in MODULES}, key=len)
# (LocalTTS and DelayTTS share their prompt half through models/message_tts.py, §family-3.5)


def family_of(name: str) -> str | None:
    """The family whose module `name` is (the longest family name it is, or starts with + "_"),
    or None for a shared module."""
    pkg, _, stem = name.removeprefix("moss_tts.").rpartition(".")
    if pkg == "text":
        if not stem.endswith("_prompts"):
            return None
        stem = stem.removesuffix("_prompts")
    elif pkg != "models":
        return None
    owners = [f for f in FAMILY_NAMES if stem == f or stem.startswith(f + "_")]
    return owners[-1] if owners else None


def sibling_imports(graph: dict) -> list[str]:
    return sorted({f"{m} imports {t}" for m in graph if family_of(m)
                   for t, _, _ in graph[m] if family_of(t) not in (None, family_of(m))})


def test_a_family_module_imports_only_its_own_modules_and_shared_ones():
    assert {"delay", "local", "local_v15", "nano", "realtime"} <= set(FAMILY_NAMES)
    assert (family_of("moss_tts.models.local_v15_decode"), family_of("moss_tts.models.local"),
            family_of("moss_tts.text.delay_prompts"), family_of("moss_tts.models.rows")) == \
        ("local_v15", "local", "delay", None)
    planted = dict(GRAPH, **{"moss_tts.models.local_v15": GRAPH["moss_tts.models.local_v15"] + [
        ("moss_tts.models.nano", "", 1)]})       # sensitivity guard: a planted sibling import
    assert "moss_tts.models.local_v15 imports moss_tts.models.nano" in sibling_imports(planted)
    assert sibling_imports(GRAPH) == [], sibling_imports(GRAPH)
