"""``chown_tree`` hands a job's directory to its user and takes it back without ever following a link a job
planted (design §19.5): by directory descriptors, each entry changed without following it."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from nodeagent.confine import chown_tree

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="changing owners needs root")

JOB_UID = 65534  # nobody


def test_links_are_changed_themselves_and_their_targets_are_left_alone(tmp_path: Path) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "secret").write_text("x")
    tree = tmp_path / "job"
    (tree / "sub").mkdir(parents=True)
    (tree / "sub" / "file").write_text("y")
    (tree / "link-to-dir").symlink_to(outside)
    (tree / "sub" / "link-to-file").symlink_to(outside / "secret")

    chown_tree(tree, JOB_UID, JOB_UID)
    for path in (tree, tree / "sub", tree / "sub" / "file"):
        assert path.stat().st_uid == JOB_UID
    assert os.lstat(tree / "link-to-dir").st_uid == JOB_UID  # the link itself
    assert outside.stat().st_uid == 0 and (outside / "secret").stat().st_uid == 0  # never its target

    chown_tree(tree, 0, 0)
    assert {p.lstat().st_uid for p in [tree, *tree.rglob("*")]} == {0}


def test_a_root_that_is_a_link_is_not_followed(tmp_path: Path) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    (tmp_path / "job").symlink_to(outside)
    chown_tree(tmp_path / "job", JOB_UID, JOB_UID)
    assert outside.stat().st_uid == 0
    chown_tree(tmp_path / "missing", JOB_UID, JOB_UID)  # nothing there: nothing done
