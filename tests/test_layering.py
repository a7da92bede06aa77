"""The layering of docs/architecture.md ("The rules"), checked on the source: imports point down the layers
(lazy imports inside functions count too), no import cycles between modules nor between folders, and the
faces never import a concrete backend. Modules are split by job, never to meet a line count (no cap here)."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

PKG = Path(__file__).resolve().parent.parent / "gpusession"

# lowest first; a module may import its own layer and the ones below. Each layer is folders (or
# modules) of the package, named as docs/architecture.md names them; the longest prefix decides.
LAYERS: list[tuple[str, tuple[str, ...]]] = [
    ("core data", ("core",)),
    ("options", ("configuration",)),
    ("transport", ("transport",)),
    ("backends", ("backends",)),
    ("agent", ("agent",)),
    ("store", ("session.store",)),
    ("session", ("session",)),
    ("words", ("words",)),
    ("ui", ("faces", "widgets", "server", "provisioner", "__init__", "__main__", "labextension")),
]
FACES = ("faces", "widgets", "server", "provisioner")


def layer_of(module: str) -> int:
    """gpusession.backends.docker -> the index of the 'backends' layer."""
    rest = module.split(".")[1:] or ["__init__"]
    best = None
    for i, (_, names) in enumerate(LAYERS):
        for prefix in names:
            n = prefix.count(".") + 1
            if rest[:n] == prefix.split(".") and (best is None or n > best[1]):
                best = (i, n)
    if best is None:
        raise AssertionError(f"{module} is in no layer of tests/test_layering.py: add it")
    return best[0]


def test_the_package_root_holds_only_folders():
    """Issue 20: the flat root of 29 modules became folders named for the layers."""
    loose = sorted(p.name for p in PKG.glob("*.py") if p.name not in ("__init__.py", "__main__.py"))
    assert not loose, f"modules at the package root (put them in a layer's folder): {loose}"


def test_module_names_say_their_job_once():
    """Issue 31: `runtime.py` x2, `registry.py` x2, `transfer*.py` x4, `workspaces.py` x3 made
    "which one?" the first question. A module's name is the package's only one of that name,
    except a package's `__init__`/`__main__`, each backend package's `backend.py` (the plugin's
    entry, named the same in every backend on purpose) and words/, whose modules are named for
    the job they word (words/spend.py says what session/spend.py computes)."""
    seen: dict[str, list[str]] = {}
    for path in PKG.rglob("*.py"):
        rel = path.relative_to(PKG)
        if path.name in ("__init__.py", "__main__.py") or rel.parts[0] == "words":
            continue
        if path.name == "backend.py" and rel.parts[0] == "backends":
            continue
        seen.setdefault(path.name, []).append(str(rel))
    twice = {name: sorted(paths) for name, paths in seen.items() if len(paths) > 1}
    assert not twice, f"module names used more than once (name them for their job): {twice}"


def modules() -> dict[str, Path]:
    out = {}
    for path in sorted(PKG.rglob("*.py")):
        rel = path.relative_to(PKG.parent).with_suffix("")
        name = ".".join(rel.parts)
        if name.endswith(".__init__"):
            name = name[: -len(".__init__")]
        out[name] = path
    return out


def imports_of(name: str, path: Path) -> set[str]:
    """Every gpusession module `name` imports, at any depth of the file."""
    tree = ast.parse(path.read_text())
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(
        tree
    ):  # module level, inside functions and under `if TYPE_CHECKING:` alike
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names if a.name.startswith("gpusession"))
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - (node.level - 1)]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            if not target.startswith("gpusession"):
                continue
            # `from . import service` names a module; `from .x import y` names x (or x.y)
            for alias in node.names:
                candidate = f"{target}.{alias.name}"
                found.add(candidate if candidate in ALL else target)
    return {m for m in found if m in ALL or any(m.startswith(a + ".") for a in ALL)}


ALL = modules()
GRAPH = {
    name: {m for m in imports_of(name, path) if m in ALL and m != name}
    for name, path in ALL.items()
}


def test_imports_point_down_the_layers():
    bad = []
    for name, targets in GRAPH.items():
        for target in targets:
            if layer_of(target) > layer_of(name):
                bad.append(
                    f"{name} ({LAYERS[layer_of(name)][0]}) imports {target} ({LAYERS[layer_of(target)][0]})"
                )
    assert not bad, "\n".join(sorted(bad))


def test_no_import_cycles():
    """Between modules, counting every edge: lazy imports inside functions, `if TYPE_CHECKING:`
    imports and a package's __init__ (importing a module runs its package's __init__ first, so an
    __init__ importing a module that imports the package back is a circle too). Each circle is
    named by its modules (a strongly connected part of the import graph)."""
    circles = [" <-> ".join(sorted(part)) for part in _strongly_connected(GRAPH) if len(part) > 1]
    assert not circles, "import circles:\n" + "\n".join(sorted(circles))


def folder_of(module: str) -> str:
    """The folder node of a module: its first-level folder of the package (gpusession.faces.cli ->
    'gpusession/faces'), a module that LAYERS puts in a layer of its own inside a folder as its own
    node (gpusession.session.store -> 'gpusession/session/store'), the package root's own modules
    (__init__, __main__) as 'gpusession'."""
    rest = module.split(".")[1:]
    for _, names in LAYERS:
        for prefix in names:
            if "." in prefix and rest[: prefix.count(".") + 1] == prefix.split("."):
                return "gpusession/" + prefix.replace(".", "/")
    if not rest or not (PKG / rest[0]).is_dir():
        return "gpusession"
    return f"gpusession/{rest[0]}"


def folder_graph(graph: dict[str, set[str]]) -> dict[str, dict[str, list[str]]]:
    """The module graph seen from the folders: folder -> the folders its modules import -> the
    module edges that make that folder edge ('a imports b')."""
    out: dict[str, dict[str, list[str]]] = {}
    for name, targets in graph.items():
        mine = folder_of(name)
        edges = out.setdefault(mine, {})
        for target in sorted(targets):
            theirs = folder_of(target)
            out.setdefault(theirs, {})
            if theirs != mine:
                edges.setdefault(theirs, []).append(f"{name} imports {target}")
    return out


def folder_loops(graph: dict[str, set[str]]) -> list[str]:
    """Each loop between folders (a strongly connected part of the folder graph, more than one
    folder), named by its folders, with the module imports that close it."""
    folders = folder_graph(graph)
    loops = []
    for part in _strongly_connected({f: set(edges) for f, edges in folders.items()}):
        if len(part) < 2:
            continue
        why = [
            f"    {edge}"
            for a in sorted(part)
            for b, edges in sorted(folders[a].items())
            if b in part
            for edge in edges
        ]
        loops.append(" <-> ".join(sorted(part)) + ":\n" + "\n".join(why))
    return loops


def test_no_import_cycles_between_folders():
    """A folder is one node (gpusession/<folder>/, and the store apart as LAYERS keeps it): no
    loop between folders, even when no two modules import each other. Issue 31: the faces
    imported widgets/ and provisioner/, which imported faces/words.py back; the words are now
    their own layer below every face (gpusession/words/)."""
    loops = folder_loops(GRAPH)
    assert not loops, "import loops between folders:\n" + "\n".join(sorted(loops))


def test_a_folder_loop_without_a_module_cycle_is_found():
    """faces.cli -> widgets.card -> faces.words is no cycle of modules, but one of folders."""
    graph = {
        "gpusession.faces.cli": {
            "gpusession.widgets.card",
            "gpusession.faces.words",
            "gpusession.session.store",
        },
        "gpusession.widgets.card": {"gpusession.faces.words", "gpusession.session"},
        "gpusession.faces.words": {"gpusession.core.models"},
        "gpusession.session": {"gpusession.session.store"},
        "gpusession.session.store": {"gpusession.core.models"},
        "gpusession.core.models": set(),
        "gpusession.__main__": {"gpusession.faces.cli"},
    }
    assert not [p for p in _strongly_connected(graph) if len(p) > 1]
    assert folder_of("gpusession.session.store") == "gpusession/session/store"
    assert folder_of("gpusession.__main__") == folder_of("gpusession") == "gpusession"
    assert folder_loops(graph) == [
        "gpusession/faces <-> gpusession/widgets:\n"
        "    gpusession.faces.cli imports gpusession.widgets.card\n"
        "    gpusession.widgets.card imports gpusession.faces.words"
    ]


def test_lazy_and_typing_only_imports_count(tmp_path):
    """The circles removed in issue 20 hid behind these two: an import under `if TYPE_CHECKING:`
    and one inside a function. Both are edges of the graph, and a circle through them is found."""
    path = tmp_path / "fake.py"
    path.write_text(
        "from typing import TYPE_CHECKING\n"
        "if TYPE_CHECKING:\n    from .store import Store\n"
        "def f():\n    from ..core.models import State\n    import gpusession.core.errors\n"
    )
    assert imports_of("gpusession.session.fake", path) == {
        "gpusession.session.store",
        "gpusession.core.models",
        "gpusession.core.errors",
    }
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a", "d"}, "d": set(), "e": {"e"}}
    assert sorted(sorted(p) for p in _strongly_connected(graph) if len(p) > 1) == [["a", "b", "c"]]


def _strongly_connected(graph: dict[str, set[str]]) -> list[set[str]]:
    """Tarjan's algorithm, iterative (the graph is a few hundred modules deep at most)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    on_stack: set[str] = set()
    stack: list[str] = []
    parts: list[set[str]] = []
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, targets = work[-1]
            nxt = next(targets, None)
            if nxt is not None:
                if nxt not in index:
                    index[nxt] = low[nxt] = len(index)
                    stack.append(nxt)
                    on_stack.add(nxt)
                    work.append((nxt, iter(sorted(graph[nxt]))))
                elif nxt in on_stack:
                    low[node] = min(low[node], index[nxt])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                part = set()
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    part.add(member)
                    if member == node:
                        break
                parts.append(part)
    return parts


def test_the_faces_never_import_a_concrete_backend():
    bad = [
        f"{name} imports {t}"
        for name, targets in GRAPH.items()
        if name.count(".") and name.split(".")[1] in FACES
        for t in targets
        if t.startswith("gpusession.backends.") and t != "gpusession.backends.base"
    ]
    assert not bad, bad


# below every backend: the contract (base) and what any cloud VM needs to boot a session (cloudvm)
SHARED_BELOW_BACKENDS = ("base", "cloudvm")


def test_the_shared_backend_layers_import_no_backend():
    bad = [
        f"{name} imports {t}"
        for name, targets in GRAPH.items()
        if name.split(".")[1:3] in (["backends", s] for s in SHARED_BELOW_BACKENDS)
        for t in targets
        if t.split(".")[1] == "backends"
        and len(t.split(".")) > 2
        and t.split(".")[2] not in SHARED_BELOW_BACKENDS
    ]
    assert not bad, bad


def test_backends_never_import_the_session_layer_or_each_other():
    bad = []
    for name, targets in GRAPH.items():
        parts = name.split(".")
        if (
            len(parts) < 3
            or parts[1] != "backends"
            or parts[2] in SHARED_BELOW_BACKENDS + ("__init__",)
        ):
            continue
        mine = parts[2]  # a backend is one package (or module) below gpusession/backends/
        for t in targets:
            tp = t.split(".")
            if (
                tp[1] == "backends"
                and len(tp) > 2
                and tp[2] not in SHARED_BELOW_BACKENDS
                and tp[2] != mine
            ):
                bad.append(f"{name} imports the sibling backend module {t}")
    assert not bad, bad


def test_the_runtime_boot_script_speaks_the_protocol():
    """boot.sh (the runtime bundle's way into an image) is shell: it cannot import protocol.py or
    bundle.py, so this test keeps its names and paths equal to theirs."""
    from gpusession.core.protocol import ENV_RUNTIME_ROOT, Marker
    from gpusession.transport.bundle import COMPLETE, RUNTIME_ROOT

    text = (PKG / "agent" / "boot.sh").read_text()
    for name in (
        f"ROOT=${{{ENV_RUNTIME_ROOT}:-{RUNTIME_ROOT}}}\n",
        f"{ENV_RUNTIME_ROOT}=$ROOT",
        f"{Marker.FAILED.value} ",
        f'"{Marker.PYTHON.value} "',
        f"$ROOT/code/{COMPLETE}",
        "from gpusession.agent.firststep import main; raise SystemExit(main())' run",
    ):
        assert name in text, name


def test_no_function_over_sixty_lines():
    """Issue 31: functions over 60 lines (16, up to 162) are split by step where the steps have
    names; this keeps them so."""
    long = []
    for path in PKG.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                lines = node.end_lineno - node.lineno + 1
                if lines > 60:
                    long.append(f"{path.relative_to(PKG)}:{node.lineno} {node.name} ({lines})")
    assert not long, f"functions over 60 lines (split them by step): {sorted(long)}"


@pytest.mark.integration
def test_the_kernels_extensions_load_without_the_protocol_or_the_transfer_handler():
    """What the session kernel imports at its start, before its first answer (issue 35: a start
    on a busy machine): the extensions take their names from gpusession.core.kernelwire and
    envnames, not the protocol's types, and the transfer handler's modules come with the first
    transfer request (gpusession.agent.activity._install_transfers)."""
    probe = (
        "import sys\n"
        "import gpusession.agent.activity, gpusession.agent.cellog, gpusession.agent.checkpoint\n"
        "heavy = ('gpusession.core.protocol', 'gpusession.agent.transfer_handler',"
        " 'gpusession.agent.transfer_kinds', 'gpusession.agent.transfer_raw', 'tarfile')\n"
        "print(sorted(m for m in heavy if m in sys.modules))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", probe], cwd=PKG.parent, capture_output=True, text=True, timeout=60
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]", out.stdout
