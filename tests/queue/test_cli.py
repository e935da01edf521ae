"""The command line submits arrays and dependencies through the fair queue's submit fields (design §16.6): the
installed ``reclaimnet`` script against a live portal (tests/cli's module-scoped server)."""

from __future__ import annotations

from pathlib import Path

from portal.core.models import Job
from portal.queue.models import JobArray, JobDependency
from tests.cli.conftest import (  # noqa: F401  (the live portal, per module)
    LiveCampus,
    campus,
    db,
    live_campus,
)

SPEC = """\
name: {name}
group: NLP Group
command: python train.py --seed $RECLAIMNET_ARRAY_INDEX
gpu_count: 1
expected_runtime_s: 10m
ckpt_bytes_estimate: 1MB
{extra}
"""


def _spec(tmp_path: Path, name: str, extra: str) -> str:
    path = tmp_path / f"{name}.yaml"
    path.write_text(SPEC.format(name=name, extra=extra))
    return str(path)


def test_the_cli_submits_an_array_and_a_dependant_and_refuses_a_bad_throttle_naming_the_field(
        campus: LiveCampus, tmp_path: Path) -> None:  # noqa: F811
    shell = campus.terminal("researcher")
    done = shell.run("submit", _spec(tmp_path, "cli-sweep", "array: 0-3%2"))
    assert done.returncode == 0, done.stderr
    arr = JobArray.objects.get(name="cli-sweep")
    ids = sorted(Job.objects.filter(array_task__array=arr).values_list("pk", flat=True))
    assert (arr.size, arr.throttle, len(ids)) == (4, 2, 4)
    assert f"Submitted array {arr.pk} (cli-sweep, 0-3%2): 4 jobs {ids[0]}–{ids[-1]}." in done.stdout

    after = shell.run("submit", _spec(tmp_path, "cli-eval", f"after_ok: [{ids[0]}, {ids[1]}]"))
    assert after.returncode == 0, after.stderr
    child = Job.objects.get(name="cli-eval")
    assert sorted(JobDependency.objects.filter(job=child).values_list("parent_id", flat=True)) == ids[:2]

    refused = shell.run("submit", _spec(tmp_path, "cli-bad", "array: 0-9%0"))
    assert refused.returncode != 0
    assert "array" in refused.stderr and "throttle" in refused.stderr
    assert not Job.objects.filter(name__startswith="cli-bad").exists()
