"""The shipped agent unit confines jobs (design §19.6): Delegate=yes, the capabilities the agent checks for, no
sandbox setting that hides the cgroup filesystem or the checkpoint directories, and an agent config default that
makes its job cgroups inside the delegated subtree."""

from __future__ import annotations

import dataclasses
import json
import os
from pathlib import Path

import pytest

from nodeagent.config import AgentConfig
from nodeagent.confine import (
    DELEGATED_JOBS,
    DELEGATED_LEAF,
    SWITCH_USER_CAPABILITIES,
    CgroupV1,
    CgroupV2,
    Confiner,
    Limits,
)

REPO = Path(__file__).resolve().parents[2]
UNIT = REPO / "deploy" / "reclaimnet-agent.service"
CGROUP_FS = Path("/sys/fs/cgroup")
TRUE = ("yes", "true", "on", "1")
# list-valued settings: repeated lines add up, an empty assignment empties the list (systemd.exec(5))
LIST_KEYS = {"AmbientCapabilities", "CapabilityBoundingSet", "ReadWritePaths", "ReadOnlyPaths", "InaccessiblePaths",
             "TemporaryFileSystem", "Environment"}


def parse_unit(text: str) -> dict[str, dict[str, list[str]]]:
    """A unit file as section → key → every value in order (systemd allows a key many times; configparser does
    not). Comments (``#``, ``;``) and blank lines skipped, ``\\`` continues a line."""
    out: dict[str, dict[str, list[str]]] = {}
    section = ""
    pending = ""
    for raw in text.splitlines():
        line = pending + raw.strip()
        pending = ""
        if line.endswith("\\"):
            pending = line[:-1] + " "
            continue
        if not line or line.startswith(("#", ";")):
            continue
        if line.startswith("[") and line.endswith("]"):
            section = line[1:-1]
            out.setdefault(section, {})
            continue
        key, _, value = line.partition("=")
        out.setdefault(section, {}).setdefault(key.strip(), []).append(value.strip())
    return out


def last(unit: dict[str, dict[str, list[str]]], key: str, default: str = "") -> str:
    """A single-valued setting: the last assignment wins."""
    return unit["Service"].get(key, [default])[-1]


def listed(unit: dict[str, dict[str, list[str]]], key: str) -> list[str]:
    assert key in LIST_KEYS
    items: list[str] = []
    for value in unit["Service"].get(key, []):
        items = [] if not value else items + value.split()
    return items


@pytest.fixture(scope="module")
def unit() -> dict[str, dict[str, list[str]]]:
    return parse_unit(UNIT.read_text())


def test_parser_keeps_repeated_keys_and_resets_on_empty() -> None:
    u = parse_unit("[Service]\nAmbientCapabilities=CAP_A\n# x\nAmbientCapabilities=CAP_B \\\n  CAP_C\n"
                   "ReadWritePaths=/a\nReadWritePaths=\nReadWritePaths=/b\n")
    assert listed(u, "AmbientCapabilities") == ["CAP_A", "CAP_B", "CAP_C"] and listed(u, "ReadWritePaths") == ["/b"]


def test_unit_delegates_its_cgroup_and_leaves_the_cgroup_fs_writable(unit: dict[str, dict[str, list[str]]]) -> None:
    assert last(unit, "Delegate").lower() in TRUE
    # the agent trusts the delegation only when the unit says so (INVOCATION_ID is inherited by any process)
    assert "RECLAIMNET_AGENT_DELEGATED=1" in unit["Service"].get("Environment", [])
    assert last(unit, "ProtectControlGroups", "no").lower() not in (*TRUE, "strict", "private")
    assert last(unit, "PrivateUsers", "no").lower() not in TRUE  # the job users must exist in the agent's view
    assert last(unit, "DynamicUser", "no").lower() not in TRUE
    assert last(unit, "User") not in ("", "root", "0")
    for key in ("ReadOnlyPaths", "InaccessiblePaths", "TemporaryFileSystem"):
        hidden = [p.lstrip("-+").split(":")[0] for p in listed(unit, key)]
        assert not [p for p in hidden if CGROUP_FS.is_relative_to(p) or Path(p).is_relative_to(CGROUP_FS)], key


def test_unit_grants_the_capabilities_the_agent_checks_before_switching_users(
        unit: dict[str, dict[str, list[str]]]) -> None:
    ambient, bounding = set(listed(unit, "AmbientCapabilities")), set(listed(unit, "CapabilityBoundingSet"))
    assert set(SWITCH_USER_CAPABILITIES) <= ambient <= bounding
    assert last(unit, "NoNewPrivileges").lower() in TRUE  # a job's exec gains nothing back (setuid binaries)


def test_agent_defaults_and_example_config_fit_the_unit(unit: dict[str, dict[str, list[str]]]) -> None:
    defaults = {f.name: f.default for f in dataclasses.fields(AgentConfig)}
    assert defaults["confinement"] == "auto"
    assert defaults["cgroup_parent"] is None  # None: under the unit, <unit cgroup>/jobs (Confiner, delegated)
    example = json.loads((REPO / "examples" / "agent.json").read_text())
    assert example.get("confinement", "auto") != "off" and "cgroup_parent" not in example
    data_dir = Path(example["data_dir"])
    assert data_dir == Path("/var/lib") / last(unit, "StateDirectory")
    assert int(last(unit, "StateDirectoryMode", "0755"), 8) & 0o011 == 0o011  # job users search it (§19.5)
    if last(unit, "ProtectSystem").lower() in (*TRUE, "full", "strict"):  # checkpoints and work dirs writable
        assert any(data_dir.is_relative_to(p.lstrip("-")) for p in listed(unit, "ReadWritePaths"))


def _tree(root: Path, files: dict[str, str]) -> None:
    for rel, text in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)


def test_delegated_v2_agent_moves_into_a_leaf_and_makes_jobs_beside_it(tmp_path: Path,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """Under the unit (RECLAIMNET_AGENT_DELEGATED=1, cgroup_parent unset) on v2: the unit's cgroup, never the mount root."""
    cg, own = tmp_path / "cg2", "system.slice/reclaimnet-agent.service"
    _tree(cg, {"cgroup.controllers": "cpu memory pids", "cgroup.subtree_control": "",
               f"{own}/cgroup.controllers": "cpu memory pids", f"{own}/cgroup.subtree_control": "",
               f"{own}/cgroup.procs": ""})
    (tmp_path / "mounts").write_text(f"cgroup2 {cg} cgroup2 rw 0 0\n")
    (tmp_path / "cgroup").write_text(f"0::/{own}\n")
    monkeypatch.setenv("RECLAIMNET_AGENT_DELEGATED", "1")
    confiner = Confiner(data_dir=tmp_path / "data", job_user="", mounts_file=tmp_path / "mounts",
                        proc_cgroup_file=tmp_path / "cgroup")
    backend = confiner.backend
    assert isinstance(backend, CgroupV2) and backend.parent_dirs() == [cg / own / DELEGATED_JOBS]
    assert (cg / own / DELEGATED_LEAF / "cgroup.procs").read_text() == str(os.getpid())
    backend.create("9", Limits(memory_bytes=1 << 26, cpu_cores=1.0, pids_max=64))
    assert (cg / own / "cgroup.subtree_control").read_text() == "+memory +cpu +pids"
    assert (cg / own / DELEGATED_JOBS / "job-9" / "memory.max").read_text() == str(1 << 26)
    assert (cg / "cgroup.subtree_control").read_text() == ""  # above the delegated subtree: untouched


def test_delegated_v1_uses_the_units_cgroup_per_controller(tmp_path: Path) -> None:
    own = "system.slice/reclaimnet-agent.service"
    mounts, lines = [], []
    for n, controller in enumerate(("memory", "cpu,cpuacct", "pids", "freezer")):
        name = controller.split(",")[0]
        (tmp_path / name / own).mkdir(parents=True)
        mounts.append(f"cgroup {tmp_path / name} cgroup rw,{controller} 0 0")
        lines.append(f"{n + 1}:{controller}:/{own if name != 'freezer' else ''}")  # systemd leaves freezer alone
    (tmp_path / "mounts").write_text("\n".join(mounts) + "\n")
    (tmp_path / "cgroup").write_text("\n".join(lines) + "\n")
    confiner = Confiner(data_dir=tmp_path / "data", job_user="", mounts_file=tmp_path / "mounts",
                        proc_cgroup_file=tmp_path / "cgroup", delegated=True)
    backend = confiner.backend
    assert isinstance(backend, CgroupV1)
    assert backend.parent_dirs() == sorted(tmp_path / c / own / DELEGATED_JOBS for c in ("cpu", "memory", "pids"))
    backend.create("3", Limits(memory_bytes=1 << 26, pids_max=64))
    assert (tmp_path / "memory" / own / DELEGATED_JOBS / "job-3" / "memory.limit_in_bytes").read_text() == str(1 << 26)
    assert list((tmp_path / "freezer").iterdir()) == [tmp_path / "freezer" / "system.slice"]  # not used


def test_outside_systemd_the_layout_is_unchanged(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    cg = tmp_path / "cg2"
    _tree(cg, {"cgroup.controllers": "cpu memory pids", "cgroup.subtree_control": ""})
    (tmp_path / "mounts").write_text(f"cgroup2 {cg} cgroup2 rw 0 0\n")
    (tmp_path / "cgroup").write_text("0::/user.slice/session-1.scope\n")
    monkeypatch.delenv("RECLAIMNET_AGENT_DELEGATED", raising=False)
    confiner = Confiner(data_dir=tmp_path / "data", job_user="", mounts_file=tmp_path / "mounts",
                        proc_cgroup_file=tmp_path / "cgroup")
    assert confiner.backend is not None and confiner.backend.parent_dirs()[0].parent == cg / "reclaimnet"
