"""The import graph of emq_django: no cycle, and no arrow up the layers.

Every import counts: at module level, under ``if TYPE_CHECKING``, and inside
functions. The layers are DESIGN.md's ("Layers, and who may touch what"), with the
modules every layer shares placed below them:

0. values: exceptions, ids, wire, registry, logconfig;
1. ``protocol/``: frames, codecs and value types (``protocol/events.py``);
1.5. settings: ``settings_registry`` (declarations) and ``conf`` (the one reader);
1.8. sockets: ``transport`` and the CURVE and role primitives of ``security/``,
     "the one transport module, where CURVE is applied";
2. the broker core (``broker/`` but its server and ports);
2.5. ports (``broker/ports/``);
3. edges: the broker's server loop (and ``broker/ha.py``, the active/standby life
   around it), the job manager and its workers, the client
   side (client, task, handles, pubsub, link, streaming, ...);
4. the Django surface: apps' models, admin, results, scheduler, backends, checks,
   testing;
5. analytics;
6. entry points, which may import anything: ``emq_django`` itself (the public API),
   ``apps.py`` (registration goes up through the AppConfigs) and the management
   commands.
"""

from __future__ import annotations

import ast
from pathlib import Path

import emq_django

PACKAGE = Path(emq_django.__file__).parent
ROOT = PACKAGE.parent

# Cycles and arrows allowed, each with its reason: none. The core's modules name
# a port through ``broker/seam.py`` and the guard through a Protocol of its own;
# the server is given its key loader by ``manage.py emq_broker``.
KNOWN_CYCLES: dict[frozenset[str], str] = {}
KNOWN_UPWARD: dict[tuple[str, str], str] = {}

VALUES = {"exceptions", "ids", "wire", "registry", "logconfig"}
SETTINGS = {"settings_registry", "conf"}
SOCKETS = {"transport", "security.keys", "security.keyfiles", "security.roles"}
SOCKETS |= {"security.allow", "security.zap", "security.handshakes", "security.service"}
DJANGO_APPS = {"results", "scheduler", "backends", "testing", "security"}
DJANGO_MODULES = {"checks", "admin_index", "settings_reference"}


def layer(module: str) -> float:
    name = module.removeprefix("emq_django").lstrip(".")
    top = name.split(".")[0]
    if name in ("", "apps") or top == "management" or ".management." in module:
        return 6
    if name in VALUES:
        return 0
    if top == "protocol":
        return 1
    if name in SETTINGS:
        return 1.5
    if name in SOCKETS:
        return 1.8
    if name.startswith("broker.ports"):
        return 2.5
    if top == "broker" and name not in ("broker.server", "broker.ha"):
        return 2
    if top == "analytics":
        return 5
    if top in DJANGO_APPS or name in DJANGO_MODULES:
        return 4
    return 3


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def modules() -> dict[str, Path]:
    return {module_name(p): p for p in PACKAGE.rglob("*.py") if "migrations" not in p.parts}


def imports_of(name: str, path: Path, known: dict[str, Path]) -> set[str]:
    """The emq_django modules ``path`` imports, wherever the import statement is."""

    def resolve(target: str) -> str | None:
        while target and target not in known:
            target = target.rpartition(".")[0]
        return target or None

    found: set[str | None] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found |= {resolve(a.name) for a in node.names if a.name.startswith("emq_django")}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                package = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
                package = package[: len(package) - node.level + 1]
                base = ".".join(package + ([node.module] if node.module else []))
            if base.startswith("emq_django"):
                found |= {resolve(f"{base}.{a.name}") or resolve(base) for a in node.names}
    found.discard(None)
    found.discard(name)
    return {m for m in found if m is not None}


def import_graph() -> dict[str, set[str]]:
    known = modules()
    return {name: imports_of(name, path, known) for name, path in known.items()}


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def show(component: list[str], graph: dict[str, set[str]]) -> str:
    members = set(component)
    return "\n".join(f"  {m} -> {sorted(graph[m] & members)}" for m in component)


def test_no_import_cycle() -> None:
    graph = import_graph()
    unknown = [c for c in cycles(graph) if frozenset(c) not in KNOWN_CYCLES]
    assert not unknown, "import cycles:\n" + "\n\n".join(show(c, graph) for c in unknown)


def test_no_import_runs_up_the_layers() -> None:
    graph = import_graph()
    upward = [
        f"{a} ({layer(a)}) -> {b} ({layer(b)})"
        for a in sorted(graph)
        for b in sorted(graph[a])
        if layer(b) > layer(a) and (a, b) not in KNOWN_UPWARD
    ]
    assert not upward, "imports up the layers:\n" + "\n".join(upward)


def test_the_core_app_imports_no_optional_app_but_through_its_registration() -> None:
    graph = import_graph()
    assert not {m for m in graph["emq_django.handles"] if m.startswith("emq_django.results")}
    assert not {m for m in graph["emq_django.checks"] if m.startswith("emq_django.scheduler")}


def test_the_graph_sees_type_checking_and_function_imports() -> None:
    graph = import_graph()
    assert "emq_django.broker.state" in graph["emq_django.broker.effects"]  # TYPE_CHECKING
    assert "emq_django.results.lookup" in graph["emq_django.results.apps"]  # inside ready()


# What the poll loop may take from protocol/: the refusal codes every peer shares.
NEUTRAL_PROTOCOL = {"emq_django.protocol.limits"}


def test_the_broker_server_imports_no_protocol_and_no_port_but_through_the_registry() -> None:
    """Issue 31: adding a protocol is a port module and a line in ``PORTS``; the
    server loop names no codec and no port module."""
    imported = import_graph()["emq_django.broker.server"]
    codecs = {m for m in imported if m.startswith("emq_django.protocol")} - NEUTRAL_PROTOCOL
    ports = {m for m in imported if m.startswith("emq_django.broker.ports.")}
    assert not codecs, f"broker/server.py imports codecs: {sorted(codecs)}"
    assert ports <= {"emq_django.broker.ports.base"}, f"and port modules: {sorted(ports)}"
