"""The two serial groups of stack tests (tests/conftest.py) run side by side on two xdist workers, so they must
share nothing a test fixes by number: a Redis database named by two groups would have one group's stack flush
or read the other's queues."""

from __future__ import annotations

import re
from collections import defaultdict
from pathlib import Path

from tests.conftest import SECOND_SERIAL_GROUP, SERIAL_GROUP, SERIAL_MARKERS, serial_group_of

TESTS = Path(__file__).resolve().parents[1]
REPO = TESTS.parent

# A Redis database chosen by number: ``redis_db(url, 4)``, ``REDIS_DB = 10``, or either through an environment
# variable's default (``int(os.environ.get("RECLAIMNET_E2E_REDIS_DB", "3"))``).
_DEFAULTED = r'(?:int\(os\.environ\.get\("[A-Z_]+",\s*")?'
_DB_NUMBER = re.compile(rf'(?:redis_db\((?:[^,()]|\([^()]*\))+,\s*{_DEFAULTED}|REDIS_DB\s*=\s*{_DEFAULTED})(\d+)')


def _stack_modules() -> list[Path]:
    markers = tuple(f"pytest.mark.{name}" for name in SERIAL_MARKERS)
    return sorted(p for p in TESTS.rglob("test_*.py") if any(m in p.read_text() for m in markers))


def _redis_dbs(module: Path) -> set[int]:
    """The Redis databases a stack module names itself or through a conftest.py of its folder or above."""
    texts = [module.read_text()]
    for folder in module.parents:
        if folder == TESTS.parent:
            break
        if (folder / "conftest.py").exists() and folder != TESTS:
            texts.append((folder / "conftest.py").read_text())
    return {int(n) for text in texts for n in _DB_NUMBER.findall(text)}


def test_the_redis_database_pattern_finds_the_stacks_known_databases() -> None:
    found = {db for module in _stack_modules() for db in _redis_dbs(module)}
    assert {3, 4, 5, 9, 10} <= found, found


def test_no_redis_database_is_named_by_both_serial_groups() -> None:
    groups_of_db: dict[int, set[str]] = defaultdict(set)
    for module in _stack_modules():
        group = serial_group_of(str(module.relative_to(REPO)))
        for db in _redis_dbs(module):
            groups_of_db[db].add(group)
    shared = {db: groups for db, groups in groups_of_db.items() if len(groups) > 1}
    assert not shared, f"Redis databases named in both serial groups: {shared}"


def test_both_serial_groups_hold_stack_modules() -> None:
    groups = {serial_group_of(str(m.relative_to(REPO))) for m in _stack_modules()}
    assert groups == {SERIAL_GROUP, SECOND_SERIAL_GROUP}
