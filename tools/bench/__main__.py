"""``python -m tools.bench``: run the benchmark suite (see :mod:`tools.bench.cli`)."""

from __future__ import annotations

import sys

from tools.bench.cli import main

if __name__ == "__main__":
    sys.exit(main())
