"""walchannel's benchmark suite: ``python -m tools.bench [--quick]`` from the repo root.

Every row compares walchannel with a baseline measured in the same process,
the arms interleaved (A/B/B/A …) over several repetitions, and reports the
medians, their ratio (walchannel ÷ baseline) and the target from
``docs/performance.md``. Targets are shown, never asserted: the suite checks
the harness, the numbers are for reading.

Modules:

- :mod:`tools.bench.common`: payloads, medians, rows, the table, RSS and disk read-outs.
- :mod:`tools.bench.engine`: the local engine as a subprocess (the process form).
- :mod:`tools.bench.bare`: the bare ``grpc.aio`` stream baseline.
- :mod:`tools.bench.cases`: the cases (append, end-to-end, replay, open,
  latency, durability "power").
- :mod:`tools.bench.child`: memory and disk cases, each run in a child process.
- :mod:`tools.bench.profile`: cProfile of the append and end-to-end paths.
- :mod:`tools.bench.cli`: the command line.
"""
