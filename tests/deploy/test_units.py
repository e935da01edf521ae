"""deploy/: the systemd units verify, run commands the installed distributions provide, and match README's
production layout (design §10, §18)."""

from __future__ import annotations

import importlib.metadata
import importlib.util
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from django.conf import settings

from nodeagent.confine import SWITCH_USER_CAPABILITIES
from tests.deploy.conftest import REPO, AgentVenv

DEPLOY = REPO / "deploy"
PORTAL_VENV = "/opt/reclaimnet/venv"
AGENT_VENV = "/opt/reclaimnet-agent"
WORKER_GROUPS = ("control", "tick", "placement", "slow")
# The instances README's layout runs, and the plain units.
UNITS = ("reclaimnet-agent.service", "reclaimnet-portal@8001.service", "reclaimnet-portal@8002.service",
         *(f"reclaimnet-worker@{g}.service" for g in WORKER_GROUPS), "reclaimnet-beat.service", "reclaimnet.target")


def _env_file(path: Path) -> dict[str, str]:
    return dict(line.split("=", 1) for line in path.read_text().splitlines() if line and not line.startswith("#"))


def _systemd_analyze() -> str:
    found = shutil.which("systemd-analyze")
    assert found, "systemd-analyze is missing: run scripts/install_deploy_deps.sh (installs Debian's systemd)"
    return found


def _units_for(tmp_path: Path, agent_venv: AgentVenv) -> Path:
    """The unit files with the install prefixes pointed at this machine's venvs (verify checks ExecStart exists)."""
    out = tmp_path / "units"
    out.mkdir()
    for unit in [*DEPLOY.glob("*.service"), *DEPLOY.glob("*.target")]:
        text = unit.read_text().replace(PORTAL_VENV, sys.prefix).replace(AGENT_VENV, str(agent_venv.root))
        (out / unit.name).write_text(text)
    return out


def _exec_lines(unit: Path) -> list[list[str]]:
    return [shlex.split(line.split("=", 1)[1]) for line in unit.read_text().splitlines()
            if line.startswith(("ExecStart=", "ExecStartPre="))]


def test_every_unit_file_is_in_the_verified_list() -> None:
    templates = {re.sub(r"@[^.]+\.", "@.", u) for u in UNITS}
    assert templates == {p.name for p in [*DEPLOY.glob("*.service"), *DEPLOY.glob("*.target")]}


@pytest.mark.parametrize("unit", UNITS)
def test_systemd_analyze_verify_is_clean(unit: str, agent_venv: AgentVenv, tmp_path: Path) -> None:
    """Offline, without systemd as PID 1: parse errors, unknown keys and missing executables all fail."""
    units = _units_for(tmp_path, agent_venv)
    out = subprocess.run([_systemd_analyze(), "verify", "--man=no", str(units / unit)], capture_output=True,
                         text=True, timeout=60, cwd=units)
    assert out.returncode == 0 and not out.stderr.strip() and not out.stdout.strip(), out.stderr + out.stdout


def test_verify_catches_a_mistake(tmp_path: Path) -> None:
    """The check above can fail: an unknown key and a missing command are reported."""
    bad = tmp_path / "bad.service"
    bad.write_text("[Service]\nExecStart=/nonexistent/reclaimnet-agent\nAmbientCapabilitys=CAP_BPF\n")
    out = subprocess.run([_systemd_analyze(), "verify", "--man=no", str(bad)], capture_output=True, text=True,
                         timeout=60)
    assert out.returncode != 0 and "Unknown key" in out.stderr and "not executable" in out.stderr


def test_portal_commands_are_console_scripts_of_the_installed_portal() -> None:
    scripts = {ep.name for ep in importlib.metadata.entry_points(group="console_scripts")}
    for unit in ("reclaimnet-portal@.service", "reclaimnet-worker@.service", "reclaimnet-beat.service"):
        for argv in _exec_lines(DEPLOY / unit):
            commands = [a for a in argv if a.startswith(PORTAL_VENV)]
            assert commands, f"{unit}: no command from {PORTAL_VENV}/bin"
            for command in commands:
                name = Path(command).name
                assert name in scripts and (Path(sys.prefix) / "bin" / name).exists(), f"{unit}: {name}"
            targets = [a.split(":")[0] for a in argv if a.startswith("portal.")] + [
                f"{argv[i + 1]}.celery" for i, a in enumerate(argv) if a == "-A"]
            for module in targets:
                assert importlib.util.find_spec(module) is not None, f"{unit}: {module}"


def test_agent_command_is_the_console_script_of_the_agent_distribution(agent_venv: AgentVenv) -> None:
    argvs = _exec_lines(DEPLOY / "reclaimnet-agent.service")
    assert {a[0] for a in argvs} == {f"{AGENT_VENV}/bin/reclaimnet-agent"}
    assert (agent_venv.bin_dir / "reclaimnet-agent").exists()
    out = agent_venv.run(str(agent_venv.python), "-c", "import importlib.metadata as m; print([e.value for e in "
                         "m.distribution('reclaimnet-agent').entry_points if e.name == 'reclaimnet-agent'])")
    assert out.stdout.strip() == "['nodeagent.__main__:main']", out.stderr
    help_text = agent_venv.run(str(agent_venv.bin_dir / "reclaimnet-agent"), "--help").stdout
    for argv in argvs:  # the flags the unit passes exist
        assert all(flag in help_text for flag in argv[1:] if flag.startswith("--")), argv


def test_agent_unit_grants_only_the_enforcement_capabilities_and_is_sandboxed() -> None:
    text = (DEPLOY / "reclaimnet-agent.service").read_text()
    keys = dict(line.split("=", 1) for line in text.splitlines() if "=" in line and not line.startswith("#"))
    # enforcement's (design §4) and confinement's (§19.6; checked in detail by tests/nodeagent/test_agent_unit.py)
    granted = {"CAP_NET_ADMIN", "CAP_BPF", "CAP_PERFMON", "CAP_SYS_ADMIN"} | set(SWITCH_USER_CAPABILITIES)

    def listed(key: str) -> set[str]:  # repeated lines add up
        return {c for line in text.splitlines() if line.startswith(f"{key}=") for c in line.split("=", 1)[1].split()}

    assert listed("AmbientCapabilities") == granted == listed("CapabilityBoundingSet")
    assert keys["User"] == "reclaimnet-agent" and keys["ProtectSystem"] == "strict"
    assert keys["ProtectHome"] == keys["PrivateTmp"] == keys["NoNewPrivileges"] == "yes"
    assert keys["Restart"] == "on-failure" and set(keys["RestartPreventExitStatus"].split()) == {"2", "3"}
    assert keys["EnvironmentFile"] == "/etc/reclaimnet/agent.env"
    assert "/var/lib/reclaimnet-agent" in keys["ReadWritePaths"].split()
    assert "RECLAIMNET_AGENT_TOKEN_FILE" in _env_file(DEPLOY / "agent.env")


def _readme_layout() -> dict[str, tuple[list[str], int, int]]:
    """README's production worker lines: group name -> (queues, concurrency, nice)."""
    layout = {}
    for line in (REPO / "README.md").read_text().splitlines():
        if "celery -A portal worker" not in line:
            continue
        argv = shlex.split(line.split("#")[0])
        nice = int(argv[argv.index("-n") + 1]) if argv[0] == "nice" else 0
        name = argv[len(argv) - argv[::-1].index("-n")].split("@")[0]
        layout[name] = (argv[argv.index("-Q") + 1].split(","), int(argv[argv.index("-c") + 1]), nice)
    return layout


def test_worker_groups_match_readme_and_cover_every_queue_once() -> None:
    layout = _readme_layout()
    assert set(layout) == set(WORKER_GROUPS)
    queues: list[str] = []
    for group in WORKER_GROUPS:
        env = _env_file(DEPLOY / f"worker-{group}.env")
        queue_list = env["RECLAIMNET_WORKER_QUEUES"].split(",")
        assert (queue_list, int(env["RECLAIMNET_WORKER_CONCURRENCY"]), int(env["RECLAIMNET_WORKER_NICE"])) == \
            layout[group], group
        queues += queue_list
    assert sorted(queues) == sorted(settings.RECLAIMNET_QUEUES)


def test_portal_target_starts_readme_layout_two_daphne_four_workers_one_beat() -> None:
    wants = " ".join(line.split("=", 1)[1] for line in (DEPLOY / "reclaimnet.target").read_text().splitlines()
                     if line.startswith("Wants="))
    assert sorted(wants.split()) == sorted(u for u in UNITS if u.startswith("reclaimnet-") and u != "reclaimnet-agent"
                                           ".service")
    readme = (REPO / "README.md").read_text()
    assert "port=8001" in readme and "port=8002" in readme and readme.count("celery -A portal beat") == 1


def test_portal_env_documents_every_readme_variable_and_holds_no_secret() -> None:
    text = (DEPLOY / "portal.env").read_text()
    table = re.search(r"^## Configuration\n(.*?)^## ", (REPO / "README.md").read_text(), re.S | re.M)
    assert table
    variables = set(re.findall(r"`([A-Z][A-Z0-9_]+)`", "\n".join(
        line.split("|")[1] for line in table.group(1).splitlines() if line.startswith("| `"))))
    assert len(variables) > 30
    assert not sorted(v for v in variables if v not in text), "document these in deploy/portal.env"
    active = _env_file(DEPLOY / "portal.env")
    for secret in ("SECRET_KEY", "METRICS_TOKEN", "DATABASE_PASSWORD"):
        assert secret not in active
    assert ":" not in active["DATABASE_URL"].split("@")[0].split("//")[1], "no password in DATABASE_URL"


def test_portal_settings_load_with_the_example_environment(tmp_path: Path) -> None:
    env = _env_file(DEPLOY / "portal.env")
    secret = tmp_path / "secret_key"
    secret.write_text("x" * 60)
    env |= {"SECRET_KEY_FILE": str(secret), "RECLAIMNET_MEDIA_ROOT": str(tmp_path / "media"),
            "PATH": "/usr/bin:/bin", "RECLAIMNET_PROCESS_KIND": "daphne"}
    out = subprocess.run([sys.executable, "-c", "import portal.settings as s; print(s.DEBUG, s.ALLOWED_HOSTS)"],
                         capture_output=True, text=True, timeout=60, env=env, cwd=REPO)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip() == "False ['reclaimnet.example.edu']"
