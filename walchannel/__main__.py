"""``python -m walchannel``: the ``walchannel`` command (see :mod:`walchannel.cli`)."""

from __future__ import annotations

import sys

from walchannel.cli import main

if __name__ == "__main__":
    sys.exit(main())
