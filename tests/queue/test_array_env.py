"""An array task's index reaches the job's environment (design §16.6): the start command's ``env`` is passed on
by the agent's runner, and only its RECLAIMNET_ARRAY_* names."""

from __future__ import annotations

import ast
from pathlib import Path

from nodeagent.runner import start_job


def test_the_runner_puts_the_array_index_in_the_jobs_environment_and_nothing_else_it_was_sent(
        tmp_path: Path) -> None:
    script = tmp_path / "env.py"
    script.write_text("import os, pathlib\npathlib.Path('env.json').write_text(repr(dict(os.environ)))\n")
    run = start_job(data_dir=tmp_path / "data", base_dir=tmp_path, job_id="7", command=f"python {script}", gpus=[0],
                    interval_s=None, next_sequence=1, restore_sequence=None, compat={}, kill_with_agent=False,
                    extra_env={"RECLAIMNET_ARRAY_ID": "3", "RECLAIMNET_ARRAY_INDEX": "41", "PATH": "/nowhere",
                               "RECLAIMNET_JOB_ID": "999"})
    assert run.proc.wait(timeout=20) == 0
    env = ast.literal_eval((run.work_dir / "env.json").read_text())
    assert (env["RECLAIMNET_ARRAY_ID"], env["RECLAIMNET_ARRAY_INDEX"]) == ("3", "41")
    assert env["RECLAIMNET_JOB_ID"] == "7" and env["PATH"] != "/nowhere"
