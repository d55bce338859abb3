"""What the demo prints while it runs: what the engine holds, where a restarted harness resumes."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from walchannel.log.format import RunMeta

__all__ = ["engine_progress", "progress_line", "read_marker", "resume_line"]


def engine_progress(bodies: Sequence[dict[str, Any]]) -> tuple[int, int]:
    """What the engine holds of the scan: ``(findings, files)``.

    Files are the distinct ``scan.file`` events by index. Under the runner
    a file's event is in its findings' transaction and comes once; an
    older harness's, killed between the two, came again.

    Args:
        bodies: the engine's applied messages (``LocalEngine.bodies`` shape).
    """
    findings = 0
    files: set[int] = set()
    for b in bodies:
        if b["kind"] == "finding":
            findings += 1
        elif b["kind"] == "event" and b["body"]["type"] == "scan.file":
            files.add(int(b["body"]["payload"]["index"]))
    return findings, len(files)


def read_marker(wal_dir: Path, run_id: str) -> RunMeta | str | None:
    """The harness log's meta, read-only (its ``progress`` is the marker).

    Returns:
        The meta; None when the log does not exist yet; or why it could not
        be read (the demo goes on: the audit tells the truth).
    """
    from walchannel.log import files
    from walchannel.log.reader import LogReader

    path = files.log_path(wal_dir, run_id)
    if not path.exists():
        return None
    try:
        with LogReader(path, run_id) as reader:
            return reader.meta()
    except Exception as exc:
        return f"{type(exc).__name__}: {exc}"


def _marker_text(meta: RunMeta | str | None, total: int) -> tuple[str, int | None]:
    """``harness marker: N/TOTAL files scanned`` and N (None: no marker)."""
    if isinstance(meta, str):
        return f"harness marker: unreadable ({meta})", None
    marker = (meta.progress if meta is not None else None) or {}
    if "next" not in marker:
        return "harness marker: none yet", None
    done = int(marker["next"])
    return f"harness marker: {done}/{total} files scanned", done


def progress_line(bodies: Sequence[dict[str, Any]], total: int, meta: RunMeta | str | None) -> str:
    """The demo's progress line: what the engine holds, then the harness's marker.

    The two can differ: the marker counts the files whose rows the harness
    committed to its log (where a restart resumes, as :func:`resume_line`
    says), the engine the files whose event it applied; rows logged and not
    yet delivered (a killed harness's, until its restart replays them) are
    the difference.

    Args:
        bodies: the engine's applied messages.
        total: the files of the scan.
        meta: :func:`read_marker`'s answer.
    """
    findings, scanned = engine_progress(bodies)
    marker, _ = _marker_text(meta, total)
    return f"engine holds {findings} findings from {scanned}/{total} files; {marker}"


def resume_line(meta: RunMeta | str | None, total: int) -> str:
    """Where a restarted harness resumes: after the files its marker counts, as the progress line.

    Args:
        meta: :func:`read_marker`'s answer.
        total: the files of the scan.
    """
    marker, done = _marker_text(meta, total)
    if done is None or isinstance(meta, str) or meta is None:
        return f"{marker}: it starts with file 1"
    found = int((meta.progress or {}).get("findings", 0))
    return (
        f"{marker}, {found} findings logged (seqs up to {meta.high_water} logged, "
        f"up to {meta.last_acked_seq} acked): it resumes with file {done + 1}"
    )
