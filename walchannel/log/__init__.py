"""The per-run write-ahead log: one SQLite file per run (SPEC "Log format").

:mod:`~walchannel.log.state` (its pure state machine), :mod:`~walchannel.log.format`
(rows, meta, the schema), :mod:`~walchannel.log.writer` (:class:`RunLog`, the
one writer), :mod:`~walchannel.log.reader` (read-only, for the tools),
:mod:`~walchannel.log.lock` and :mod:`~walchannel.log.files` (where a log lives,
who owns it), :mod:`~walchannel.log.replication` (Litestream).

For tools that read or repair a log: a harness never needs these, the
channel owns its log. :class:`RunLog` can delete and renumber rows.
"""

from __future__ import annotations

from walchannel.log.format import Row, RunMeta
from walchannel.log.writer import RunLog

__all__ = ["Row", "RunLog", "RunMeta"]
