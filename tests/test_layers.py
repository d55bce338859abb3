"""The architecture: lower layers never import upper ones (checked with ast)."""

from __future__ import annotations

import ast
from pathlib import Path

from conftest import ROOT

# Each module may import only modules earlier in this list (or the stdlib and
# third-party packages). testing, demo and the command's modules come last.
ORDER = [
    "walchannel._proto",
    "walchannel._killpoints",
    "walchannel.errors",
    "walchannel.payload",
    "walchannel.files",
    "walchannel.lock",
    "walchannel.log_state",
    "walchannel.protocol",
    "walchannel.session",
    "walchannel.log_format",
    # RunLog's parts, then the class (walchannel/log/__init__.py).
    "walchannel.log.base",
    "walchannel.log.disk",
    "walchannel.log.transactions",
    "walchannel.log.quarantine",
    "walchannel.log.opening",
    "walchannel.log",
    # Reading a log without writing (inspect, export, flush).
    "walchannel.log_reader",
    "walchannel.replication",
    "walchannel.wire",
    "walchannel.contract",
    "walchannel.address",
    "walchannel.config",
    "walchannel.messages",
    "walchannel.row_source",
    "walchannel.interface",
    "walchannel.metrics",
    "walchannel.discovery",
    # GrpcEngineChannel's parts, then the class (walchannel/channel/__init__.py).
    "walchannel.channel.base",
    "walchannel.channel.dial",
    "walchannel.channel.replica",
    "walchannel.channel.acks",
    "walchannel.channel.sending",
    "walchannel.channel.stream",
    "walchannel.channel",
    "walchannel.blocking",
    "walchannel.formatting",
    "walchannel.inspection",
    "walchannel.watch",
    "walchannel.testing",
    "walchannel.demo",
    "walchannel.demo_hostloss",
    "walchannel.cli_logs",
    "walchannel.flush",
    "walchannel.cli",
    "walchannel.__main__",
]
# Modules that must never import grpc, httpx or the channel (light and sans-I/O).
NO_NETWORK = {
    "walchannel.errors",
    "walchannel.payload",
    "walchannel.files",
    "walchannel.lock",
    "walchannel.log_state",
    "walchannel.protocol",
    "walchannel.session",
    "walchannel.log_format",
    "walchannel.log",
    "walchannel.log.base",
    "walchannel.log.disk",
    "walchannel.log.transactions",
    "walchannel.log.quarantine",
    "walchannel.log.opening",
    "walchannel.wire",
    "walchannel.address",
    "walchannel.config",
    "walchannel.messages",
    "walchannel.row_source",
    "walchannel.interface",
    "walchannel.metrics",
    "walchannel.log_reader",
    "walchannel.formatting",
    "walchannel.inspection",
    "walchannel.watch",
    "walchannel.cli_logs",
    "walchannel.replication",
}
NO_IO = {"walchannel.protocol", "walchannel.log_state", "walchannel.session"}


def rank(module: str) -> int:
    for i, prefix in enumerate(ORDER):
        if module == prefix or module.startswith(prefix + "."):
            return i
    raise AssertionError(f"{module} is not placed in ORDER")


def modules() -> dict[str, ast.Module]:
    found = {}
    for path in (ROOT / "walchannel").rglob("*.py"):
        rel = path.relative_to(ROOT).with_suffix("")
        name = ".".join(rel.parts).removesuffix(".__init__")
        if name.startswith("walchannel._proto") or name == "walchannel":
            continue
        found[name] = ast.parse(path.read_text(), str(path))
    return found


def imports(tree: ast.Module, module: str) -> list[str]:
    """Imports done at run time (those under ``if TYPE_CHECKING:`` are for mypy only)."""
    typing_only: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            typing_only.update(id(n) for stmt in node.body for n in ast.walk(stmt))
    out = []
    package = module.rsplit(".", 1)[0]
    for node in ast.walk(tree):
        if id(node) in typing_only:
            continue
        if isinstance(node, ast.Import):
            out += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = f"{package}.{base}".rstrip(".")
            out += [base] + [f"{base}.{alias.name}" for alias in node.names]
    return out


def test_every_module_is_placed_and_imports_only_lower_layers() -> None:
    for name, tree in modules().items():
        own = rank(name)
        for target in imports(tree, name):
            if not target.startswith("walchannel.") or target.startswith(name):
                continue
            try:
                theirs = rank(target)
            except AssertionError:
                continue  # an attribute import (from walchannel.x import Name)
            assert theirs <= own or (
                target.startswith("walchannel.testing") and own >= rank("walchannel.testing")
            ), f"{name} imports {target}, a higher layer"


def test_light_modules_never_import_the_network() -> None:
    trees = modules()
    for name in NO_NETWORK & set(trees):
        for target in imports(trees[name], name):
            root = target.split(".")[0]
            assert root not in {"grpc", "httpx"}, f"{name} imports {target}"
            assert not target.startswith(("walchannel.channel", "walchannel.discovery")), (
                f"{name} imports {target}"
            )


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
        seen[name] = imports(trees[name], name)
        todo += [t for t in seen[name] if t in trees]
    return seen


# The read-only tools and the format they read: neither they nor anything
# they load, at import or when run, may import grpc, httpx or the channel.
READ_ONLY_TOOLS = (
    "walchannel.log_format",
    "walchannel.log_reader",
    "walchannel.formatting",
    "walchannel.inspection",
    "walchannel.watch",
    "walchannel.cli_logs",  # the inspect, export and prune commands
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
                assert not target.startswith(
                    ("walchannel.channel", "walchannel.discovery", "walchannel.flush")
                ), f"{start} loads {name}, which imports {target}"


def test_flush_is_the_command_that_loads_grpc_and_only_when_it_runs() -> None:
    trees = modules()
    flush = trees["walchannel.flush"]
    assert "grpc" in imports(flush, "walchannel.flush")
    # Not at import time: the CLI imports walchannel.flush for every command.
    top = ast.Module(
        body=[n for n in flush.body if isinstance(n, ast.Import | ast.ImportFrom)],
        type_ignores=[],
    )
    for target in imports(top, "walchannel.flush"):
        assert target.split(".")[0] not in {"grpc", "httpx"}, target
        assert not target.startswith(("walchannel.channel", "walchannel.discovery")), target
    # The CLI wiring itself imports neither.
    for target in imports(trees["walchannel.cli"], "walchannel.cli"):
        assert target.split(".")[0] not in {"grpc", "httpx"}, target


def test_the_core_does_no_io() -> None:
    # protocol (the cursor, answers, backoff), log_state (the log's
    # decisions) and session (the channel's decision layer) take values and
    # return decisions: no I/O, no clock.
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
                    assert target.split(".")[1] in {
                        "errors",
                        "log_state",
                        "protocol",
                        "session",
                    }, (name, target)
        tree = trees[module]
        assert not [n for n in ast.walk(tree) if isinstance(n, (ast.Await, ast.AsyncFunctionDef))]


def test_order_lists_only_real_modules() -> None:
    names = set(modules()) | {"walchannel._proto"}
    for prefix in ORDER:
        assert any(n == prefix or n.startswith(prefix + ".") for n in names) or prefix in (
            "walchannel.inspection",
            "walchannel.watch",
            "walchannel.cli",
            "walchannel.__main__",
        ), prefix
    assert Path(ROOT / "walchannel" / "protocol.py").is_file()


def test_the_format_split_out_of_log_stays_importable_from_it() -> None:
    # walchannel.log_format holds the on-disk format; what walchannel.log
    # exported before the split is still there, the very same objects.
    import walchannel.log
    import walchannel.log_format

    moved = {"APPLICATION_ID", "ROW_LOST_TYPE", "Row", "RunMeta", "SCHEMA_VERSION"}
    moved |= {"decode_row", "encode_body"}
    assert moved | {"CommitHook", "Durability", "RunLog"} == set(walchannel.log.__all__)
    for name in moved | {"check_header", "read_meta", "row_lost_body"}:
        assert getattr(walchannel.log, name) is getattr(walchannel.log_format, name), name


def test_the_row_source_loads_neither_grpc_nor_the_channel() -> None:
    # Rows become UpMessage bytes with protobuf alone (walchannel.wire); the
    # stream driver is the one that writes them.
    trees = modules()
    for name, targets in closure("walchannel.row_source", trees).items():
        for target in targets:
            assert target.split(".")[0] not in {"grpc", "httpx", "asyncio"}, (name, target)
            assert not target.startswith("walchannel.channel"), (name, target)


def test_the_channel_split_keeps_its_names_importable() -> None:
    # GrpcEngineChannel was one module; its parts moved, its names did not.
    import walchannel
    import walchannel.channel
    import walchannel.row_source

    assert walchannel.channel.GrpcEngineChannel is walchannel.GrpcEngineChannel
    for name in ("STRUCT_GROWTH", "TAIL_BYTES", "TAIL_ROW_OVERHEAD"):
        assert getattr(walchannel.channel, name) is getattr(walchannel.row_source, name)
    assert callable(walchannel.channel._warn_grpc_trace)


def test_no_module_is_a_big_room() -> None:
    # Issue 15: no module over ~600 lines, anywhere under walchannel/ (the
    # generated walchannel/_proto aside).
    big = {}
    for path in (ROOT / "walchannel").rglob("*.py"):
        if "_proto" in path.relative_to(ROOT).parts:
            continue
        lines = len(path.read_text().splitlines())
        if lines > 650:
            big[str(path.relative_to(ROOT))] = lines
    assert not big, f"big rooms again (over 650 lines): {big}"


def test_the_log_split_keeps_its_names_importable() -> None:
    # RunLog was one module; its parts moved into the package walchannel.log,
    # its names did not.
    import walchannel
    import walchannel.log
    from walchannel.log import disk, opening, quarantine, transactions

    assert walchannel.log.RunLog is walchannel.RunLog
    for part in (opening.Opening, transactions.Transactions, quarantine.Quarantine, disk.Disk):
        assert issubclass(walchannel.log.RunLog, part)
    assert walchannel.log.WRITABLE_META is transactions.WRITABLE_META
    assert walchannel.log.CommitHook is walchannel.log.base.CommitHook


def test_the_inspection_split_keeps_its_names_importable() -> None:
    # walchannel.inspection held the reader, the report and the formatting;
    # the reader and the formatting moved, every name is still there.
    import walchannel.formatting
    import walchannel.inspection
    import walchannel.log_reader

    moved = {
        walchannel.log_reader: ("LogReader", "LogUnreadableError", "QuarantinedRow"),
        walchannel.formatting: ("align_table", "format_age", "format_size"),
    }
    for module, names in moved.items():
        for name in names:
            assert getattr(walchannel.inspection, name) is getattr(module, name), name
            assert name in walchannel.inspection.__all__, name
    assert walchannel.inspection.run_id_from_name is walchannel.log_reader.run_id_from_name
    # The formatting helpers import nothing of walchannel; the reader knows no report.
    trees = modules()
    assert not [
        t
        for t in imports(trees["walchannel.formatting"], "walchannel.formatting")
        if t.startswith("walchannel")
    ]
    assert not [
        t
        for t in imports(trees["walchannel.log_reader"], "walchannel.log_reader")
        if t.startswith("walchannel.inspection")
    ]


def test_the_local_engine_split_keeps_its_layers_and_names() -> None:
    # LocalEngine was one module; the stream handling moved into
    # testing/servicer.py and the process form into testing/engine_cli.py.
    # servicer knows nothing of the engine's facade or its command line; the
    # engine imports its command line only when main() runs (for
    # ``python -m walchannel.testing.engine``); the command line sits on top.
    import walchannel.testing
    import walchannel.testing.engine
    import walchannel.testing.engine_cli
    import walchannel.testing.servicer

    trees = modules()
    for target in imports(trees["walchannel.testing.servicer"], "walchannel.testing.servicer"):
        assert not target.startswith(
            ("walchannel.testing.engine", "walchannel.testing.engine_cli")
        ), target
    engine = trees["walchannel.testing.engine"]
    top = ast.Module(
        body=[n for n in engine.body if isinstance(n, ast.Import | ast.ImportFrom)],
        type_ignores=[],
    )
    assert not [t for t in imports(top, "walchannel.testing.engine") if "engine_cli" in t]
    engine_mod = walchannel.testing.engine
    assert engine_mod.RUN_COMPLETED is walchannel.testing.servicer.RUN_COMPLETED
    assert issubclass(engine_mod.LocalEngine, walchannel.testing.servicer.StreamHandling)
    assert walchannel.testing.LocalEngine is engine_mod.LocalEngine
    assert callable(engine_mod.main)
    assert walchannel.testing.engine_cli.LocalEngine is engine_mod.LocalEngine
