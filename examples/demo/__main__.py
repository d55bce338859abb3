"""``python -m demo``: parse the demo's options and run it (``--host-loss``: the host-loss demo).

Exit status: 0 when the audit holds, 1 when it does not, 2 on bad usage.
"""

from __future__ import annotations

import argparse
import sys

from demo import options

_EXAMPLES = """\
example (from the checkout, as make demo runs it):
  PYTHONPATH=examples python -m demo        # the standard library: 26 s on 2 idle cores
  PYTHONPATH=examples python -m demo --tree src/ --pace 0.05   # smaller, slowed: kills land

exit status: 0 when the audit holds, 1 when it does not, 2 on bad usage.
"""


def main(argv: list[str] | None = None) -> int:
    """Run the demo with ``argv`` (default: the command line); return its exit status."""
    parser = argparse.ArgumentParser(
        prog="python -m demo",
        description=(
            "Run demo.bandit_harness over a code tree against a local engine\n"
            "process; part-way through, (a) SIGKILL the engine (a replacement takes over\n"
            "behind discovery) and (b) SIGKILL the harness (restarted on the same log,\n"
            "resuming from its progress marker); then audit the engine's findings\n"
            "against an independent bandit run of the same files."
        ),
        epilog=_EXAMPLES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    options.add_arguments(parser)
    args = parser.parse_args(argv)
    if args.host_loss:
        from demo import hostloss

        return hostloss.run(args)
    from demo import kills

    return kills.run(args)


if __name__ == "__main__":
    sys.exit(main())
