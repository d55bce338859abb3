"""walchannel: a durable, replaying gRPC stream from a scan harness to its engine.

Every up-message gets a monotonic seq and is committed to a per-run SQLite
write-ahead log before it is written; the engine's cumulative ack truncates
the log; drops and restarts replay from it. See SPEC.md / README.md.

This is what a harness author uses: the channels and their protocols and
values, the config, the runner, the grace period and the errors (SPEC
"Layout and toolchain"). Tools that read or repair a log import
:mod:`walchannel.log`; the folders below are the layers. Names are
re-exported lazily (PEP 562) so ``import walchannel`` stays cheap and
loads grpc only when a gRPC name is used.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from walchannel._version import __version__ as __version__

_EXPORTS: dict[str, str] = {
    "ApprovalDecision": "walchannel.channel.interface",
    "ApprovalTimeoutError": "walchannel.errors",
    "BacklogFullError": "walchannel.errors",
    "Backoff": "walchannel.config",
    "BlockingEngineChannel": "walchannel.channel.blocking",
    "ChannelClosedError": "walchannel.errors",
    "ConfigurationError": "walchannel.errors",
    "ChannelState": "walchannel.core.driver",
    "ChannelStats": "walchannel.channel.interface",
    "DiscoveryError": "walchannel.errors",
    "EngineBehindError": "walchannel.errors",
    "EngineRefusedError": "walchannel.errors",
    "EngineChannel": "walchannel.channel.interface",
    "EngineUnavailableError": "walchannel.errors",
    "InsecureDiscoveryWarning": "walchannel.errors",
    "EXIT_ROWS_LEFT": "walchannel.grace",
    "EXIT_STOPPED": "walchannel.grace",
    "GracePeriod": "walchannel.grace",
    "GroupCommitError": "walchannel.errors",
    "LogError": "walchannel.errors",
    "GroupCommit": "walchannel.config",
    "GrpcChannelConfig": "walchannel.config",
    "GrpcEngineChannel": "walchannel.channel.grpc_channel",
    "PayloadError": "walchannel.errors",
    "ReentrantCallError": "walchannel.errors",
    "RowRefusedError": "walchannel.errors",
    "RunCompletedError": "walchannel.errors",
    "RunExpiredError": "walchannel.errors",
    "RunningLoopError": "walchannel.errors",
    "RunRefusedError": "walchannel.errors",
    "SyncEngineChannel": "walchannel.channel.interface",
    "TransportError": "walchannel.errors",
    "WalCorruptError": "walchannel.errors",
    "WalLocationError": "walchannel.errors",
    "WalLockedError": "walchannel.errors",
    "WalRemovedError": "walchannel.errors",
    "WalWriteError": "walchannel.errors",
    "WalchannelError": "walchannel.errors",
    "WriterFencedError": "walchannel.errors",
    "AsyncItemContext": "walchannel.runner.context",
    "ItemContext": "walchannel.runner.context",
    "ExitCode": "walchannel.runner.exits",
    "Harness": "walchannel.runner.run",
    "HarnessError": "walchannel.runner.run",
    "Manifest": "walchannel.runner.manifest",
    "ManifestError": "walchannel.runner.manifest",
    "WorkListChangedError": "walchannel.runner.run",
    "run_harness": "walchannel.runner.run",
    "run_harness_async": "walchannel.runner.run",
}

__all__ = [
    "ApprovalDecision",
    "ApprovalTimeoutError",
    "AsyncItemContext",
    "BacklogFullError",
    "Backoff",
    "BlockingEngineChannel",
    "ChannelClosedError",
    "ChannelState",
    "ChannelStats",
    "ConfigurationError",
    "DiscoveryError",
    "EXIT_ROWS_LEFT",
    "EXIT_STOPPED",
    "EngineBehindError",
    "EngineChannel",
    "EngineRefusedError",
    "EngineUnavailableError",
    "ExitCode",
    "GracePeriod",
    "GroupCommit",
    "GroupCommitError",
    "GrpcChannelConfig",
    "GrpcEngineChannel",
    "Harness",
    "HarnessError",
    "InsecureDiscoveryWarning",
    "ItemContext",
    "LogError",
    "Manifest",
    "ManifestError",
    "PayloadError",
    "ReentrantCallError",
    "RowRefusedError",
    "RunCompletedError",
    "RunExpiredError",
    "RunRefusedError",
    "RunningLoopError",
    "SyncEngineChannel",
    "TransportError",
    "WalCorruptError",
    "WalLocationError",
    "WalLockedError",
    "WalRemovedError",
    "WalWriteError",
    "WalchannelError",
    "WorkListChangedError",
    "WriterFencedError",
    "run_harness",
    "run_harness_async",
]

if TYPE_CHECKING:
    from walchannel.channel.blocking import BlockingEngineChannel
    from walchannel.channel.grpc_channel import GrpcEngineChannel
    from walchannel.channel.interface import (
        ApprovalDecision,
        ChannelStats,
        EngineChannel,
        SyncEngineChannel,
    )
    from walchannel.config import Backoff, GroupCommit, GrpcChannelConfig
    from walchannel.core.driver import ChannelState
    from walchannel.errors import (
        ApprovalTimeoutError,
        BacklogFullError,
        ChannelClosedError,
        ConfigurationError,
        DiscoveryError,
        EngineBehindError,
        EngineRefusedError,
        EngineUnavailableError,
        GroupCommitError,
        InsecureDiscoveryWarning,
        LogError,
        PayloadError,
        ReentrantCallError,
        RowRefusedError,
        RunCompletedError,
        RunExpiredError,
        RunningLoopError,
        RunRefusedError,
        TransportError,
        WalchannelError,
        WalCorruptError,
        WalLocationError,
        WalLockedError,
        WalRemovedError,
        WalWriteError,
        WriterFencedError,
    )
    from walchannel.grace import EXIT_ROWS_LEFT, EXIT_STOPPED, GracePeriod
    from walchannel.runner.context import AsyncItemContext, ItemContext
    from walchannel.runner.exits import ExitCode
    from walchannel.runner.manifest import Manifest, ManifestError
    from walchannel.runner.run import (
        Harness,
        HarnessError,
        WorkListChangedError,
        run_harness,
        run_harness_async,
    )


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'walchannel' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
