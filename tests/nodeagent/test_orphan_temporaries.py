"""Checkpoint temporaries a writer killed mid-write left behind are removed by the agent (design §2, §19.5): only
the exact temporary names, only regular files, only when the writer is gone, never through a symlink."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

from nodeagent import jobkit
from nodeagent.runner import start_job


def _dead_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


def test_dead_writers_temporary_removed_live_writers_kept(tmp_path: Path) -> None:
    ckpt = tmp_path / "ckpt" / "7"
    ckpt.mkdir(parents=True)
    dead, live = _dead_pid(), os.getpid()
    (ckpt / f".ckpt-00000003.ckpt.tmp-{dead}").write_bytes(b"half")
    (ckpt / f".ckpt-00000003.json.tmp-{dead}").write_bytes(b"{")
    (ckpt / f".ckpt-00000004.ckpt.tmp-{live}").write_bytes(b"being written")
    kept = [f".progress.json.tmp-{dead}", f"ckpt-00000003.ckpt.tmp-{dead}", f".ckpt-00000003.ckpt.tmp-{dead}x",
            ".ckpt-00000003.ckpt.tmp-0", "ckpt-00000002.ckpt", "ckpt-00000002.json"]
    for name in kept:
        (ckpt / name).write_bytes(b"x")
    removed = jobkit.remove_orphan_temporaries(ckpt)
    assert sorted(removed) == sorted([f".ckpt-00000003.ckpt.tmp-{dead}", f".ckpt-00000003.json.tmp-{dead}"])
    assert sorted(p.name for p in ckpt.iterdir()) == sorted([*kept, f".ckpt-00000004.ckpt.tmp-{live}"])


def test_symlinks_named_like_temporaries_are_not_followed(tmp_path: Path) -> None:
    root = tmp_path / "ckpt"
    (root / "7").mkdir(parents=True)
    outside = tmp_path / "outside"
    outside.mkdir()
    target = outside / f".ckpt-00000001.ckpt.tmp-{_dead_pid()}"
    target.write_bytes(b"not the agent's to delete")
    link = root / "7" / target.name
    link.symlink_to(target)
    (root / "8").symlink_to(outside, target_is_directory=True)  # a job directory that is a link: not entered
    assert jobkit.remove_orphan_temporaries_under(root) == {}
    assert target.read_bytes() == b"not the agent's to delete" and link.is_symlink()
    assert jobkit.remove_orphan_temporaries(link) == []  # a link given as the directory is not opened either
    assert jobkit.remove_orphan_temporaries(root / "8") == [] and target.exists()


def test_a_job_killed_mid_write_leaves_no_temporary_after_it_ends(tmp_path: Path) -> None:
    """The runner (the agent's side) removes the temporary when the job ends; a new start would too."""
    data = tmp_path / "data"
    script = ("import os, time; from pathlib import Path; d = Path(os.environ['RECLAIMNET_CKPT_DIR']); "
              "(d / f'.ckpt-00000001.ckpt.tmp-{os.getpid()}').write_bytes(b'half'); time.sleep(60)")
    run = start_job(data_dir=data, base_dir=tmp_path, job_id="5", command=f"{sys.executable} -c \"{script}\"",
                    gpus=[], interval_s=None, next_sequence=1, restore_sequence=None, compat={},
                    kill_with_agent=True)
    deadline = time.monotonic() + 20
    while not list(run.ckpt_dir.glob(".ckpt-*.tmp-*")) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert [p.name for p in run.ckpt_dir.glob(".ckpt-*")] == [f".ckpt-00000001.ckpt.tmp-{run.proc.pid}"]
    assert jobkit.remove_orphan_temporaries(run.ckpt_dir) == []  # its writer is alive: in use
    run.signal(9)
    run.proc.wait(timeout=20)
    run.finish()
    assert list(run.ckpt_dir.iterdir()) == []
