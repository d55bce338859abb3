"""Bugs planted in walchannel/ itself, for the simulator to find (tests/test_simulation.py).

Each plant is a source edit of the product: a file, the exact original lines,
and what replaces them. It is applied to a copy of ``walchannel/`` and the
simulator runs on that copy in a subprocess, so a plant reaches the code that
decides (the driver, the log's state) and the code that carries decisions out
(the channel, its stream, the row source, the log) exactly as production
runs it. A plant whose original lines are gone fails its test: plants follow
the code, they never silently stop biting.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


@dataclass(frozen=True)
class Plant:
    """One realistic mistake in the product.

    Attributes:
        name: what the mistake is.
        path: the file under ``walchannel/``.
        original: the exact lines it changes (found exactly once).
        replacement: what they become.
        symptoms: violations the simulator may report for it (one must show).
    """

    name: str
    path: str
    original: str
    replacement: str
    symptoms: tuple[str, ...]


# ("is missing": a row the writer wants gone from the log, the run failed as damaged.)
LOST = ("never applied", "applied 0 times", "not in the log", "is missing", "two contents", "gap")

PLANTS: tuple[Plant, ...] = (
    # -- the log's decisions (walchannel/log/state.py) ------------------------------
    Plant(
        "next_seq_restarts_after_all_acked_reopen",
        "log/state.py",
        "        next_seq = next_seq_at_open(high_water, top_seq, last_acked)\n",
        "        next_seq = (top_seq or 0) + 1\n",
        ("two contents", "exceeds", "above", "stuck", *LOST),
    ),
    Plant(
        "ack_deletes_one_unacked_row",
        "log/state.py",
        "            delete_through=acked,\n",
        "            delete_through=acked + 1,\n",
        LOST,
    ),
    Plant(
        "renumber_start_off_by_one",
        "log/state.py",
        "            shift_from=start if shift else None,\n",
        "            shift_from=start + 1 if shift and start is not None else None,\n",
        LOST,
    ),
    Plant(
        "no_renumber",
        "log/state.py",
        "            shift_from=start if shift else None,\n",
        "            shift_from=None,\n",
        LOST,
    ),
    Plant(
        "verification_shift_off_by_one",
        "log/state.py",
        "    return engine_high + 1 - unverified_from\n",
        "    return engine_high - unverified_from\n",
        LOST,
    ),
    Plant(
        "skip_verification",
        "log/state.py",
        "    return engine_high + 1 - unverified_from\n",
        "    return 0\n",
        LOST,
    ),
    Plant(
        "tombstone_before_done_ack",
        "log/state.py",
        "        completed = done is not None and acked >= done\n",
        "        completed = done is not None and acked >= done - 1\n",
        ("lacks Done", "Done applied 0 times", "stuck", "never applied"),
    ),
    Plant(
        "replay_read_one_late",
        "log/state.py",
        "        return max(after_seq, self.last_acked)\n",
        "        return max(after_seq, self.last_acked) + 1\n",
        ("stuck", *LOST),
    ),
    # -- the driver's decisions (walchannel/core/driver.py) -------------------------------
    Plant(
        "ack_stored_above_received",
        "core/driver.py",
        "            return acked\n        return None\n",
        "            return min(acked + 1, state.next_seq - 1)\n        return None\n",
        ("exceeds what the engine has", "lacks Done", *LOST),
    ),
    Plant(
        "backoff_reset_on_answer",
        "core/driver.py",
        "        self._first_written = None\n        self._repeated_end = None\n",
        "        self._first_written = None\n        self._repeated_end = None\n"
        "        self._attempt = 0\n",
        ("backoff reset without progress", "tight loop"),
    ),
    Plant(
        "backoff_reset_on_any_ack",
        "core/driver.py",
        "        if self._first_written is not None and seq >= self._first_written:\n",
        "        if True:\n",
        ("backoff reset without progress", "tight loop"),
    ),
    Plant(
        "engine_behind_one_below_stored_accepted",
        "core/driver.py",
        "        if engine_high < self.stored:\n",
        "        if engine_high < self.stored - 1:\n",
        ("exception", "raised", "stuck", "protocol", *LOST),
    ),
    Plant(
        "answer_above_cursor_resumes_instead_of_verifying",
        "core/driver.py",
        "        if unverified is not None:\n",
        "        if unverified is not None and engine_high <= self.acked:\n",
        # (Unverified, the log never records its first answer: the runner's check.)
        ("protocol", "exception", "raised", "before the log's first answer", *LOST),
    ),
    Plant(
        "replay_after_verification_skips_a_row",
        "core/driver.py",
        "        return self._up_from(event.high + 1, event.now_ms, out)\n",
        "        return self._up_from(event.high + 2, event.now_ms, out)\n",
        LOST,
    ),
    Plant(
        "run_completed_reconnects",
        "core/driver.py",
        "        if meaning is Meaning.RUN_COMPLETED:\n",
        "        if False:\n",
        ("stuck", "tight loop", "lacks Done"),
    ),
    Plant(
        "run_completed_keeps_a_logged_done",
        "core/driver.py",
        "        if state.done_seq is not None:\n            return Completion.TOMBSTONE\n",
        "",
        ("no tombstone",),
    ),
    # -- carrying decisions out (walchannel/channel/, walchannel/channel/row_source.py) ------
    Plant(
        "answer_verify_shift_keeps_the_stale_tail",
        "channel/connection.py",
        "        self._rows.clear_tail()\n",
        "",
        ("two contents", "applied 2 times", "after the run's Done", *LOST),
    ),
    Plant(
        "received_ack_off_by_one",
        "channel/connection.py",
        "            self.feed(ev.AckReceived(msg.ack.seq, now))\n",
        "            self.feed(ev.AckReceived(msg.ack.seq + 1, now))\n",
        (
            "exceeds what the engine has",
            "beyond the engine",
            "above every ack",
            "impossible answers",  # an ack past the rows written: the client refuses it
            "lacks Done",
            *LOST,
        ),
    ),
    Plant(
        "stored_ack_one_short",
        "channel/connection.py",
        "            self._log.ack(action.seq)\n",
        "            self._log.ack(action.seq - 1)\n",
        ("no tombstone", "stuck", "send_done returned"),
    ),
    Plant(
        "stored_done_ack_wakes_no_waiter",
        "channel/connection.py",
        '        logger.info("run %s: Done acked; the log is now a tombstone", self._run_id)\n'
        "        self._waiters.wake_all()\n",
        '        logger.info("run %s: Done acked; the log is now a tombstone", self._run_id)\n',
        ("send_done returned",),
    ),
    Plant(
        "stream_end_loses_its_status",
        "channel/connection.py",
        "            self.feed(ev.Ended(code, details, debug, text))\n",
        "            self.feed(ev.Ended(None, details, debug, text))\n",
        ("stuck", "tight loop", "lacks Done"),
    ),
    Plant(
        "no_backoff_between_dials",
        "core/driver.py",
        "        delay = self._next_delay_ms(event.now_ms)\n",
        "        delay = 0 * self._next_delay_ms(event.now_ms)\n",
        ("tight loop", "backoff reset without progress"),
    ),
    Plant(
        "run_completed_never_tombstones",
        "channel/connection.py",
        "            try:\n                self._log.complete_by_engine()\n"
        "            except WalchannelError as exc:\n                logger.error(",
        "            try:\n                pass\n            except WalchannelError as exc:\n"
        "                logger.error(",
        ("no tombstone",),
    ),
    Plant(
        "replay_starts_one_row_late",
        "core/driver.py",
        "        self._stream_up(replay_from, now_ms)\n",
        "        self._stream_up(replay_from + 1, now_ms)\n",
        ("stuck", *LOST),
    ),
    Plant(
        "send_done_logs_done_twice",
        "core/driver.py",
        "        if self._log.state.done_seq is None:\n            return (act.LOG_DONE,)",
        "        if True:\n            return (act.LOG_DONE,)",
        ("ChannelClosedError", "Done applied 2 times"),
    ),
    Plant(
        "refused_row_set_aside_but_the_tail_kept",
        "channel/refused_rows.py",
        "        self._rows.forget()\n",
        "",
        ("stuck", "refused", "set aside"),
    ),
    Plant(
        "stop_fires_on_every_repeat",
        "core/driver.py",
        "        return (act.StopCallbacks(event.reason),) if self._stop() else _NOTHING\n",
        "        return (act.StopCallbacks(event.reason),) if self._stop() or True else _NOTHING\n",
        ("on_stop fired",),
    ),
    Plant(
        "decisions_not_cached",
        "core/driver.py",
        "        self._decide(event.request_id, event.approved, event.reason)\n",
        "",
        ("logged again",),
    ),
    Plant(
        "tail_read_off_by_one",
        "channel/row_source.py",
        "            entry = tail[seq - tail[0][0]] if tail and tail[0][0] <= seq else None\n"
        "        except IndexError:\n"
        "            entry = None\n"
        "        if entry is not None and entry[0] == seq:\n",
        "            entry = tail[max(0, seq - tail[0][0] - 1)]"
        " if tail and tail[0][0] <= seq else None\n"
        "        except IndexError:\n"
        "            entry = None\n"
        "        if entry is not None:\n",
        ("two contents", "applied 2 times", "ever committed it there", *LOST),
    ),
    # -- what the channel tells the harness (its answers, checked as they are given) ---
    Plant(
        "wait_acked_compares_the_untranslated_target",
        "core/driver.py",
        "        seq = self.translate(handed_out)\n",
        "        seq = handed_out\n",
        ("wait_acked", *LOST),
    ),
    Plant(
        "waiter_acked_exactly_not_woken",
        "channel/waiters.py",
        "        if acked >= self.wake_at:\n",
        "        if acked > self.wake_at:\n",
        ("not woken", "send_done returned"),
    ),
    Plant(
        "first_provisional_seq_left_untranslated",
        "core/driver.py",
        "            if first <= seq < end:\n",
        "            if first < seq < end:\n",
        ("wait_acked",),
    ),
    Plant(
        "send_done_takes_a_logged_done_for_a_delivered_one",
        "core/driver.py",
        "        if self.completed:\n            # This channel already delivered",
        "        if self.completed or self._log.state.done_seq is not None:\n"
        "            # This channel already delivered",
        ("send_done returned True", "lacks Done"),
    ),
    Plant(
        "progress_not_taken_from_the_disk",
        "log/writer.py",
        "        self._progress = meta.progress\n        self._quarantined = quarantined\n",
        "        self._quarantined = quarantined\n",
        ("progress()",),
    ),
    Plant(
        "refused_row_read_one_late",
        "channel/refused_rows.py",
        "        row = next(self._log.unacked(after_seq=seq - 1, limit=1))\n",
        "        row = next(self._log.unacked(after_seq=seq, limit=1))\n",
        ("RowRefusedError", "refused", "set aside", "stuck", "connection loop failed"),
    ),
    # -- the executor: the performer of an action does nothing (issue 60) --------------
    Plant(
        "verify_not_performed",
        "channel/connection.py",
        '        """``RunLog.verify(h)`` with the judg'
        'ed resume point; answer with its outcome."""\n',
        '        """``RunLog.verify(h)`` with the judg'
        'ed resume point; answer with its outcome."""\n'
        "        return\n",
        ("unacked_count", "wait_acked", "stuck", *LOST),
    ),
    Plant(
        "tombstone_not_performed",
        "channel/connection.py",
        '        """Our ``Done`` was applied but its a'
        'ck was lost: the log becomes a tombstone."""\n',
        '        """Our ``Done`` was applied but its a'
        'ck was lost: the log becomes a tombstone."""\n'
        "        return\n",
        ("not in the log", "is missing", "stuck", "no tombstone", "send_done"),
    ),
    Plant(
        "end_stream_not_performed",
        "channel/connection.py",
        "            self._stream.finish(StreamEnded(action.why))\n",
        "            pass\n",
        ("stuck", "applied twice", "gap", *LOST),
    ),
    Plant(
        "ack_moved_not_performed",
        "channel/connection.py",
        "        acked = self._driver.acked\n        self._rows.drop_acked(acked)\n"
        "        self._waiters.ack_moved(acked)\n",
        "        acked = self._driver.acked\n",
        ("stuck", "not woken", "wait_acked"),
    ),
    Plant(
        "start_stream_not_performed",
        "channel/connection.py",
        "        stream.start()\n",
        "",
        ("stuck", "was not written within", *LOST),
    ),
    # -- the driver's inputs, each event not fed (issues 36, 60) ------------------------
    Plant(
        "set_aside_not_fed",
        "channel/refused_rows.py",
        "        self._feed(ev.RefusedRowSetAside())\n",
        "",
        ("set aside, yet the next dial",),
    ),
    Plant(
        "ack_not_fed",
        "channel/connection.py",
        "            self.feed(ev.AckReceived(msg.ack.seq, now))\n",
        "            pass\n",
        ("send_done returned False", "stuck", "not woken"),
    ),
    Plant(
        "close_not_fed",
        "channel/grpc_channel.py",
        "        self._connection.feed(ev.CloseRequested())\n"
        '        _killpoints.reached("in_close")\n',
        '        _killpoints.reached("in_close")\n',
        ("backoff reset without progress", "after close", "stuck"),
    ),
    Plant(
        "expiry_not_applied",
        "core/driver.py",
        "        return (act.DEADLINE_HIT,) if self._expire() else _NOTHING\n",
        "        return _NOTHING\n",
        ("RunExpiredError raised, but the channel is",),
    ),
    Plant(
        "admission_not_asked",
        "channel/grpc_channel.py",
        "        error = self._driver.admit(call, self._clock.wall_s())\n",
        "        error = None\n",
        ("a send returned seqs",),
    ),
    Plant(
        "engine_forgot_answer_not_applied",
        "core/driver.py",
        "            self._acked = max(engine_high, self.stored)\n",
        "",
        ("gap", "stuck", *LOST),
    ),
    Plant(
        "first_ack_taken_for_an_answer_without_answers",
        "channel/stream.py",
        '                if not answer.done() and self._acks_handshake and msg.HasField("ack"):\n',
        '                if not answer.done() and msg.HasField("ack"):\n',
        ("not woken", "send_done returned", "stuck"),
    ),
    # -- ages across clock steps (walchannel/log/writer.py) ---------------------------------
    Plant(
        "age_read_off_the_wall_clock",
        "log/writer.py",
        "        boot_at = float(row[1]) if isinstance(row[1], int | float) else None\n",
        "        boot_at = None\n",
        ("older than the boot",),
    ),
    # -- one writer per run (issue 34) ------------------------------------------------
    Plant(
        "every_handshake_asks_to_take_over",
        "channel/connection.py",
        "            take_over=writer.take_over,\n",
        "            take_over=True,\n",
        ("applied 2 times", "applied 3 times", "two contents", *LOST),
    ),
    Plant(
        "owned_by_another_writer_not_recognised",
        "core/end_status.py",
        '            rf"\\A\\s*({re.escape(OWNED_BY_ANOTHER_WRITER)}|'
        '{re.escape(WRITER_FENCED)})", re.I\n',
        '            rf"\\A\\s*({re.escape(WRITER_FENCED)})", re.I\n',
        ("stuck", "never applied", "applied 0 times"),
    ),
    Plant(
        "own_rows_taken_for_another_writers",
        "log/state.py",
        "        return self.answered or self.take_over or self.epoch > 0\n",
        "        return self.take_over or self.epoch > 0\n",
        ("WriterFencedError", "stuck", *LOST),
    ),
    Plant(
        "another_writers_done_read_as_ours",
        "core/driver.py",
        "        other = by is not None and self._writer is not None and by != self._writer.id\n",
        "        other = False\n",
        ("not this one's", "not its own", "no named error", "no tombstone", *LOST),
    ),
    # -- group commit (issue 37, SPEC "Group commit") ----------------------------------
    Plant(
        "group_seqs_not_counted_ahead",
        "channel/group_commit.py",
        "        first = self._next_seq_after(len(self._items))  # the driver numbers rows\n",
        "        first = self._next_seq_after(0)  # the driver numbers rows\n",
        ("was handed out for", "two contents", *LOST),
    ),
    Plant(
        "group_not_committed_at_its_cap",
        "channel/group_commit.py",
        "        if len(self._items) + len(items) >= caps.max_rows or self._bytes + size >= "
        "caps.max_bytes:\n",
        "        if False:\n",
        ("never committed",),
    ),
    Plant(
        "wait_acked_leaves_the_group_pending",
        "channel/grpc_channel.py",
        "        newest = driver.next_seq_after(0 if group is None else group.rows) - 1\n"
        "        if group is not None:\n            group.flush()\n",
        "        newest = driver.next_seq_after(0) - 1\n",
        ("is not committed", "never applied"),
    ),
    # -- liveness, close and the log's physical state (issue 51) ----------------------
    Plant(
        "commit_wakes_no_writer",
        "channel/grpc_channel.py",
        "            self._wakeup.set()\n        return seqs\n",
        "            pass\n        return seqs\n",
        ("not written within",),
    ),
    Plant(
        "close_leaves_the_received_ack_unstored",
        "channel/grpc_channel.py",
        "        self._connection.flush_acks()\n        self._connection.feed(ev.Closed())\n",
        "        self._connection.feed(ev.Closed())\n",
        ("clean close",),
    ),
    Plant(
        "timed_out_wait_says_acked",
        "channel/waiters.py",
        "            except TimeoutError:\n                return condition()\n",
        "            except TimeoutError:\n                return True\n",
        ("wait_acked", "send_done returned"),
    ),
    Plant(
        "ack_keeps_the_acked_row",
        "log/writer.py",
        '                "DELETE FROM rows WHERE seq <= ?", (plan.delete_through,)\n',
        '                "DELETE FROM rows WHERE seq < ?", (plan.delete_through,)\n',
        ("at or below the stored cursor",),
    ),
    Plant(
        "row_pages_stop_at_a_full_page",
        "log/writer.py",
        "            if len(batch) < size:\n                return\n",
        "            if len(batch) <= size:\n                return\n",
        ("the log yields",),
    ),
    Plant(
        "recovery_keeps_the_failed_reason",
        "channel/connection.py",
        "            self._log.update_meta(failed_at=None, failed_reason=None)\n",
        "            self._log.update_meta(failed_at=None)\n",
        ("failed_reason",),
    ),
    # -- nothing returned is lost at the process boundary (issue 52) ------------------
    Plant(
        "reentry_refusal_removed",
        "channel/grpc_channel.py",
        "        inside = self._guard.holder\n        if inside is None:\n",
        "        return\n        inside = self._guard.holder\n        if inside is None:\n",
        ("signal handler's send returned", "refused send", "handed out", *LOST),
    ),
    Plant(
        "removed_files_not_watched",
        "log/writer.py",
        "        watch = self._watch\n",
        "        watch = None\n",
        ("after the log's files were removed", "no transaction of the log ever committed it"),
    ),
    # -- the engine's lies the client can see (issue 53) -----------------------------------
    Plant(
        "answer_above_the_written_bound_taken",
        "core/driver.py",
        "        if written is not None and engine_high > written:\n",
        "        if False:\n",
        ("did not end the stream", "an impossible answer was applied"),
    ),
    Plant(
        "contradiction_retried",
        "core/driver.py",
        "            if expected - 1 < self.stored:\n",
        "            if False:\n",
        ("dialed again after the engine said it expects seq",),
    ),
    # -- issue 54: a refused run (walchannel/channel/grpc_channel.py) ------------------------
    Plant(
        "run_refused_though_the_log_had_an_answer",
        "channel/grpc_channel.py",
        "        if driver.every_dial_refused and self._log.meta().answered_at is None:\n",
        "        if driver.every_dial_refused:\n",
        ("RunRefusedError for a log that had an answer",),
    ),
    Plant(
        "batch_events_logged_after_the_findings",
        "channel/grpc_channel.py",
        "            for index, body in enumerate(bodies):\n",
        "            items.reverse()\n            for index, body in enumerate(bodies):\n",
        ("a send returned seq", "two contents", *LOST),
    ),
    # -- issue 54: the runner (walchannel/runner/run.py) ----------------------------------
    Plant(
        "runner_marker_before_its_rows",
        "runner/run.py",
        "                lambda: channel.send_findings(findings_out, events=events_out, "
        "progress=marker),\n",
        "                lambda: channel.send_findings([], progress=marker),\n"
        "            )\n"
        "            await self._written(\n"
        "                channel,\n"
        "                lambda: channel.send_findings(findings_out, events=events_out),\n",
        LOST,
    ),
    # -- the engine's resume point (issue 55) ---------------------------------------
    Plant(
        "marker_carried_by_the_last_row",
        "channel/grpc_channel.py",
        '                return [self._rows.prepare(kind, {**bodies[0], "progress": point}), '
        "*items[1:]]\n",
        "                last = items[-1][0]\n"
        '                carrier = self._rows.prepare(last, {**bodies[-1], "progress": point})\n'
        "                return [*items[:-1], carrier]\n",
        ("after a takeover", *LOST),
    ),
    Plant(
        "takeover_resumes_after_an_item_applied_in_part",
        "runner/run.py",
        "        if point.complete or not isinstance(last, dict):\n",
        "        if True:\n",
        LOST,
    ),
    Plant(
        "runner_commits_the_last_finished_first",
        "runner/run.py",
        "                task = window.get(index)\n",
        "                index = max(window) if window else index\n"
        "                task = window.get(index)\n",
        ("applied", "never", "scanned item", *LOST),
    ),
    Plant(
        "runner_fingerprint_ignored",
        "runner/run.py",
        '        if marker.get("work") != self.fingerprint or marker.get("items") != '
        "len(self.items):\n",
        "        if False:\n",
        ("a work list that changed",),
    ),
    Plant(
        "runner_scans_before_the_first_answer",
        "runner/run.py",
        "                if answered_before:\n",
        "                if True:\n",
        ("before the log's first answer",),
    ),
    Plant(
        "runner_skip_drops_the_items_other_findings",
        "runner/run.py",
        "                number, _ = kept.pop(exc.index)\n",
        "                number, _ = kept.pop(exc.index)\n                kept.clear()\n",
        ("never logged finding", "never applied", "the runner exited DONE, but the engine applied"),
    ),
    Plant(
        "undecodable_down_message_skipped",
        "channel/stream.py",
        "                    self._undecodable(exc)\n                    return\n",
        "                    continue\n",
        ("did not end the stream", "one went unsaid"),
    ),
    Plant(
        "text_that_is_not_utf8_refused",
        "wire/protobuf.py",
        "    if not repaired:\n",
        "    if True:\n",
        ("protocol errors counted", "stuck", "timed out", "never", "approval"),
    ),
)


def planted_copy(plant: Plant, into: Path) -> Path:
    """Copy ``walchannel/`` and ``tools/sim.py`` under ``into`` with ``plant`` applied.

    Returns:
        The copied ``tools/sim.py``, which imports the planted package.

    Raises:
        AssertionError: the plant's original lines are not in the file exactly once.
    """
    shutil.copytree(
        ROOT / "walchannel", into / "walchannel", ignore=shutil.ignore_patterns("__pycache__")
    )
    (into / "tools").mkdir()
    shutil.copy2(ROOT / "tools" / "sim.py", into / "tools" / "sim.py")
    target = into / "walchannel" / plant.path
    text = target.read_text()
    count = text.count(plant.original)
    assert count == 1, (
        f"plant {plant.name}: its original lines occur {count} times in walchannel/{plant.path} "
        "(the code moved on: update the plant)"
    )
    target.write_text(text.replace(plant.original, plant.replacement))
    return into / "tools" / "sim.py"


def run_planted(plant: Plant, into: Path, seeds: int) -> subprocess.CompletedProcess[str]:
    """Run the simulator on a planted copy until the first failing schedule."""
    sim = planted_copy(plant, into)
    env = {**os.environ, "PYTHONDONTWRITEBYTECODE": "1"}
    env.pop("PYTHONPATH", None)
    return subprocess.run(
        [sys.executable, str(sim), "--seeds", str(seeds), "--jobs", "1", "--stop-at-first"],
        capture_output=True,
        text=True,
        env=env,
        timeout=600,
        check=False,
    )


def first_failure(plant: Plant, seeds: int = 3000) -> tuple[int | None, str]:
    """Schedules run on ``plant``'s copy to its first failure (None: none); the first violation."""
    import tempfile

    with tempfile.TemporaryDirectory(prefix="plant-") as folder:
        run = run_planted(plant, Path(folder), seeds)
    lines = run.stdout.splitlines()
    count = next(
        (int(w.split("=", 1)[1]) for w in lines[0].split() if w.startswith("schedules=")), None
    )
    said = next((x.strip()[2:] for x in lines if x.strip().startswith("- ")), "")
    return (count if run.returncode == 1 else None), said


def main() -> int:
    """Print docs/reliability.md's plant table: ``python tests/plants.py [--jobs N]``."""
    import argparse
    from concurrent.futures import ProcessPoolExecutor

    parser = argparse.ArgumentParser(description=main.__doc__)
    parser.add_argument("--jobs", type=int, default=2)
    parser.add_argument("--seeds", type=int, default=3000)
    args = parser.parse_args()
    print("| plant | file | schedules to the first failure | what the checker said |")
    print("|---|---|---:|---|")
    with ProcessPoolExecutor(args.jobs) as pool:
        found = pool.map(first_failure, PLANTS, [args.seeds] * len(PLANTS))
        for plant, (count, said) in zip(PLANTS, found, strict=True):
            shown = "none" if count is None else str(count)
            said = (said if len(said) <= 200 else said[:199] + "…").replace("|", "\\|")
            print(f"| `{plant.name}` | `{plant.path}` | {shown} | {said} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
