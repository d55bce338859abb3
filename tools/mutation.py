#!/usr/bin/env python3
"""The mutation score of the driver and the log's decisions: mutmut, a time budget, a report.

``make mutation`` runs ``python tools/mutation.py run`` and then ``report``
(docs/reliability.md, "Mutation score"). mutmut 3 (the ``mutation`` extra of
pyproject.toml, which ``make mutation`` pip-installs into ``.venv``; this
script installs nothing) mutates the driver, the pure modules beside it and
``walchannel/log/state.py`` (``[tool.mutmut] only_mutate``) and, for each
mutant, runs the tests of ``[tool.mutmut]`` that execute the mutated function:
the fast tests of the driver and the log and a short simulator sweep
(``tools/sim.py``, wrapped as pytest tests in ``tools/mutation_sweep.py``).

Usage::

    python tools/mutation.py run [--budget-min 240] [--files walchannel/log/state.py]
    python tools/mutation.py run --retest          # survivors again, after adding tests
    python tools/mutation.py report                # docs/mutation-survivors.md
    python tools/mutation.py stubs                 # verdict entries to fill in, for survivors

Budgets: one mutant gets ``(its tests' clean time + timeout_constant) x
timeout_multiplier`` seconds of wall time and twice that of CPU time
(``[tool.mutmut]``), past which it counts as a timeout (detected); the
whole ``run`` stops at ``--budget-min`` minutes (SIGINT to mutmut, which
keeps every finished mutant's result in ``mutants/``) and says how far it
got. Running it again resumes with the mutants not yet tested; ``mutants/``
(git-ignored) holds that state, ``rm -rf mutants`` starts afresh. mutmut
itself re-tests the mutants of a function whose source changed.

``report`` writes the score and every mutant no test detected to
``docs/mutation-survivors.md``, merging the hand-kept verdicts of
``tools/mutation_verdicts.toml`` ("equivalent: why" or "missing check: the
test that kills it now"), matched by file, function and the mutated text, so
they survive line moves and regenerations. Exit 0 on success.
"""

from __future__ import annotations

import argparse
import contextlib
import difflib
import hashlib
import importlib.util
import json
import os
import re
import signal
import subprocess
import sys
import time
import tomllib
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
MUTANTS = ROOT / "mutants"
VERDICTS = ROOT / "tools" / "mutation_verdicts.toml"
SIM_CORPUS = ROOT / "tools" / "sim_corpus.txt"
REPORT = ROOT / "docs" / "mutation-survivors.md"
#: What ``run`` records of itself for ``report`` (mutants/ is git-ignored).
RUNS = MUTANTS / "walchannel-mutation-runs.json"

#: mutmut's exit-code statuses the score counts as detected: a test failed,
#: or the mutant ran past its budget (an endless loop) or was killed at it.
DETECTED = ("killed", "timeout", "segfault")
#: Tested, and no test noticed: the survivors' table lists them.
UNDETECTED = ("survived", "no tests", "suspicious")
NOT_TESTED = ("not checked", "check was interrupted by user", "skipped")
#: Not tested, and to be: what a resumed run picks up.
PENDING = ("not checked", "check was interrupted by user")


def _config() -> dict[str, Any]:
    with open(ROOT / "pyproject.toml", "rb") as f:
        config: dict[str, Any] = tomllib.load(f)["tool"]["mutmut"]
    return config


def _module(path: str) -> str:
    return path.removesuffix(".py").replace("/", ".")


def _meta(path: str) -> dict[str, Any] | None:
    meta = MUTANTS / f"{path}.meta"
    try:
        data: dict[str, Any] = json.loads(meta.read_text())
    except FileNotFoundError:
        return None
    return data


def _status(code: int | None) -> str:
    from mutmut.stats import status_by_exit_code  # the extra: imported once it is checked

    return str(status_by_exit_code[code])


def _git(*args: str) -> str:
    run = subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True, check=False)
    return run.stdout.strip()


def _have_mutmut() -> bool:
    if importlib.util.find_spec("mutmut") is None:
        print("mutation: mutmut is missing: make mutation pip-installs it (.[test,mutation])")
        return False
    return True


# -- run ---------------------------------------------------------------------------


def _names_to_run(files: list[str], configured: list[str], retest: bool) -> list[str] | None:
    """The mutant names to hand mutmut; [] for "every mutant not yet tested"; None: nothing."""
    if not retest and sorted(files) == sorted(configured):
        return []  # mutmut's own resume: it skips every mutant with a result
    names: list[str] = []
    for path in files:
        meta = _meta(path)
        mutated = MUTANTS / path
        fresh = (
            meta is not None
            and mutated.exists()
            and (ROOT / path).stat().st_mtime < mutated.stat().st_mtime
        )
        if not fresh:
            # Not generated yet, or its source changed: every mutant of the file
            # (a named mutant is always re-tested, so no finished one is named).
            names.append(f"{_module(path)}.*")
            continue
        assert meta is not None
        wanted = UNDETECTED if retest else PENDING
        names += [k for k, v in meta["exit_code_by_key"].items() if _status(v) in wanted]
    return names or None


def _requeue_interrupted(files: list[str]) -> None:
    """A mutant whose tests a Ctrl-C cut short has no verdict: test it again."""
    for path in files:
        meta = _meta(path)
        if meta is None:
            continue
        codes = meta["exit_code_by_key"]
        cut = [k for k, v in codes.items() if _status(v) == "check was interrupted by user"]
        if cut:
            codes.update(dict.fromkeys(cut))
            (MUTANTS / f"{path}.meta").write_text(json.dumps(meta, indent=4))


def _snapshot(files: list[str]) -> dict[str, str]:
    """The meta files as they are, each parsed once to be sure it is whole."""
    saved: dict[str, str] = {}
    for path in files:
        meta = MUTANTS / f"{path}.meta"
        for _ in range(20):
            try:
                text = meta.read_text()
                json.loads(text)
            except FileNotFoundError:
                break
            except json.JSONDecodeError:
                time.sleep(0.05)  # mutmut is writing it
                continue
            saved[path] = text
            break
    return saved


def _stop(proc: subprocess.Popen[bytes], files: list[str]) -> None:
    """Stop mutmut at the budget: SIGINT to it alone, as Ctrl-C would.

    mutmut then ends its workers and keeps every result it has; the mutant in
    flight stays untested. A result written at that very moment could be cut
    short: the meta files are checked afterwards and restored from a
    snapshot taken just before.
    """
    saved = _snapshot(files)
    proc.send_signal(signal.SIGINT)
    try:
        proc.wait(timeout=120)
    except subprocess.TimeoutExpired:
        proc.terminate()
        proc.wait(timeout=30)
    for path, text in saved.items():
        meta = MUTANTS / f"{path}.meta"
        try:
            json.loads(meta.read_text())
        except (FileNotFoundError, json.JSONDecodeError):
            meta.write_text(text)
            print(f"mutation: {meta} was cut short at the stop; restored its last whole copy")


def _progress(files: list[str]) -> tuple[Counter[str], dict[str, tuple[str, float]]]:
    """How many mutants have each status; each mutant's status and mutmut's time for it (s)."""
    counts: Counter[str] = Counter()
    each: dict[str, tuple[str, float]] = {}
    for path in files:
        meta = _meta(path)
        if meta is None:
            continue
        for key, code in meta["exit_code_by_key"].items():
            status = _status(code)
            counts[status] += 1
            each[key] = (status, float(meta["durations_by_key"].get(key, 0.0)))
    return counts, each


def _worst_case_s(files: list[str]) -> float:
    """Seconds the untested mutants take if every one survives: all its tests, plus a fork."""
    try:
        stats = json.loads((MUTANTS / "mutmut-stats.json").read_text())
    except FileNotFoundError:
        return 0.0
    tests = stats["tests_by_mangled_function_name"]
    duration = stats["duration_by_test"]
    total = 0.0
    for path in files:
        meta = _meta(path) or {"exit_code_by_key": {}}
        for key, code in meta["exit_code_by_key"].items():
            if _status(code) in PENDING:
                function = key.partition("__mutmut_")[0]
                total += 0.3 + sum(duration.get(t, 0.0) for t in tests.get(function, ()))
    return total


def _runs() -> list[dict[str, Any]]:
    runs: list[dict[str, Any]] = []
    with contextlib.suppress(FileNotFoundError):
        runs = json.loads(RUNS.read_text())
    return runs


def _record_run(entry: dict[str, Any]) -> None:
    RUNS.write_text(json.dumps([*_runs(), entry], indent=2))


def _tests_hash() -> str:
    """A hash of the test command's files: the selection, conftest, the simulator and its seeds.

    mutmut re-tests a mutant when its own function changes, and every mutant
    when the list changes, but not when a listed test file does (a new test
    only joins the survivors' re-test, ``--retest``): results from older
    tests are flagged. An entry may be one test (``file::name``): its file
    is hashed.
    """
    selection = _config()["pytest_add_cli_args_test_selection"]
    paths = [ROOT / p.split("::")[0] for p in selection]
    paths += [ROOT / "tests" / "conftest.py", ROOT / "tools" / "sim.py", SIM_CORPUS]
    digest = hashlib.sha256()
    for path in sorted(paths):
        digest.update(str(path.relative_to(ROOT)).encode())
        digest.update(path.read_bytes() if path.is_file() else b"")
    return digest.hexdigest()[:12]


def _stale_tests_note() -> str | None:
    older = [r for r in _runs() if r.get("tests") not in (None, _tests_hash())]
    if not older:
        return None
    return (
        f"{len(older)} of the runs behind these results used other tests than the "
        "tree's (the selection, tools/sim.py or its corpus changed since): a killed "
        "mutant stays killed and a survivor is re-tested only with --retest; "
        "`rm -rf mutants` for a score of the current tests"
    )


def run(args: argparse.Namespace) -> int:
    if not _have_mutmut():
        return 2
    configured: list[str] = _config()["only_mutate"]
    files: list[str] = args.files or configured
    unknown = [f for f in files if f not in configured]
    if unknown:
        print(f"mutation: {unknown} not in [tool.mutmut] only_mutate of pyproject.toml")
        return 2
    _requeue_interrupted(files)
    stale = _stale_tests_note()
    if stale and not args.retest:
        print(f"mutation: note: {stale}")
    names = _names_to_run(files, configured, args.retest)
    if names is None:
        print("mutation: every mutant of " + ", ".join(files) + " has a result")
        return 0
    MUTANTS.mkdir(exist_ok=True)
    command = [
        str(Path(sys.executable).parent / "mutmut"),
        "run",
        "--max-children",
        str(args.children),
        *names,
    ]
    budget_s = args.budget_min * 60.0
    shown = " ".join(command[:4]) + (f" <{len(names)} names>" if names else "")
    print(f"mutation: {shown}; budget {args.budget_min:g} min", flush=True)
    before, before_each = _progress(files)
    start = time.monotonic()
    proc = subprocess.Popen(command, cwd=ROOT)
    stopped = False
    try:
        code = proc.wait(timeout=budget_s)
    except subprocess.TimeoutExpired:
        stopped = True
        _stop(proc, files)
        code = proc.returncode
    except KeyboardInterrupt:
        _stop(proc, files)
        raise
    elapsed = time.monotonic() - start
    counts, each = _progress(files)
    total = sum(counts.values())
    pending = sum(counts[s] for s in NOT_TESTED)
    done = total - pending
    # This run's mutants: a verdict now, and none (or another time) before.
    now = [
        t
        for key, (status, t) in each.items()
        if status not in NOT_TESTED and before_each.get(key, ("", -1.0)) != (status, t)
    ]
    tested_now = len(now)
    detected_now = sum(before[s] for s in UNDETECTED) - sum(counts[s] for s in UNDETECTED)
    pace = sum(now) / tested_now if tested_now else 0.0
    _record_run(
        {
            "commit": _git("rev-parse", "--short", "HEAD"),
            "dirty": bool(_git("status", "--porcelain", "--", "walchannel", "tests", "tools")),
            "files": files,
            "retest": bool(args.retest),
            "started": time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(time.time() - elapsed)),
            "wall_s": round(elapsed, 1),
            "budget_min": args.budget_min,
            "stopped_at_budget": stopped,
            "mutmut_exit": code,
            "tested_in_this_run": tested_now,
            "s_per_mutant": round(pace, 2),
            "tested": done,
            "total": total,
            "tests": _tests_hash(),
        }
    )
    print()
    print(
        f"mutation: {done} of {total} mutants tested; "
        + ", ".join(f"{k} {v}" for k, v in sorted(counts.items()))
    )
    print(
        f"mutation: this run tested {tested_now} in {elapsed / 60:.1f} min wall "
        f"({pace:.2f} s each by mutmut's clock; the rest is its start)"
        + (f"; {detected_now} of the survivors are detected now" if args.retest else "")
    )
    if pending:
        why = "stopped at the budget" if stopped else f"mutmut exited {code}"
        print(
            f"mutation: {why}; {pending} left: about {pending * pace / 60:.0f} min at this "
            f"pace, at most {_worst_case_s(files) / 60:.0f} min if every one survives; "
            "run it again to go on"
        )
    if code not in (0, None) and not stopped:
        return 1
    return 0


# -- report ------------------------------------------------------------------------


@dataclass(frozen=True)
class Mutant:
    """One mutant as the report shows it; ``identity`` is what a verdict is matched by."""

    name: str
    path: str
    function: str
    line: int
    old: str
    new: str
    nth: int
    status: str

    @property
    def identity(self) -> tuple[str, str, str, str, int]:
        return (self.path, self.function, self.old, self.new, self.nth)


def _function(name: str) -> str:
    from mutmut.utils.format_utils import orig_function_and_class_names_from_key

    func, cls = orig_function_and_class_names_from_key(name)
    return f"{cls}.{func}" if cls else func


def _changed(diff: str) -> tuple[int, str, str]:
    """The first changed line's 1-based index in the function's text, the old and new text."""
    old: list[str] = []
    new: list[str] = []
    first = 0
    index = 0
    for line in diff.splitlines():
        hunk = re.match(r"@@ -(\d+)", line)
        if hunk:
            index = int(hunk.group(1)) - 1
        elif line.startswith(("---", "+++")):
            continue
        elif line.startswith("-"):
            index += 1
            first = first or index
            old.append(line[1:].strip())
        elif line.startswith("+"):
            first = first or index + 1
            new.append(line[1:].strip())
        elif line.startswith(" "):
            index += 1
    return first, " ".join(old), " ".join(new)


def _line_of(source: list[str], function_text: list[str], index: int) -> int:
    """The file line of ``function_text``'s line ``index`` (1-based): where the text sits."""
    want = [line.strip() for line in function_text]
    stripped = [line.strip() for line in source]
    for start in range(len(stripped) - len(want) + 1):
        if stripped[start : start + len(want)] == want:
            return start + index
    return 0


def _mutants(path: str, statuses: tuple[str, ...], functions: set[str]) -> list[Mutant]:
    """The mutants of ``path`` whose status is in ``statuses`` or function in ``functions``."""
    import libcst  # mutmut's own dependency
    from mutmut.mutation.diff_apply import read_functions_from_index

    meta = _meta(path)
    if meta is None:
        return []
    source = (ROOT / path).read_text().splitlines()
    seen: Counter[tuple[str, str, str, str]] = Counter()
    out: list[Mutant] = []
    cwd = os.getcwd()
    os.chdir(ROOT)  # mutmut reads mutants/ relative to the project
    try:
        for name, code in meta["exit_code_by_key"].items():
            status = _status(code)
            function = _function(name)
            pair = read_functions_from_index(name, path)
            if pair is None:
                continue
            orig, mutant = (libcst.Module([f]).code.strip().splitlines() for f in pair)
            diff = "\n".join(difflib.unified_diff(orig, mutant, lineterm=""))
            index, old, new = _changed(diff)
            seen[(path, function, old, new)] += 1
            m = Mutant(
                name=name,
                path=path,
                function=function,
                line=_line_of(source, orig, index),
                old=old,
                new=new,
                nth=seen[(path, function, old, new)],
                status=status,
            )
            if status in statuses or function in functions:
                out.append(m)
    finally:
        os.chdir(cwd)
    return out


@dataclass(frozen=True)
class Verdict:
    path: str
    function: str
    old: str
    new: str
    nth: int
    verdict: str

    @property
    def identity(self) -> tuple[str, str, str, str, int]:
        return (self.path, self.function, self.old, self.new, self.nth)

    @property
    def equivalent(self) -> bool:
        return self.verdict.startswith("equivalent")


def _verdicts() -> list[Verdict]:
    if not VERDICTS.exists():
        return []
    with open(VERDICTS, "rb") as f:
        data = tomllib.load(f)
    out = []
    for i, v in enumerate(data.get("verdict", [])):
        text = str(v["verdict"])
        if not text.startswith(("equivalent: ", "missing check: ")):
            raise SystemExit(
                f"{VERDICTS}: verdict {i + 1} ({v['function']}): a verdict begins "
                f"'equivalent: ' or 'missing check: ', not {text[:30]!r}"
            )
        out.append(
            Verdict(
                path=v["file"],
                function=v["function"],
                old=v["old"],
                new=v["new"],
                nth=int(v.get("nth", 1)),
                verdict=text,
            )
        )
    return out


def _cell(text: str) -> str:
    text = text.replace("|", "\\|")
    return f"`{text}`" if text else "(removed)"


def report(args: argparse.Namespace) -> int:
    if not _have_mutmut():
        return 2
    files: list[str] = _config()["only_mutate"]
    verdicts = _verdicts()
    by_identity = {v.identity: v for v in verdicts}
    named = {v.function for v in verdicts}
    rows: list[Mutant] = []
    fixed: list[tuple[Mutant, Verdict]] = []
    matched: set[tuple[str, str, str, str, int]] = set()
    table = []
    totals: Counter[str] = Counter()
    for path in files:
        meta = _meta(path)
        counts = Counter(_status(c) for c in (meta or {}).get("exit_code_by_key", {}).values())
        listed = _mutants(path, UNDETECTED, named)
        for m in listed:
            if m.identity in by_identity:
                matched.add(m.identity)
                if not by_identity[m.identity].equivalent and m.status not in UNDETECTED:
                    fixed.append((m, by_identity[m.identity]))
        survivors = [m for m in listed if m.status in UNDETECTED]
        rows += survivors
        equivalent = sum(
            1 for m in survivors if m.identity in by_identity and by_identity[m.identity].equivalent
        )
        total = sum(counts.values())
        tested = total - sum(counts[s] for s in NOT_TESTED)
        detected = sum(counts[s] for s in DETECTED)
        row: dict[str, Any] = {
            "path": path,
            "total": total,
            "tested": tested,
            "detected": detected,
            "timeout": counts["timeout"] + counts["segfault"],
            "survived": counts["survived"] + counts["suspicious"],
            "no_tests": counts["no tests"],
            "equivalent": equivalent,
        }
        table.append(row)
        for k, v in row.items():
            if k != "path":
                totals[k] += int(v)

    def score(r: dict[str, Any] | Counter[str]) -> str:
        base = int(r["tested"]) - int(r["equivalent"])
        return f"{100.0 * int(r['detected']) / base:.1f} %" if base else "-"

    runs = _runs()
    lines = [
        "# Mutation survivors",
        "",
        "Generated by `python tools/mutation.py report` (`make mutation`) from the",
        "results in `mutants/` and the hand-kept verdicts of",
        "`tools/mutation_verdicts.toml`; edit the verdicts there, not here.",
        "How it runs, and why mutmut: [reliability.md](reliability.md#mutation-score).",
        "",
        "## Score",
        "",
        "Detected: a test failed, or the mutant ran past its time budget. The score",
        "is detected / (tested - equivalent); an equivalent mutant behaves as the",
        "code does, so no test can tell them apart.",
        "",
        "| file | mutants | tested | detected | of them timeouts | survived | no test ran it "
        "| equivalent | score |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in [*table, {"path": "**all**", **totals}]:
        lines.append(
            f"| {r['path']} | {r['total']} | {r['tested']} | {r['detected']} | {r['timeout']} "
            f"| {r['survived']} | {r['no_tests']} | {r['equivalent']} | {score(r)} |"
        )
    if runs:
        lines += [
            "",
            "The runs behind these results (`mutants/`; `rm -rf mutants` starts afresh):",
            "",
            "| started | commit | files | what | wall | mutants | s each | stopped at the budget |",
            "|---|---|---|---|---:|---:|---:|---|",
        ]
        for r in runs:
            commit = r["commit"] + (" + changes" if r.get("dirty") else "")
            what = "survivors re-tested" if r.get("retest") else "untested ones"
            stopped = f"yes ({r['budget_min']:g} min)" if r.get("stopped_at_budget") else "no"
            each = f"{r['s_per_mutant']:.2f}" if "s_per_mutant" in r else "-"
            lines.append(
                f"| {r['started']} | {commit} | {', '.join(r['files'])} | {what} "
                f"| {r['wall_s'] / 60:.1f} min | {r['tested_in_this_run']} | {each} | {stopped} |"
            )
        stale = _stale_tests_note()
        if stale:
            lines += ["", f"**Note:** {stale}."]
    lines += [
        "",
        "## Survivors",
        "",
        "Every mutant no test detected, with its verdict: *equivalent* (why no",
        "test can tell it from the code) or *missing check* (the test added for",
        "it; it is then detected and moves to the next table at the next run).",
        "",
        "| # | where | function | mutation | status | verdict |",
        "|---:|---|---|---|---|---|",
    ]
    missing_verdicts = 0
    for i, m in enumerate(sorted(rows, key=lambda m: (m.path, m.line, m.nth)), 1):
        v = by_identity.get(m.identity)
        if v is None:
            missing_verdicts += 1
        verdict = v.verdict if v else "**no verdict yet**"
        if v is not None and not v.equivalent:
            verdict = f"**{verdict}** (the run predates the test: `--retest`)"
        lines.append(
            f"| {i} | {m.path}:{m.line} | `{m.function}` | {_cell(m.old)} → {_cell(m.new)} "
            f"| {m.status} | {verdict.replace('|', '/')} |"
        )
    if not rows:
        lines.append("| | | | | | none |")
    lines += [
        "",
        "## Survivors a test added for them now detects",
        "",
        "| where | function | mutation | status now | the check added |",
        "|---|---|---|---|---|",
    ]
    for m, v in sorted(fixed, key=lambda x: (x[0].path, x[0].line)):
        lines.append(
            f"| {m.path}:{m.line} | `{m.function}` | {_cell(m.old)} → {_cell(m.new)} "
            f"| {m.status} | {v.verdict.removeprefix('missing check: ')} |"
        )
    if not fixed:
        lines.append("| | | | | none |")
    unmatched = [v for v in verdicts if v.identity not in matched]
    if unmatched:
        lines += [
            "",
            "## Verdicts that match no mutant",
            "",
            "Their code changed or mutmut no longer makes them: delete them from",
            "`tools/mutation_verdicts.toml`.",
            "",
        ]
        lines += [f"- {v.path} `{v.function}`: {_cell(v.old)} → {_cell(v.new)}" for v in unmatched]
    out = Path(args.out)
    out.write_text("\n".join(lines) + "\n")
    print(
        f"mutation: score {score(totals)} ({totals['detected']} detected of "
        f"{totals['tested']} tested, {totals['equivalent']} equivalent, "
        f"{totals['total'] - totals['tested']} untested); {len(rows)} survivors, "
        f"{missing_verdicts} without a verdict; wrote {out.relative_to(ROOT)}"
    )
    return 0


def _toml(text: str) -> str:
    return json.dumps(text, ensure_ascii=False)  # a JSON string is a TOML basic string


def stub(m: Mutant) -> str:
    """A ``[[verdict]]`` entry for ``m`` to paste into tools/mutation_verdicts.toml and finish."""
    lines = [
        "[[verdict]]",
        f"# {m.path}:{m.line}, {m.status} ({m.name})",
        f"file = {_toml(m.path)}",
        f"function = {_toml(m.function)}",
        f"old = {_toml(m.old)}",
        f"new = {_toml(m.new)}",
    ]
    if m.nth > 1:
        lines.append(f"nth = {m.nth}")
    lines.append('verdict = "equivalent: WHY / missing check: tests/FILE.py::TEST"')
    return "\n".join(lines) + "\n"


def stubs(args: argparse.Namespace) -> int:
    if not _have_mutmut():
        return 2
    known = {v.identity for v in _verdicts()}
    for path in _config()["only_mutate"]:
        for m in _mutants(path, UNDETECTED, set()):
            if m.identity not in known:
                print(stub(m))
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python tools/mutation.py", description=__doc__.split("\n\n")[0]
    )
    sub = parser.add_subparsers(dest="command", required=True)
    p_run = sub.add_parser("run", help="test the mutants not yet tested, within a budget")
    p_run.add_argument(
        "--budget-min", type=float, default=240.0, help="stop after this many minutes (240)"
    )
    p_run.add_argument(
        "--files", nargs="+", default=None, help="only these of [tool.mutmut] only_mutate"
    )
    p_run.add_argument(
        "--retest", action="store_true", help="test the survivors again (after adding tests)"
    )
    p_run.add_argument(
        "--children", type=int, default=1, help="mutants tested at once (1: one core)"
    )
    p_report = sub.add_parser("report", help=f"write {REPORT.relative_to(ROOT)}")
    p_report.add_argument("--out", default=str(REPORT), help="the report's path")
    sub.add_parser("stubs", help="print verdict entries for the survivors that have none")
    args = parser.parse_args(argv)
    commands = {"run": run, "report": report, "stubs": stubs}
    return commands[args.command](args)


if __name__ == "__main__":
    sys.exit(main())
