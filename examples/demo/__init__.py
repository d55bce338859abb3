"""``walchannel demo``: a real bandit scan streamed through kills and audited.

The demo and its harness, above the library (which never imports them) and
below the CLI that runs them:

- :mod:`~walchannel.demo.bandit_harness`: the harness, a real resumable
  bandit scan (``python -m walchannel.demo.bandit_harness``).
- :mod:`~walchannel.demo.processes`: starting the demo's child processes.
- :mod:`~walchannel.demo.audit`: the independent bandit run and the
  findings it is compared by.
- :mod:`~walchannel.demo.progress`: the progress and resume lines.
- :mod:`~walchannel.demo.options`: the ``walchannel demo`` options.
- :mod:`~walchannel.demo.kills`: the demo through an engine kill and a
  harness kill.
- :mod:`~walchannel.demo.hostloss`: the demo through the loss of the
  harness's machine (``--host-loss``).
"""
