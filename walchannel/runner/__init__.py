"""The harness runner: a manifest, a work list and a scan function (SPEC "The runner")."""

from __future__ import annotations

from walchannel.runner.context import AsyncItemContext, ItemContext
from walchannel.runner.exits import NOT_RETRIABLE, ExitCode
from walchannel.runner.manifest import MANIFEST_ENV, Manifest, ManifestError
from walchannel.runner.run import (
    Harness,
    HarnessError,
    Seams,
    WorkListChangedError,
    run_harness,
    run_harness_async,
)

__all__ = [
    "MANIFEST_ENV",
    "NOT_RETRIABLE",
    "AsyncItemContext",
    "ExitCode",
    "Harness",
    "HarnessError",
    "ItemContext",
    "Manifest",
    "ManifestError",
    "Seams",
    "WorkListChangedError",
    "run_harness",
    "run_harness_async",
]
