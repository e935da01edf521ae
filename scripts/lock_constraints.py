"""Write constraints.txt: the exact versions of everything `pip install -e '.[dev]'` installed (design §10).

pyproject.toml keeps ranges (what the code supports); constraints.txt pins the set tested together, and the
Makefile installs with it, so a fresh machine gets the versions CI passed with. Run it in the project's venv
after changing a dependency (`make lock`): it walks the requirement closure of ``reclaimnet[dev,torch]`` and writes
the installed version of each package in it.
"""

from __future__ import annotations

import re
import sys
from importlib import metadata
from pathlib import Path

from packaging.requirements import Requirement

REPO = Path(__file__).resolve().parent.parent


def _name(text: str) -> str:
    return re.sub(r"[-_.]+", "-", text).lower()


def closure(root: str, extras: set[str]) -> dict[str, str]:
    """Installed ``{name: version}`` of ``root`` (with ``extras``) and everything it requires, recursively."""
    seen: dict[str, str] = {}
    todo: list[tuple[str, set[str]]] = [(root, extras)]
    while todo:
        name, wanted = todo.pop()
        dist = metadata.distribution(name)
        key = _name(dist.metadata["Name"])
        if key in seen and not wanted:
            continue
        seen[key] = dist.version
        for text in dist.requires or []:
            req = Requirement(text)
            env = [{"extra": e} for e in (wanted or {""})]
            if req.marker is not None and not any(req.marker.evaluate(e) for e in env):
                continue
            if _name(req.name) not in seen or req.extras:
                todo.append((req.name, set(req.extras)))
    seen.pop(_name(root), None)
    return seen


def main() -> int:
    pins = closure("reclaimnet", {"dev", "torch"})  # the torch extra is what `make test` installs (design §17)
    lines = ["# Exact versions tested together (scripts/lock_constraints.py; `make lock` rewrites it).",
             "# pyproject.toml keeps the supported ranges; the Makefile installs with `-c constraints.txt`."]
    # A local version label (torch's "+cpu") names the build, not the release: the pin is the release.
    lines += [f"{name}=={version.split('+')[0]}" for name, version in sorted(pins.items())]
    (REPO / "constraints.txt").write_text("\n".join(lines) + "\n")
    print(f"constraints.txt: {len(pins)} packages pinned")
    return 0


if __name__ == "__main__":
    sys.exit(main())
