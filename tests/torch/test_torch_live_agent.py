"""PyTorch and Hugging Face Trainer jobs through the whole product (design §17 over §1-§3): a live portal (daphne with the embedded
control loop, this test database), two real agent processes, a scheduled reclaim of the node the job runs on.
The agent sends the final-checkpoint signal, the checkpoint moves to the other node, the job resumes there and
completes with weights bitwise equal to an uninterrupted run's.

Only processes started here are signalled (harness.Proc, by PID); everything listens on loopback.
"""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.torch.torch_helpers import REPO, assert_state_dicts_bitwise_equal, require

torch = require("torch")

from nodeagent import jobkit  # noqa: E402
from tests.e2e import harness  # noqa: E402

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.timeout(300), pytest.mark.slow,
              pytest.mark.e2e]


@dataclass(frozen=True)
class Case:
    script: str
    args: str
    step_sleep_s: float
    total_steps: int
    resumed_says: str


CASES = {
    # 3 epochs x 20 batches: MLP, AdamW, OneCycleLR, GradScaler, ResumableSampler, three global RNGs.
    "torch": Case("examples/train_torch.py", "--epochs 3 --samples 640 --batch 32", 0.15, 60, "restored step"),
    # 2 epochs x 16 batches: tiny GPT-2 under Trainer + ReclaimNetCallback.
    "hf": Case("examples/train_hf.py", "--epochs 2 --samples 128 --batch 8", 0.3, 32, "resuming from"),
}


@pytest.fixture
def stack(tmp_path: Path) -> Iterator[harness.Stack]:
    if not os.environ.get("DATABASE_URL", "").startswith(("postgres://", "postgresql://")):
        pytest.skip("the live portal shares the test database: needs DATABASE_URL=postgres://…")
    st = harness.Stack(tmp_path / "stack", harness.stack_database_url(), "", extra_env={"REDIS_URL": ""})
    try:
        yield st
    finally:
        st.stop_all()


def _uninterrupted(case: Case, workdir: Path) -> subprocess.Popen[bytes]:
    """The same job with no agent and no reclaim (started first: it runs beside the live one)."""
    workdir.mkdir(parents=True)
    env = {**os.environ, "RECLAIMNET_CKPT_DIR": str(workdir / "ckpt"), "PYTHONPATH": str(REPO)}
    return subprocess.Popen([harness.PY, str(REPO / case.script), *case.args.split(), "--result", "result.json"],
                            cwd=workdir, env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


@pytest.mark.parametrize("kind", sorted(CASES))
def test_reclaimed_job_migrates_through_real_agents_and_ends_bitwise_equal(stack: harness.Stack, tmp_path: Path,
                                                                          kind: str) -> None:
    from django.contrib.auth import get_user_model

    from portal.core.models import Job, Migration, ResearchGroup
    from portal.core.services.jobs import submit_job
    from portal.core.services.reclaims import request_reclaim

    if kind == "hf":
        require("transformers")
    case = CASES[kind]
    reference = _uninterrupted(case, tmp_path / "reference")
    nodes = harness.make_campus([(f"{kind}-live-a1", "A"), (f"{kind}-live-a2", "A")], gpus_per_node=1)
    group, _ = ResearchGroup.objects.get_or_create(slug="e2e-group", defaults={"name": "E2E Group"})
    user, _ = get_user_model().objects.get_or_create(username="e2e")
    group.members.add(user)
    stack.start_portal()
    for name, (_, token) in nodes.items():
        stack.start_agent(name, token, gpus=1)
    job = submit_job(user, group=group, name=f"{kind}-live", gpu_count=1, expected_runtime_s=12,
                     ckpt_bytes_estimate=1_000_000,
                     command=f"python {case.script} {case.args} --step-sleep {case.step_sleep_s}",
                     loss_budget_s=1.0, restart_s=1.0)
    harness.wait_for(lambda: Job.objects.get(pk=job.pk).state == "running", 60, what="the job running")
    first = Job.objects.get(pk=job.pk).placements.get(ended_at__isnull=True).node
    work = stack.agent_dir(first.name) / "jobs" / str(job.pk) / "work"

    def progressed() -> bool:
        try:
            return json.loads((work / "progress.json").read_text())["step"] >= 5
        except (OSError, ValueError, KeyError):
            return False

    harness.wait_for(progressed, 90, what="the job past step 5")
    request_reclaim(first, None, 30.0)
    harness.wait_for(lambda: Job.objects.get(pk=job.pk).state in ("completed", "failed", "cancelled"), 150,
                     what="the job to finish")
    job = Job.objects.select_related("runtime").get(pk=job.pk)
    assert job.state == "completed", job.failure_reason
    migration = Migration.objects.get(job=job)
    assert migration.success and migration.destination_id != first.pk
    assert migration.checkpoint is not None and 0 < migration.checkpoint.step < case.total_steps  # mid-training
    second = job.placements.exclude(node=first).get().node
    resumed_work = stack.agent_dir(second.name) / "jobs" / str(job.pk) / "work"
    assert case.resumed_says in (resumed_work / "job.log").read_text()
    final = [m for m in jobkit.list_manifests(stack.agent_dir(first.name) / "ckpt" / str(job.pk)) if m.final]
    assert final, "the reclaimed node wrote a final checkpoint"

    assert reference.wait(timeout=120) == 0
    expected = json.loads((tmp_path / "reference" / "result.json").read_text())
    assert job.runtime.result_sha256 == expected["weights_sha256"]
    resumed_result = json.loads((resumed_work / "result.json").read_text())
    assert resumed_result == expected  # steps, and for torch the GradScaler's final scale and the loss sum
    assert_state_dicts_bitwise_equal(
        torch.load(tmp_path / "reference" / "final_weights.pt", weights_only=True),
        torch.load(resumed_work / "final_weights.pt", weights_only=True))
