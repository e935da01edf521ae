"""jobkit_torch's parts (design §17): TrainingState, ResumableSampler, RNG capture, the Trainer checkpoint packing.
Whole jobs, reclaimed and resumed through real agents, are in test_torch_live_agent.py."""

from __future__ import annotations

import random
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from tests.torch.torch_helpers import REPO, require

torch = require("torch")

from nodeagent import jobkit  # noqa: E402
from nodeagent.jobkit_torch import (  # noqa: E402
    ResumableSampler,
    TrainingState,
    capture_rng_state,
    pack_dir,
    restore_rng_state,
    unpack_dir,
)


def _tiny_training() -> TrainingState:
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 2)
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.1)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=1, gamma=0.5)
    scaler = torch.amp.GradScaler("cpu", init_scale=4.0, growth_interval=1)
    return TrainingState(model, optimizer, scheduler, scaler, ResumableSampler(10, seed=3), extra={"n": 0})


def _one_step(ts: TrainingState) -> None:
    loss = ts.model(torch.randn(3, 4)).pow(2).sum()
    ts.optimizer.zero_grad()
    ts.scaler.scale(loss).backward()
    ts.scaler.step(ts.optimizer)
    ts.scaler.update()
    ts.scheduler.step()
    ts.sampler.advance(3)
    ts.extra["n"] += 1


def test_training_state_round_trips_every_component_through_jobkit(tmp_path: Path) -> None:
    ck = jobkit.Checkpointer(tmp_path, install_signals=False)
    first = _tiny_training()
    _one_step(first)
    random.seed(5)
    np.random.seed(5)
    manifest = first.checkpoint(ck, step=1)
    assert manifest.format == "torch"
    expected_next = (random.random(), float(np.random.random_sample()), torch.rand(1))
    _one_step(first)

    second = _tiny_training()  # fresh objects, other RNG states
    random.seed(99)
    assert second.restore(jobkit.Checkpointer(tmp_path, install_signals=False)) == 1
    assert second.scaler.get_scale() == 8.0 and second.scheduler.last_epoch == 1
    assert (second.sampler.epoch, second.sampler.consumed) == (0, 3) and second.extra == {"n": 1}
    assert (random.random(), float(np.random.random_sample())) == expected_next[:2]
    assert torch.equal(torch.rand(1), expected_next[2])


def test_restore_refuses_a_checkpoint_missing_a_component(tmp_path: Path) -> None:
    ck = jobkit.Checkpointer(tmp_path, install_signals=False)
    partial = _tiny_training()
    partial.optimizer = None
    partial.checkpoint(ck, step=1)
    with pytest.raises(KeyError, match="optimizer"):
        _tiny_training().restore(ck)


def test_resumable_sampler_continues_mid_epoch_and_reshuffles_per_epoch() -> None:
    sampler = ResumableSampler(10, seed=1)
    epoch0 = list(sampler)
    assert sorted(epoch0) == list(range(10))
    sampler.advance(4)
    resumed = ResumableSampler(10, seed=1)
    resumed.load_state_dict(sampler.state_dict())
    assert list(resumed) == epoch0[4:] and len(resumed) == 6
    resumed.set_epoch(0)  # the same epoch again keeps the position
    assert list(resumed) == epoch0[4:]
    resumed.set_epoch(1)
    assert sorted(resumed) == list(range(10)) and list(resumed) != epoch0
    with pytest.raises(ValueError, match="sampler seed"):
        ResumableSampler(10, seed=2).load_state_dict(sampler.state_dict())


def test_rng_state_capture_restores_python_numpy_and_torch() -> None:
    state = capture_rng_state()
    before = (random.random(), float(np.random.random_sample()), torch.rand(2))
    restore_rng_state(state)
    after = (random.random(), float(np.random.random_sample()), torch.rand(2))
    assert before[:2] == after[:2] and torch.equal(before[2], after[2])


def test_unpack_refuses_names_that_leave_the_restore_directory(tmp_path: Path) -> None:
    src = tmp_path / "src"
    (src / "sub").mkdir(parents=True)
    (src / "sub" / "a.bin").write_bytes(b"\x00\x01")
    files = pack_dir(src)
    unpack_dir(files, tmp_path / "dest")
    assert (tmp_path / "dest" / "sub" / "a.bin").read_bytes() == b"\x00\x01"
    with pytest.raises(ValueError, match="leaves"):
        unpack_dir({"../escape.bin": b"x"}, tmp_path / "dest2")
    assert not (tmp_path / "escape.bin").exists()


def test_jobkit_and_jobkit_torch_import_without_torch() -> None:
    code = ("import sys; sys.modules['torch'] = None; sys.modules['transformers'] = None\n"
            "from nodeagent import jobkit, jobkit_torch\n"
            "assert jobkit_torch.ResumableSampler(3, shuffle=False).permutation(0) == [0, 1, 2]\n")
    proc = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr


def test_trainer_callback_packs_the_trainers_checkpoint_into_jobkit_and_exits_on_final(tmp_path: Path) -> None:
    """The callback's logic without a Trainer (the whole Trainer path runs in test_torch_live_agent.py): the
    interval asks for a save, the Trainer's checkpoint directory becomes one verified jobkit checkpoint that
    restore_dir unpacks; a final request exits with EXIT_CHECKPOINTED after writing."""
    from types import SimpleNamespace

    from nodeagent.jobkit_torch import HF_RESTORE_DIRNAME, _ReclaimNetCallbackLogic

    now = [0.0]
    ck = jobkit.Checkpointer(tmp_path / "ck", interval_s=10.0, install_signals=False, clock=lambda: now[0])
    callback = _ReclaimNetCallbackLogic(ck)
    args, state = SimpleNamespace(output_dir=str(tmp_path / "out")), SimpleNamespace(global_step=3)
    control = SimpleNamespace(should_save=False, should_training_stop=False)
    callback.on_step_end(args, state, control)
    assert control.should_save is False
    now[0] = 11.0
    callback.on_step_end(args, state, control)
    assert control.should_save is True
    hf_dir = tmp_path / "out" / "checkpoint-3"
    hf_dir.mkdir(parents=True)
    (hf_dir / "trainer_state.json").write_text('{"global_step": 3}')
    (hf_dir / "optimizer.pt").write_bytes(b"\x01" * 100)
    callback.on_save(args, state, control)
    assert not hf_dir.exists() and callback.last_manifest is not None and not callback.last_manifest.final
    assert callback.last_manifest.step == 3 and jobkit.verify(ck.ckpt_dir, callback.last_manifest)

    resume = callback.restore_dir(tmp_path / "out")
    assert resume == str(tmp_path / "out" / HF_RESTORE_DIRNAME)
    assert (Path(resume) / "optimizer.pt").read_bytes() == b"\x01" * 100

    ck.request(final=True)
    state.global_step = 4
    callback.on_step_end(args, state, control)
    (tmp_path / "out" / "checkpoint-4").mkdir()
    with pytest.raises(SystemExit) as exited:
        callback.on_save(args, state, control)
    assert exited.value.code == jobkit.EXIT_CHECKPOINTED
    assert jobkit.list_manifests(ck.ckpt_dir)[-1].final and control.should_training_stop


def test_a_save_the_user_asked_for_is_left_to_the_trainer(tmp_path: Path) -> None:
    from types import SimpleNamespace

    from nodeagent.jobkit_torch import _ReclaimNetCallbackLogic

    ck = jobkit.Checkpointer(tmp_path / "ck", install_signals=False)
    callback = _ReclaimNetCallbackLogic(ck)
    (tmp_path / "out" / "checkpoint-5").mkdir(parents=True)
    callback.on_save(SimpleNamespace(output_dir=str(tmp_path / "out")), SimpleNamespace(global_step=5),
                     SimpleNamespace(should_save=False, should_training_stop=False))
    assert (tmp_path / "out" / "checkpoint-5").exists() and not jobkit.list_manifests(ck.ckpt_dir)
