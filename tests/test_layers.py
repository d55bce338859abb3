"""The architecture, checked with ast: layers, no cycles, composition, the simulator.

- Each module imports only modules below it in :data:`ORDER`; imports under
  ``if TYPE_CHECKING:`` and inside functions count too, so there is no
  import cycle of any kind.
- No class inherits from a walchannel class of another module (exceptions
  and ``typing.Protocol`` interfaces aside): objects are composed.
- The driver and the log's decisions do no I/O; the read-only tools never
  load grpc or httpx; the channel loads grpc only through its transport.
- ``tools/sim.py`` drives the product through its public names and seams:
  it imports no decision module and no private name of walchannel.
"""

from __future__ import annotations

import ast
import subprocess
import sys

from conftest import ROOT

# Each module may import only modules earlier in this list (or the stdlib and
# third-party packages). A package's modules come before the package itself.
ORDER = [
    # The base: no walchannel import below them but each other.
    "walchannel._version",
    "walchannel._proto",
    "walchannel._killpoints",
    "walchannel.formatting",
    "walchannel._logging",
    "walchannel.errors",
    "walchannel._reentry",
    "walchannel.clock",
    # wire/: what goes on the wire (payload rules, message shapes, protobuf, addresses).
    "walchannel.wire.payload",
    "walchannel.wire.protobuf",
    "walchannel.wire.messages",
    "walchannel.wire.address",
    "walchannel.wire",
    "walchannel.contract",
    # log/: the per-run SQLite log (its pure state machine first).
    "walchannel.log.state",
    "walchannel.log.files",
    "walchannel.log.lock",
    "walchannel.log.format",
    "walchannel.log.writer",
    "walchannel.log.reader",
    "walchannel.log.replication",
    "walchannel.log.view",
    "walchannel.log",
    # The user's options.
    "walchannel.config",
    # core/: the run's decisions (values in, decisions out).
    "walchannel.core.end_status",
    "walchannel.core.events",
    "walchannel.core.actions",
    "walchannel.core.checkpoints",
    "walchannel.core.ages",
    "walchannel.core.watchdog",
    "walchannel.core.engine_refusals",
    "walchannel.core.driver",
    "walchannel.core",
    # transport/: the seam, discovery, gRPC.
    "walchannel.transport.base",
    "walchannel.transport.discovery",
    "walchannel.transport.grpc",
    "walchannel.transport",
    # channel/: the durable channel over them.
    "walchannel.channel.interface",
    "walchannel.channel.row_source",
    "walchannel.channel.metrics",
    "walchannel.channel.replica",
    "walchannel.channel.repeats",
    "walchannel.channel.reclaim",
    "walchannel.channel.reporting",
    "walchannel.channel.refused_rows",
    "walchannel.channel.group_commit",
    "walchannel.channel.waiters",
    "walchannel.channel.stream",
    "walchannel.channel.connection",
    "walchannel.channel.grpc_channel",
    "walchannel.channel.seams",
    "walchannel.channel.handoff",
    "walchannel.channel.blocking",
    "walchannel.channel",
    "walchannel.grace",
    # runner/: a harness's run, owned.
    "walchannel.runner.exits",
    "walchannel.runner.manifest",
    "walchannel.runner.context",
    "walchannel.runner.run",
    "walchannel.runner",
    # The conformance kit: raw stubs against another team's engine; never the channel.
    "walchannel.conformance.probe",
    "walchannel.conformance.hooks",
    "walchannel.conformance.checks",
    "walchannel.conformance.report",
    "walchannel.conformance",
    "walchannel.testing.store",
    "walchannel.testing._http",
    "walchannel.testing.servicer",
    "walchannel.testing.engine.__main__",
    "walchannel.testing.engine",
    "walchannel.testing.discovery",
    "walchannel.testing.memory",
    "walchannel.testing.proxy",
    "walchannel.testing.plugin",
    "walchannel.testing",
    # The package face (its names, re-exported lazily): what a harness imports.
    "walchannel",
    # cli/: the commands, a module per family, wired in walchannel.cli.
    "walchannel.cli.inspection",
    "walchannel.cli.watch",
    "walchannel.cli.common",
    "walchannel.cli.logs",
    "walchannel.cli.flush",
    "walchannel.cli.replication",
    "walchannel.cli.run",
    "walchannel.cli.conformance",
    "walchannel.cli",
    "walchannel.__main__",
]
# A package's __main__ runs the package: it sits above the package's __init__.
_ABOVE_THEIR_PACKAGE = {"walchannel.testing.engine.__main__": "walchannel.testing.engine"}

# Modules that must never import grpc, httpx or the channel (light and sans-I/O).
NO_NETWORK = {
    "walchannel.errors",
    "walchannel._reentry",
    "walchannel.wire.payload",
    "walchannel.log.files",
    "walchannel.log.lock",
    "walchannel.clock",
    "walchannel.log.state",
    "walchannel.core.end_status",
    "walchannel.core.events",
    "walchannel.core.actions",
    "walchannel.core.checkpoints",
    "walchannel.core.ages",
    "walchannel.core.watchdog",
    "walchannel.core.engine_refusals",
    "walchannel.core.driver",
    "walchannel.log.format",
    "walchannel.log.writer",
    "walchannel.wire.protobuf",
    "walchannel.wire.address",
    "walchannel.config",
    "walchannel.wire.messages",
    "walchannel.channel.row_source",
    "walchannel.transport.base",
    "walchannel.channel.interface",
    "walchannel.grace",
    "walchannel.channel.metrics",
    "walchannel.log.reader",
    "walchannel.formatting",
    "walchannel.cli.inspection",
    "walchannel.cli.watch",
    "walchannel.cli.logs",
    "walchannel.log.replication",
    "walchannel.channel.reclaim",
    "walchannel.channel.refused_rows",
    "walchannel.channel.reporting",
    "walchannel.channel.group_commit",
    "walchannel.channel.waiters",
}
# The run's decisions: values in, decisions out; no I/O, no clock.
NO_IO = {
    "walchannel.core.driver",
    "walchannel.core.events",
    "walchannel.core.actions",
    "walchannel.core.end_status",
    "walchannel.core.checkpoints",
    "walchannel.core.ages",
    "walchannel.core.watchdog",
    "walchannel.core.engine_refusals",
    "walchannel.log.state",
}


def rank(module: str) -> int:
    for i, prefix in enumerate(ORDER):
        # The package itself ranks alone: its modules are placed one by one.
        if module == prefix or (prefix != "walchannel" and module.startswith(prefix + ".")):
            if prefix in _ABOVE_THEIR_PACKAGE.values() and module != prefix:
                continue
            return i
    raise AssertionError(f"{module} is not placed in ORDER")


def modules() -> dict[str, ast.Module]:
    found = {}
    for path in (ROOT / "walchannel").rglob("*.py"):
        rel = path.relative_to(ROOT).with_suffix("")
        name = ".".join(rel.parts).removesuffix(".__init__")
        if name.startswith("walchannel._proto"):
            continue
        found[name] = ast.parse(path.read_text(), str(path))
    return found


def imports(tree: ast.Module, module: str, *, typing: bool = True) -> list[str]:
    """The modules (and ``module.Name``) ``tree`` imports, anywhere in it.

    ``typing=False`` leaves out imports under ``if TYPE_CHECKING:`` (they
    never load at run time).
    """
    typing_only: set[int] = set()
    if not typing:
        for node in ast.walk(tree):
            if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
                typing_only.update(id(n) for stmt in node.body for n in ast.walk(stmt))
    out = []
    package = module if module in PACKAGES else module.rsplit(".", 1)[0]
    for node in ast.walk(tree):
        if id(node) in typing_only:
            continue
        if isinstance(node, ast.Import):
            out += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = f"{package}.{base}".rstrip(".")
            names = [f"{base}.{alias.name}" for alias in node.names]
            # `from walchannel import files` loads a module, not the package's
            # names: only a name defined in the package counts as importing it.
            if not all(_is_module(n) for n in names):
                out.append(base)
            out += names
    return out


def _is_module(dotted: str) -> bool:
    path = ROOT.joinpath(*dotted.split("."))
    return path.with_suffix(".py").is_file() or (path / "__init__.py").is_file()


PACKAGES = {
    ".".join(p.relative_to(ROOT).parent.parts)
    for p in (ROOT / "walchannel").rglob("__init__.py")
    if "_proto" not in p.parts
}


def graph() -> dict[str, set[str]]:
    """``module -> the walchannel modules it imports`` (type-only and lazy imports included)."""
    trees = modules()
    edges: dict[str, set[str]] = {}
    for name, tree in trees.items():
        edges[name] = set()
        for imported in imports(tree, name):
            target = imported
            while target and target not in trees and "." in target:
                target = target.rsplit(".", 1)[0]  # an attribute: from walchannel.x import Name
            # Only an import of the package's own names reaches the package (imports()
            # lists it then); a module outside the graph (_proto) does not.
            if target == "walchannel" and imported != "walchannel":
                continue
            if target in trees and target != name:
                edges[name].add(target)
    return edges


def test_every_module_is_placed_and_imports_only_lower_layers() -> None:
    for name, targets in graph().items():
        own = rank(name)
        for target in targets:
            assert rank(target) < own or target == _ABOVE_THEIR_PACKAGE.get(name), (
                f"{name} imports {target}, a higher layer"
            )


def test_the_library_never_imports_the_demo() -> None:
    # The demo is an example beside the package (examples/demo), never shipped in it.
    for name, tree in modules().items():
        targets = imports(tree, name)
        demo = sorted(t for t in targets if t == "demo" or t.startswith("demo."))
        assert not demo, f"{name} imports {demo}: the library never imports the demo"
    assert not (ROOT / "walchannel" / "demo").exists()


def test_each_folder_is_one_layer() -> None:
    # A folder's modules sit together in ORDER, so no folder imports one above
    # it and is imported back: the layers read in the tree as they are checked.
    folders = [name.split(".")[1] for name in ORDER if name.count(".") >= 1]
    folders = [f for f in folders if (ROOT / "walchannel" / f).is_dir() and f != "_proto"]
    runs = [f for i, f in enumerate(folders) if i == 0 or folders[i - 1] != f]
    assert len(runs) == len(set(runs)), f"a folder is split in ORDER: {runs}"


def test_there_is_no_import_cycle_not_even_a_type_only_one() -> None:
    edges = graph()
    state: dict[str, int] = {}

    def visit(node: str, path: list[str]) -> None:
        state[node] = 1
        for nxt in sorted(edges[node]):
            if state.get(nxt) == 1:
                cycle = [*path[path.index(nxt) :], nxt] if nxt in path else [node, nxt]
                raise AssertionError(f"import cycle: {' -> '.join(cycle)}")
            if nxt not in state:
                visit(nxt, [*path, nxt])
        state[node] = 2

    for module in sorted(edges):
        if module not in state:
            visit(module, [module])


def test_order_lists_only_real_modules() -> None:
    names = set(modules()) | {"walchannel._proto"}
    for prefix in ORDER:
        assert any(n == prefix or n.startswith(prefix + ".") for n in names), prefix


def _classes() -> dict[str, dict[str, ast.ClassDef]]:
    return {
        name: {n.name: n for n in tree.body if isinstance(n, ast.ClassDef)}
        for name, tree in modules().items()
    }


def test_objects_are_composed_not_assembled_from_bases_in_other_modules() -> None:
    # A walchannel class may subclass a walchannel class of another module only
    # when that base is an exception or a typing.Protocol (an interface).
    trees = modules()
    classes = _classes()
    allowed_roots = {"Exception", "Protocol", "Warning", "UserWarning", "ValueError"}

    def is_interface_or_error(module: str, cls: ast.ClassDef) -> bool:
        for base in cls.bases:
            text = ast.unparse(base).split("[")[0].split(".")[-1]
            if text in allowed_roots or text.endswith(("Error", "Warning")):
                return True
            if text in classes[module] and is_interface_or_error(module, classes[module][text]):
                return True
        return False

    for name, tree in trees.items():
        imported: dict[str, str] = {}
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("walchannel"):
                for alias in node.names:
                    imported[alias.asname or alias.name] = node.module or ""
        for cls in classes[name].values():
            for base in cls.bases:
                text = ast.unparse(base).split("[")[0]
                source = imported.get(text)
                if source is None or source.startswith("walchannel._proto"):
                    continue
                base_def = classes.get(source, {}).get(text)
                assert base_def is not None and is_interface_or_error(source, base_def), (
                    f"{name}.{cls.name} inherits {source}.{text}: compose it instead"
                )


def test_no_class_declares_methods_for_others_to_fill() -> None:
    # No base of stubs: a method whose whole body raises NotImplementedError.
    for name, classes in _classes().items():
        for cls in classes.values():
            if any(ast.unparse(b).endswith("Protocol") for b in cls.bases):
                continue
            for item in cls.body:
                if not isinstance(item, ast.FunctionDef | ast.AsyncFunctionDef):
                    continue
                body = [s for s in item.body if not isinstance(s, ast.Expr)]
                stub = len(body) == 1 and isinstance(body[0], ast.Raise)
                stub = stub and "NotImplementedError" in ast.unparse(body[0])
                assert not stub, f"{name}.{cls.name}.{item.name} is a stub for others to fill"


def networked(target: str) -> bool:
    """Whether importing ``target`` may load grpc or httpx: the channel, discovery, gRPC.

    The channel's light modules (in :data:`NO_NETWORK`) are not.
    """
    prefixes = ("walchannel.channel", "walchannel.transport.discovery", "walchannel.transport.grpc")
    light = any(target == m or target.startswith(m + ".") for m in NO_NETWORK)
    return target.startswith(prefixes) and not light


def test_light_modules_never_import_the_network() -> None:
    trees = modules()
    for name in NO_NETWORK:
        for target in imports(trees[name], name, typing=False):
            root = target.split(".")[0]
            assert root not in {"grpc", "httpx"}, f"{name} imports {target}"
            assert not networked(target), f"{name} imports {target}"


def closure(module: str, trees: dict[str, ast.Module]) -> dict[str, list[str]]:
    """Every import done at run time by ``module`` and the walchannel modules it loads.

    Imports inside functions count: they load when the code runs.

    Returns:
        ``{module: its imports}`` for ``module`` and each walchannel module reached.
    """
    seen: dict[str, list[str]] = {}
    todo = [module]
    while todo:
        name = todo.pop()
        if name in seen or name not in trees:
            continue
        seen[name] = imports(trees[name], name, typing=False)
        todo += [t for t in seen[name] if t in trees]
    return seen


# The read-only tools and the format they read: neither they nor anything
# they load, at import or when run, may import grpc, httpx or the channel.
READ_ONLY_TOOLS = (
    "walchannel.log.format",
    "walchannel.log.reader",
    "walchannel.formatting",
    "walchannel.cli.inspection",
    "walchannel.cli.watch",
    "walchannel.cli.logs",  # the inspect, export and prune commands
)


def test_the_read_only_tools_never_load_grpc() -> None:
    trees = modules()
    for start in READ_ONLY_TOOLS:
        assert start in trees and start in NO_NETWORK, start
        for name, targets in closure(start, trees).items():
            for target in targets:
                assert target.split(".")[0] not in {"grpc", "httpx"}, (
                    f"{start} loads {name}, which imports {target}"
                )
                assert not networked(target) and not target.startswith("walchannel.cli.flush"), (
                    f"{start} loads {name}, which imports {target}"
                )


def test_the_conformance_kit_speaks_raw_messages_never_through_the_channel() -> None:
    # The channel tolerates and hides what an engine does wrong; a check must see it.
    trees = modules()
    for name, targets in closure("walchannel.conformance", trees).items():
        for target in targets:
            assert not target.startswith(
                ("walchannel.channel", "walchannel.core.driver", "walchannel.log.writer")
            ), f"walchannel.conformance loads {name}, which imports {target}"
            assert not target.startswith("walchannel.testing"), (name, target)


def test_flush_is_the_command_that_loads_grpc_and_only_when_it_runs() -> None:
    trees = modules()
    flush = trees["walchannel.cli.flush"]
    assert "grpc" in imports(flush, "walchannel.cli.flush", typing=False)
    # Not at import time: the CLI imports walchannel.cli.flush for every command.
    top = ast.Module(
        body=[n for n in flush.body if isinstance(n, ast.Import | ast.ImportFrom)],
        type_ignores=[],
    )
    for target in imports(top, "walchannel.cli.flush", typing=False):
        assert target.split(".")[0] not in {"grpc", "httpx"}, target
        assert not networked(target), target
    # The CLI wiring itself imports neither.
    for target in imports(trees["walchannel.cli"], "walchannel.cli", typing=False):
        assert target.split(".")[0] not in {"grpc", "httpx"}, target


def test_the_decisions_do_no_io() -> None:
    # The driver (the run's protocol) and log_state (the log's decisions)
    # take values and return decisions: no I/O, no clock, no awaiting.
    trees = modules()
    for module in NO_IO:
        for name, targets in closure(module, trees).items():
            for target in targets:
                root = target.split(".")[0]
                assert root not in {
                    "asyncio",
                    "sqlite3",
                    "socket",
                    "os",
                    "time",
                    "grpc",
                    "httpx",
                    "msgpack",
                }, (module, name, target)
                if target.startswith("walchannel."):
                    # Each other: the decisions; errors and how text is shown
                    # (errors' str escapes): pure.
                    pure = NO_IO | {"walchannel.errors", "walchannel.formatting"}
                    assert any(target == m or target.startswith(m + ".") for m in pure), (
                        name,
                        target,
                    )
        tree = trees[module]
        assert not [n for n in ast.walk(tree) if isinstance(n, ast.Await | ast.AsyncFunctionDef)]


def test_the_channel_loads_grpc_and_httpx_only_through_its_transport() -> None:
    # The channel, its streams and the seams import neither: the simulator runs
    # them without grpc; GrpcTransport (and the replica gate) load them.
    code = (
        "import sys\n"
        "import walchannel.channel.grpc_channel, walchannel.transport.base, walchannel.clock\n"
        "print(sorted({m.split('.')[0] for m in sys.modules} & {'grpc', 'httpx'}))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=ROOT
    )
    assert out.stdout.strip() == "[]"


def test_the_row_source_loads_neither_grpc_nor_the_channel() -> None:
    # Rows become UpMessage bytes with protobuf alone (walchannel.wire.protobuf); the
    # stream's writer is the one that writes them.
    trees = modules()
    for name, targets in closure("walchannel.channel.row_source", trees).items():
        for target in targets:
            assert target.split(".")[0] not in {"grpc", "httpx", "asyncio"}, (name, target)
            assert not target.startswith("walchannel.channel"), (name, target)


# -- the simulator runs the product, not a copy of it ------------------------------------

#: What tools/sim.py may import from walchannel: the public API, the storage
#: seam (RunLog.on_connection), the network and clock seams, the wire contract.
SIM_MAY_IMPORT = {
    "walchannel",
    "walchannel.clock",
    "walchannel.config",
    "walchannel.contract",
    "walchannel.errors",
    "walchannel.log.writer",
    "walchannel.log.format",
    "walchannel.log.state",
    "walchannel.runner",  # Seams: what the runner lets the simulator replace
    "walchannel.channel.row_source",  # its page knobs, shrunk in some schedules
    "walchannel.channel.seams",  # the one door to the channel's seams
    "walchannel.transport.base",
    "walchannel.wire.protobuf",
}


def _private_names_of_walchannel() -> set[str]:
    names: set[str] = set()
    for tree in modules().values():
        for node in ast.walk(tree):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
                names.add(node.name)
            elif (
                isinstance(node, ast.Attribute)
                and isinstance(node.value, ast.Name)
                and node.value.id == "self"
            ):
                names.add(node.attr)
    return {n for n in names if n.startswith("_") and not n.startswith("__")}


def test_the_simulator_imports_only_the_world_and_public_names() -> None:
    sim_path = ROOT / "tools" / "sim.py"
    tree = ast.parse(sim_path.read_text(), str(sim_path))
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.startswith("walchannel"):
                    assert alias.name in SIM_MAY_IMPORT, alias.name
        elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith("walchannel"):
            assert node.module in SIM_MAY_IMPORT, node.module
            for alias in node.names:
                assert not alias.name.startswith("_"), f"{node.module}.{alias.name}"
    # No private name of walchannel is touched: the sim defines its own world
    # and calls the product through public names and the seams.
    own = {
        n.attr
        for n in ast.walk(tree)
        if isinstance(n, ast.Attribute) and isinstance(n.value, ast.Name) and n.value.id == "self"
    } | {
        n.name
        for n in ast.walk(tree)
        if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef)
    }
    product_private = _private_names_of_walchannel() - own
    used = {n.attr for n in ast.walk(tree) if isinstance(n, ast.Attribute)}
    assert not used & product_private, sorted(used & product_private)
    assert "class SimDriver" not in sim_path.read_text()


#: Modules that hold two classes with behaviour: each pair is one responsibility.
TWO_CLASSES = {
    "walchannel.transport.grpc": "the grpc.aio adapter: the transport, the call it dials",
    "walchannel.log.lock": "the owner lock and the owner identity it writes",
    "walchannel.runner.context": "one item's context, as a thread's scan and a coroutine's see it",
    "walchannel.testing._http": "a test HTTP server and its request handler",
    "walchannel.testing.proxy": "the fault proxy and one proxied flow",
    "walchannel.testing.servicer": "the test engine's servicer and one of its streams",
}
#: Modules that hold three, each trio one responsibility.
THREE_CLASSES = {
    "walchannel.channel.metrics": "the instruments, the channel's metrics, the oldest-row tracker",
    "walchannel.config": "the config's values: Backoff and GroupCommit are fields of the config",
}


def _behaviour_classes(tree: ast.Module) -> list[str]:
    """Top-level classes with methods of their own; values (enums, tuples, errors) aside."""
    values = ("Enum", "NamedTuple", "Protocol", "TypedDict", "Error", "Exception", "Warning")
    found = []
    for node in tree.body:
        if not isinstance(node, ast.ClassDef):
            continue
        if any(ast.unparse(b).split("[")[0].endswith(values) for b in node.bases):
            continue
        own = [
            f
            for f in node.body
            if isinstance(f, ast.FunctionDef | ast.AsyncFunctionDef)
            and not (f.name.startswith("__") and f.name.endswith("__"))
            and not any(ast.unparse(d) in ("property", "staticmethod") for d in f.decorator_list)
        ]
        if own:
            found.append(node.name)
    return found


def test_modules_hold_one_class_each_at_most_or_small_values() -> None:
    # One object a module, read top to bottom; the pairs above are named, with why.
    seen = {name: _behaviour_classes(tree) for name, tree in modules().items()}
    for name, found in seen.items():
        allowed = 3 if name in THREE_CLASSES else 2 if name in TWO_CLASSES else 1
        assert len(found) <= allowed, f"{name} holds {found}: one class with behaviour a module"
    stale = [n for n in TWO_CLASSES.keys() | THREE_CLASSES if len(seen.get(n, [])) < 2]
    assert not stale, f"allowed more classes than they hold: {stale}"
    assert seen["walchannel.log.writer"] == ["RunLog"]
    assert seen["walchannel.channel.grpc_channel"] == ["GrpcEngineChannel"]
    assert seen["walchannel.core.driver"] == ["Driver"]
