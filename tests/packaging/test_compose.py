"""docker-compose.yml: CURVE with generated keys, and no broker port on the host.

Docker itself may not run where the tests do: the file's properties are read
from the YAML here, and ``docker compose config`` validates it when a Compose is
installed.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from emq_django.broker import exposure
from tests.support import REPO_ROOT

COMPOSE = REPO_ROOT / "docker-compose.yml"
KEYS_DIR = "/var/lib/emq-keys"
BROKERS = ("broker", "broker2")  # active and standby, on one PostgreSQL journal
BROKER_PORTS = {"47290", "47291", "47293", "5555", "11131", "11132", "11133"}


@pytest.fixture(scope="module")
def compose() -> dict[str, Any]:
    return yaml.safe_load(COMPOSE.read_text())


def emq_services(compose: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """The services that talk to the broker (all but postgres, migrate and keys)."""
    return {
        name: svc
        for name, svc in compose["services"].items()
        if name not in ("postgres", "migrate", "keys")
    }


def generated_keys(compose: dict[str, Any]) -> dict[str, set[str]]:
    """Key name -> roles, as the keys service generates them (the broker's: none)."""
    script = compose["services"]["keys"]["command"][-1]
    assert 'manage.py emq_keys generate "$$@" --dir /var/lib/emq-keys' in script
    keys = {n: set(r.split(",")) for n, r in re.findall(r"gen (\S+) --roles (\S+)", script)}
    assert re.search(r"gen broker --server\n", script)
    return {"broker": set(), **keys}


def test_no_broker_port_is_published_on_the_host(compose: dict[str, Any]) -> None:
    for broker in BROKERS:
        assert "ports" not in compose["services"][broker]
    for name, svc in compose["services"].items():
        for mapping in svc.get("ports", []):
            parts = str(mapping).split(":")
            assert parts[-1] not in BROKER_PORTS, (name, mapping)
            assert parts[0] == "127.0.0.1", f"{name} publishes {mapping} beyond the loopback"


def test_the_broker_binds_every_interface_only_with_curve(compose: dict[str, Any]) -> None:
    for broker in BROKERS:
        env = compose["services"][broker]["environment"]
        binds = [(k, v) for k, v in env.items() if k.endswith("_BIND")]
        assert exposure.exposed(binds)  # the container's network: it needs CURVE
        assert env["EMQ_CURVE_SECRET_KEY"] == f"{KEYS_DIR}/broker.key_secret"
    for name, svc in compose["services"].items():
        assert "EMQ_ALLOW_PLAINTEXT" not in svc.get("environment", {}), name


def test_every_process_has_its_own_generated_key_with_its_roles(compose: dict[str, Any]) -> None:
    keys = generated_keys(compose)
    secrets = {}
    for name, svc in emq_services(compose).items():
        env = svc["environment"]
        assert env["EMQ_CURVE_SERVER_KEY"] == f"{KEYS_DIR}/broker.key", name
        secret = env["EMQ_CURVE_SECRET_KEY"]
        key_name = re.fullmatch(rf"{KEYS_DIR}/(\S+)\.key_secret", secret)
        assert key_name and key_name.group(1) in keys, (name, secret)
        secrets[name] = key_name.group(1)
        assert f"emqkeys:{KEYS_DIR}:ro" in svc["volumes"], name  # read-only for all but keys
    # no key shared by two services, but the brokers' (clients check one public key)
    assert {secrets[b] for b in BROKERS} == {"broker"}
    assert len(set(secrets.values())) == len(secrets) - len(BROKERS) + 1
    assert keys["broker"] == set()  # its own pair, registered nowhere
    assert keys[secrets["jobmanager"]] == {"worker"}  # a job manager is no client
    assert keys[secrets["scheduler"]] == {"scheduler"}
    assert keys[secrets["producer"]] == {"client"}
    assert "client" in keys[secrets["web"]]


def test_keys_are_made_after_migrate_and_before_the_broker(compose: dict[str, Any]) -> None:
    services = compose["services"]
    done = {"condition": "service_completed_successfully"}
    assert services["keys"]["depends_on"]["migrate"] == done  # it registers them in the DB
    for broker in BROKERS:
        assert services[broker]["depends_on"]["keys"] == done
    assert f"emqkeys:{KEYS_DIR}" in services["keys"]["volumes"]  # it alone writes there
    for name, svc in emq_services(compose).items():
        if name not in BROKERS:
            assert "broker" in svc["depends_on"], name
    assert "emqkeys" in compose["volumes"]


def test_two_brokers_share_one_postgresql_journal_and_every_peer_lists_both(
    compose: dict[str, Any],
) -> None:
    envs = [compose["services"][b]["environment"] for b in BROKERS]
    urls = {env["EMQ_JOURNAL_URL"] for env in envs}
    assert len(urls) == 1 and urls.pop().startswith("postgresql://")
    assert len({env["EMQ_BROKER_NAME"] for env in envs}) == len(BROKERS)
    assert not any("EMQ_JOURNAL_PATH" in env for env in envs)  # PostgreSQL's takes its place
    assert len({env["EMQ_TRACE_DIR"] for env in envs}) == len(BROKERS)
    for name, svc in emq_services(compose).items():
        if name in BROKERS:
            continue
        for key in ("EMQ_BROKER_URL", "EMQ_WORKER_URL", "EMQ_MONITOR_URL"):
            hosts = [a.split("//")[1].split(":")[0] for a in svc["environment"][key].split(",")]
            assert hosts == list(BROKERS), (name, key)


def _compose_command() -> list[str] | None:
    docker = shutil.which("docker")
    if docker:
        probe = subprocess.run([docker, "compose", "version"], capture_output=True, timeout=60)
        if probe.returncode == 0:
            return [docker, "compose"]
    legacy = shutil.which("docker-compose")
    return [legacy] if legacy else None


def test_docker_compose_config_accepts_the_file() -> None:
    command = _compose_command()
    if command is None:
        pytest.skip("no Docker Compose here (docker compose / docker-compose)")
    done = subprocess.run(
        [*command, "-f", str(COMPOSE), "config", "--quiet"],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=REPO_ROOT,
    )
    assert done.returncode == 0, done.stderr


def test_the_keys_script_generates_and_registers_every_key_once(
    compose: dict[str, Any], tmp_path: Path
) -> None:
    """The keys service's script, run here as Compose would run it (``$$`` is
    Compose's escaped ``$``), on SQLite and a directory of tmp_path: every key pair
    is written and registered with its roles, and a second run changes nothing."""
    keys_dir = tmp_path / "keys"
    script = compose["services"]["keys"]["command"][-1].replace("$$", "$")
    script = script.replace(KEYS_DIR, str(keys_dir)).replace("python ", f"{sys.executable} ")
    env = {k: v for k, v in os.environ.items() if not k.startswith("EMQ_")}
    env.update(
        DJANGO_SETTINGS_MODULE="project.settings",
        DATABASE_URL=f"sqlite:///{tmp_path / 'db.sqlite3'}",
    )

    def run(*argv: str) -> str:
        done = subprocess.run(
            argv, cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=300
        )
        assert done.returncode == 0, done.stdout + done.stderr
        return done.stdout

    run(sys.executable, "manage.py", "migrate", "--noinput")
    run("sh", "-c", script)
    listed = run(sys.executable, "manage.py", "emq_keys", "list")
    for name, roles in generated_keys(compose).items():
        secret = keys_dir / f"{name}.key_secret"
        assert (keys_dir / f"{name}.key").exists() and secret.stat().st_mode & 0o777 == 0o600
        if roles:
            line = next(li for li in listed.splitlines() if li.startswith(f"{name} "))
            assert set(line.split("roles=")[1].split()[0].split(",")) == roles
            assert "enabled" in line
    assert not any(li.startswith("broker ") for li in listed.splitlines())
    before = {p.name: p.read_bytes() for p in keys_dir.iterdir()}
    run("sh", "-c", script)  # a restarted stack keeps its keys
    assert {p.name: p.read_bytes() for p in keys_dir.iterdir()} == before
