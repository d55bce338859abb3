"""``python -m demo``: a real bandit scan streamed through kills and audited.

An example beside the library, not part of the installed package: ``make
demo`` runs it as ``PYTHONPATH=examples python -m demo`` (the ``demo``
extra brings bandit). What ``make demo`` shows is in README.md.

- :mod:`~demo.bandit_harness`: the harness, a real resumable
  bandit scan (``python -m demo.bandit_harness``).
- :mod:`~demo.processes`: starting the demo's child processes.
- :mod:`~demo.audit`: the independent bandit run and the
  findings it is compared by.
- :mod:`~demo.progress`: the progress and resume lines.
- :mod:`~demo.options`: the ``python -m demo`` options.
- :mod:`~demo.kills`: the demo through an engine kill and a
  harness kill.
- :mod:`~demo.hostloss`: the demo through the loss of the
  harness's machine (``--host-loss``).
"""
