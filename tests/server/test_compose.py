"""docker-compose.yml validates offline against the compose-spec schema and matches flwr 1.42."""

import json
import subprocess
import sys
import zipfile

import jsonschema
import pytest
import yaml

from flowerbed.clients.core.config import configs_dir

COMPOSE = configs_dir().parent / "docker-compose.yml"


@pytest.fixture(scope="module")
def compose_schema(tmp_path_factory):
    """The compose-spec JSON schema shipped inside docker-compose 1.29.2's wheel (from PyPI)."""
    folder = tmp_path_factory.mktemp("dc")
    subprocess.run(
        [sys.executable, "-m", "pip", "download", "-q", "--no-deps", "-d", str(folder),
         "docker-compose==1.29.2"],
        check=True, capture_output=True,
    )  # fmt: skip
    wheel = next(folder.glob("docker_compose-*.whl"))
    with zipfile.ZipFile(wheel) as archive:
        return json.loads(archive.read("compose/config/compose_spec.json"))


def _services() -> dict:
    return yaml.safe_load(COMPOSE.read_text())["services"]


def test_compose_validates_against_spec(compose_schema):
    document = yaml.safe_load(COMPOSE.read_text())
    jsonschema.Draft201909Validator(compose_schema).validate(document)
    broken = dict(document, services=dict(document["services"], superlink={"bogus_key": 1}))
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.Draft201909Validator(compose_schema).validate(broken)


def test_compose_uses_142_single_port_tls_and_auth():
    services = _services()
    link = " ".join(services["superlink"]["command"])
    assert services["superlink"]["image"] == "flwr/superlink:1.42.0"
    for flag in ("--ssl-certfile", "--ssl-keyfile", "--ssl-ca-certfile", "--enable-supernode-auth",
                 "--port=8000", "--database=state/"):  # fmt: skip
        assert flag in link
    assert "--insecure" not in link
    assert any(v.endswith(":/app/state") for v in services["superlink"]["volumes"])
    nodes = [n for n in services if n.startswith("supernode-")]
    assert len(nodes) >= 2
    for i, name in enumerate(sorted(nodes)):
        cmd = " ".join(services[name]["command"])
        assert "--superlink=superlink:8000" in cmd and "--root-certificates" in cmd
        assert f"--auth-supernode-private-key=keys/supernode{i}" in cmd
        assert f"partition-id={i} num-partitions={len(nodes)}" in cmd
        assert "--clientappio-api-address" not in cmd  # rejected by 1.42
        # the flowerbed image's `flowerbed supernode` (short polls), Flower's flags unchanged
        assert services[name]["image"] == "flowerbed-superexec:latest"
        assert 'flowerbed supernode "$$@"' in services[name]["entrypoint"][2]
        executor = services[f"superexec-clientapp-{i}"]
        assert any(f"--runtime-api-address={name}:" in c for c in executor["command"])
    assert "shm_size" in services["superexec-serverapp"]


def test_compose_is_locked_down_by_default():
    services = _services()
    assert services["superlink"]["ports"] == [
        "${SUPERLINK_BIND:-127.0.0.1}:${SUPERLINK_PORT:-8000}:8000"
    ]
    long_running = [n for n in services if n not in ("certs", "register")]
    for name in long_running:
        assert "healthcheck" in services[name], name
        assert "--health-server-address=127.0.0.1:8081" in services[name]["command"], name
    certs = " ".join(services["certs"]["command"])
    assert "--owner 49999:49999" in certs and "chown 49999:49999 /app/state" in certs
    # private material stays in named volumes; only the public CA reaches the host
    for name, service in services.items():
        for volume in service.get("volumes", []):
            source = volume.split(":")[0]
            assert not source.startswith(".") or name == "certs" and volume.endswith(":/export")
    nodes = sorted(n for n in services if n.startswith("supernode-"))
    register = services["register"]["command"]
    assert [c for c in register if c.endswith(".pub")] == [
        f"/app/keys/supernode{i}.pub" for i in range(len(nodes))
    ]
    assert f"--nodes {len(nodes)}" in certs


def test_dockerignore_keeps_environments_runs_and_keys_out():
    lines = [
        ln.strip()
        for ln in (COMPOSE.parent / ".dockerignore").read_text().splitlines()
        if ln.strip() and not ln.startswith("#")
    ]
    assert lines[0] == "*"  # everything out, then the package sources back in
    allowed = [ln[1:].rstrip("/") for ln in lines if ln.startswith("!")]
    for private in (".venv", "runs", ".flowerbed", "docker-certs", "docker-keys", ".git"):
        assert not any(a == private or a.startswith(private + "/") for a in allowed), private
    assert {"apps", "server", "clients", "configs", "pyproject.toml"} <= set(allowed)
