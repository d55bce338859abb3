"""Run a function as another user: a forked child (no exec) that drops to ``uid``."""

from __future__ import annotations

# A child of another uid cannot import from a 0700 home where Python may
# live; codecs are looked up lazily (walchannel.clock reads the boot id as
# ascii), so load the ones the children use here.
import encodings.ascii  # noqa: F401
import os
import pickle
from collections.abc import Callable
from pathlib import Path
from typing import Any


def as_user(uid: int, fn: Callable[[], object], *, cwd: Path | None = None) -> Any:
    """Run ``fn`` in a forked child as ``uid``/``gid`` ``uid``; return what it returned.

    An exception comes back as ``("raised", type name, message, its .path or
    None)``; a child that ends itself with ``os._exit()`` answers
    ``("exited", exit code)``. Needs root.
    """
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(read)
        result: object
        try:
            os.setgroups([])
            os.setgid(uid)
            os.setuid(uid)
            os.umask(0o022)
            if cwd is not None:
                os.chdir(cwd)
            result = fn()
        except BaseException as exc:
            result = ("raised", type(exc).__name__, str(exc), getattr(exc, "path", None))
        with os.fdopen(write, "wb") as pipe:
            pipe.write(pickle.dumps(result))
        os._exit(0)
    os.close(write)
    with os.fdopen(read, "rb") as pipe:
        data = pipe.read()
    _, status = os.waitpid(pid, 0)
    return pickle.loads(data) if data else ("exited", os.waitstatus_to_exitcode(status))
