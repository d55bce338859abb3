"""Look at a log file from another SQLite connection, as another process would."""

from __future__ import annotations

import sqlite3
from pathlib import Path


def no_write_transaction_open(path: Path) -> bool:
    """Tell, from another connection, that nobody holds a write transaction on ``path``."""
    other = sqlite3.connect(path, timeout=0, isolation_level=None)
    try:
        other.execute("BEGIN IMMEDIATE")
        other.execute("ROLLBACK")
    except sqlite3.OperationalError as exc:
        if "locked" not in str(exc):
            raise
        return False
    finally:
        other.close()
    return True
