"""Line counts of the package by layer: code, docstring, comment and blank lines.

    python tools/line_counts.py                 # the working tree, by layer
    python tools/line_counts.py --files         # and every module
    python tools/line_counts.py --before REV    # REV's files too, each counted in the
                                                # layer its file sits in now (git's
                                                # rename detection follows the moves)

A layer is a folder of ``walchannel/`` (``core``, ``log``, ``wire``, ...) or
``(top level)``; the generated ``_proto`` is left out. A docstring line is a
line of a module's, class's or function's docstring; a comment line holds
only a comment. docs/design.md quotes the output.
"""

from __future__ import annotations

import argparse
import ast
import io
import subprocess
import tokenize
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
KINDS = ("code", "docstring", "comment", "blank")


def count(text: str) -> Counter[str]:
    """Return how many lines of ``text`` (Python source) are of each of :data:`KINDS`."""
    lines = text.splitlines()
    docstring: set[int] = set()
    for node in ast.walk(ast.parse(text)):
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
            body = node.body
            if (
                body
                and isinstance(body[0], ast.Expr)
                and isinstance(body[0].value, ast.Constant)
                and isinstance(body[0].value.value, str)
            ):
                end = body[0].end_lineno or body[0].lineno
                docstring.update(range(body[0].lineno, end + 1))
    comment: set[int] = set()
    code: set[int] = set()
    for tok in tokenize.generate_tokens(io.StringIO(text).readline):
        if tok.type == tokenize.COMMENT:
            comment.add(tok.start[0])
        elif tok.type not in (tokenize.NL, tokenize.NEWLINE, tokenize.INDENT, tokenize.DEDENT):
            code.update(range(tok.start[0], tok.end[0] + 1))
    counts: Counter[str] = Counter()
    for number, line in enumerate(lines, 1):
        if number in docstring:
            counts["docstring"] += 1
        elif number in code:
            counts["code"] += 1
        elif number in comment:
            counts["comment"] += 1
        elif not line.strip():
            counts["blank"] += 1
        else:
            counts["code"] += 1  # inside a multi-line string that is not a docstring
    return counts


def layer(path: str) -> str:
    """The layer of ``path`` (``walchannel/...``): its folder, or ``(top level)``."""
    parts = Path(path).parts
    return parts[1] if len(parts) > 2 else "(top level)"


def counted(path: str) -> bool:
    return path.startswith("walchannel/") and path.endswith(".py") and "/_proto/" not in path


def now() -> dict[str, str]:
    """``{path: source}`` of the package's modules in the working tree."""
    return {
        p.relative_to(ROOT).as_posix(): p.read_text()
        for p in sorted((ROOT / "walchannel").rglob("*.py"))
        if counted(p.relative_to(ROOT).as_posix())
    }


def before(rev: str) -> dict[str, str]:
    """``{path now: source at rev}``: each module of ``rev`` under the path it has now.

    A file that left the package (the demo) is counted under where it went,
    as ``(left)``; a module that became a folder, as that folder's ``__init__``.
    """

    def git(*args: str) -> str:
        return subprocess.run(
            ["git", *args], cwd=ROOT, check=True, capture_output=True, text=True
        ).stdout

    renamed: dict[str, str] = {}
    for line in git("diff", "-M", "--name-status", rev, "--", ".").splitlines():
        status, *paths = line.split("\t")
        if status.startswith("R") and len(paths) == 2:
            renamed[paths[0]] = paths[1]
    old = [p for p in git("ls-tree", "-r", "--name-only", rev, "walchannel").split() if counted(p)]
    out = {}
    for path in old:
        new = renamed.get(path, path)
        if not (ROOT / new).exists() and (ROOT / new.removesuffix(".py")).is_dir():
            new = new.removesuffix(".py") + "/__init__.py"  # a module that became a folder
        elif not (ROOT / new).exists() and (ROOT / "examples" / new.split("/", 1)[1]).exists():
            new = "examples/" + new.split("/", 1)[1]  # left the package for examples/
        out[new] = git("show", f"{rev}:{path}")
    return out


def table(sources: dict[str, str], *, files: bool) -> list[str]:
    """Markdown rows: a layer's modules and lines of each kind (a row per module too)."""
    by_layer: dict[str, Counter[str]] = {}
    modules: Counter[str] = Counter()
    rows = []
    for path, text in sorted(sources.items()):
        name = layer(path) if path.startswith("walchannel/") else f"{Path(path).parent}/ (left)"
        counts = count(text)
        by_layer.setdefault(name, Counter()).update(counts)
        modules[name] += 1
        if files:
            rows.append(f"| `{path}` | 1 | " + " | ".join(str(counts[k]) for k in KINDS) + " |")
    total: Counter[str] = Counter()
    out = ["| layer | modules | " + " | ".join(KINDS) + " |", "|---|---:|" + "---:|" * len(KINDS)]
    for name, counts in sorted(by_layer.items()):
        total.update(counts)
        cells = " | ".join(str(counts[k]) for k in KINDS)
        out.append(f"| {name} | {modules[name]} | {cells} |")
    out.append(
        f"| **all** | {sum(modules.values())} | "
        + " | ".join(f"**{total[k]}**" for k in KINDS)
        + " |"
    )
    return out + (["", *rows] if rows else [])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--before", metavar="REV", help="also count REV, by today's layers")
    parser.add_argument("--files", action="store_true", help="a row per module too")
    args = parser.parse_args()
    if args.before:
        print(f"before ({args.before}):\n")
        print("\n".join(table(before(args.before), files=args.files)))
        print("\nafter (the working tree):\n")
    print("\n".join(table(now(), files=args.files)))


if __name__ == "__main__":
    main()
