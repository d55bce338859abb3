"""Count the public ``Driver`` members the rest of the package (the glue) uses.

``python tools/driver_members.py [ROOT]`` reads ``ROOT/walchannel`` (default:
this checkout): the public methods and properties of
``walchannel.core.driver.Driver``, and which of them any other module names
on a driver (``driver.x``, ``self._driver.x``, ``driver_of(ch).x``). The
before and after of issue 60 are in docs/design.md, "The driver: events
and actions"; to count an older tree, check it out first
(``git worktree add /tmp/old REV``) and pass its path.
"""

from __future__ import annotations

import argparse
import ast
import re
from pathlib import Path

RECEIVERS = re.compile(r"\b(?:driver|_driver|d|driver_of\([^)]*\))\.(\w+)")


def members(driver_py: Path) -> dict[str, str]:
    """The public members of ``Driver`` in ``driver_py``: name -> "property" or "method"."""
    found: dict[str, str] = {}
    for node in ast.parse(driver_py.read_text()).body:
        if isinstance(node, ast.ClassDef) and node.name == "Driver":
            for item in node.body:
                if isinstance(item, ast.FunctionDef) and not item.name.startswith("_"):
                    prop = any(
                        isinstance(d, ast.Name) and d.id == "property" for d in item.decorator_list
                    )
                    found[item.name] = "property" if prop else "method"
    return found


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("root", nargs="?", type=Path, default=Path(__file__).parents[1])
    root = parser.parse_args().root
    package = root / "walchannel"
    driver_py = package / "core" / "driver.py"
    if not driver_py.exists():
        driver_py = package / "driver.py"  # before the folders (issue 59)
    known = members(driver_py)
    used: set[str] = set()
    for path in package.rglob("*.py"):
        if path == driver_py:
            continue
        used |= {m for m in RECEIVERS.findall(path.read_text()) if m in known}
    kinds = {kind: sorted(u for u in used if known[u] == kind) for kind in ("method", "property")}
    declared = {kind: sum(1 for v in known.values() if v == kind) for kind in kinds}
    print(f"Driver declares {declared['method']} public methods, {declared['property']} properties")
    print(
        f"the glue uses {len(used)}: {len(kinds['method'])} methods, "
        f"{len(kinds['property'])} properties"
    )
    print("methods:", ", ".join(kinds["method"]))
    print("properties:", ", ".join(kinds["property"]))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
