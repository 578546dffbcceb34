"""Pre-flight of ``flowerbed run``: resolve the config, read the dataset, build the workload.

Everything that can reject a user's input happens here, before a run directory exists. For the
engines that run the experiment in other processes (simulation, deployment), the CLI runs this
module as a short-lived child process (``python -m flowerbed.apps.preflight``), so torch, the
dataset and the workload never stay resident in the CLI process while the run goes on.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from flowerbed.clients.core.config import Experiment, decode
from flowerbed.clients.core.errors import ConfigError
from flowerbed.clients.core.values import JsonValue


def preflight(experiment: str, overrides: list[str], forced: dict[str, JsonValue]) -> Experiment:
    """The resolved experiment; raises ``ConfigError`` for anything wrong with the input."""
    from flowerbed.clients.datasets import load_table
    from flowerbed.clients.datasets.partition import check_partitions
    from flowerbed.clients.workloads import WORKLOADS, ClassifierWorkload, build_workload
    from flowerbed.server.experiment import load_experiment

    resolved = load_experiment(experiment, overrides, **forced)
    clients, seed = resolved.clients, resolved.seed
    workload_cls = WORKLOADS.get(resolved.workload.name or "")
    if "dataset" in getattr(workload_cls, "reads", ()):
        dataset = resolved.dataset
        try:
            table = load_table(dataset)
        except (FileNotFoundError, OSError) as exc:
            raise ConfigError(f"dataset '{dataset.name}' could not be read: {exc}") from None
        labels = table.train[table.schema.label].astype(str).to_numpy()
        check_partitions(labels, clients, seed, f"dataset '{dataset.name}'")
    workload = build_workload(resolved)
    if isinstance(workload, ClassifierWorkload) and "dataset" not in workload_cls.reads:
        labels = workload.train_pool().y.numpy()
        check_partitions(labels, clients, seed, f"workload '{resolved.workload.name}'")
    check_superlink(resolved)
    check_ray_address(resolved)
    return resolved


def check_ray_address(experiment: Experiment) -> None:
    """``simulation.ray_address`` has an allowed form and goes with the simulation engine."""
    from flowerbed.server.ray_cluster import check_address

    address = experiment.simulation.ray_address
    if not address:
        return
    check_address(address)
    if experiment.engine != "simulation":
        raise ConfigError(
            f"simulation.ray_address runs the simulation engine on a Ray cluster; it does not "
            f"apply to engine '{experiment.engine}' (use engine=simulation, or unset it)"
        )


#: client updates (ClientApp calls) in one run above which ``flowerbed run`` warns before starting
MANY_UPDATES = 100_000


def load_warning(experiment: Experiment) -> str | None:
    """A one-line warning with the estimate when a run is far larger than a workstation's day:
    client updates = rounds x sampled clients per round (Flower's max(int(fraction N), min))."""
    clients, rounds = experiment.clients, experiment.rounds
    num = clients.num
    per_round = clients.sampled()
    if clients.fraction_evaluate:
        per_round += clients.sampled(clients.fraction_evaluate)
    updates = rounds * per_round
    if updates <= MANY_UPDATES:
        return None
    return (
        f"clients.num={num}, {rounds} rounds: {updates:,} client calls (train + evaluate); at "
        f"10 ms of Flower message overhead each that is >= {updates * 0.01 / 3600:.1f} h before "
        f"any training (lower clients.num or clients.fraction / fraction_evaluate)"
    )


def check_superlink(experiment: Experiment) -> None:
    """A deployment run names a SuperLink that answers, with TLS the given CA verifies."""
    from flowerbed.server.processes import probe_superlink

    deployment = experiment.deployment
    if experiment.engine != "deployment" or not deployment.superlink:
        return
    ca = None if deployment.insecure else deployment.root_certificates
    if ca and not Path(ca).is_file():
        raise ConfigError(f"root certificate not found: {ca}")
    problem = probe_superlink(deployment.superlink, ca)
    if problem:
        raise ConfigError(problem)


def preflight_in_child(
    experiment: str, overrides: list[str], forced: dict[str, JsonValue],
    zygote: tuple[str, int] | None = None,
) -> Experiment:  # fmt: skip
    """:func:`preflight` in a child process; its ``ConfigError`` is raised here, one line.

    The experiment comes back as its dict, typed by :func:`decode` without the registries (this
    process imports no component): its components' params stay plain dicts, read by nobody
    here and sent on unchanged.

    ``zygote``: (socket, PID) of the simulation engine's Ray worker zygote
    (``apps/ray_zygote.py``), which imported what the pre-flight imports: the child is forked
    from it (waiting while it imports) instead of starting a new interpreter; if it is gone,
    the child is a new interpreter as without it."""
    request = json.dumps({"experiment": experiment, "overrides": overrides, "forced": forced})
    forked = _forked(zygote, request) if zygote is not None else None
    if forked is None:
        proc = subprocess.run(
            [sys.executable, "-m", "flowerbed.apps.preflight"],
            input=request, capture_output=True, text=True, check=False,
        )  # fmt: skip
        forked = proc.returncode, proc.stdout, proc.stderr
    returncode, stdout, stderr = forked
    answer = stdout.strip().splitlines()[-1] if stdout.strip() else ""
    if returncode == 0 and answer:
        return decode(json.loads(answer)["config"])
    if returncode == 2 and answer:
        raise ConfigError(json.loads(answer)["error"])
    raise RuntimeError(f"pre-flight failed (exit {returncode}):\n{stderr.strip()}")


def _forked(zygote: tuple[str, int], request: str) -> tuple[int, str, str] | None:
    """(exit status, stdout, stderr) of the pre-flight forked from ``zygote``; None if it is
    not there. The child's status is its answer's: 0 with a config, 2 with an error, else 1."""
    import os
    import threading

    from flowerbed.apps.ray_launch import PREFLIGHT_SUFFIX, request_fork, zygote_ready

    address = zygote[0] + PREFLIGHT_SUFFIX
    if not zygote_ready(address, zygote[1]):
        return None
    stdin_r, stdin_w = os.pipe()
    out_r, out_w = os.pipe()
    err_r, err_w = os.pipe()
    fork = {"module": __name__, "argv": ["-m"], "env": dict(os.environ), "cwd": os.getcwd()}
    try:
        conn = request_fork(address, fork, [stdin_r, out_w, err_w])
    finally:
        for fd in (stdin_r, out_w, err_w):
            os.close(fd)
    if conn is None:
        for fd in (stdin_w, out_r, err_r):
            os.close(fd)
        return None
    errors: list[bytes] = []
    reader = threading.Thread(target=lambda: errors.append(os.fdopen(err_r, "rb").read()))
    reader.start()
    with os.fdopen(stdin_w, "w") as child_in:
        child_in.write(request)
    with os.fdopen(out_r, "rb") as child_out:
        stdout = child_out.read().decode(errors="replace")
    reader.join()
    with conn:  # closed by the child's exit
        while conn.recv(4096):
            pass
    answer = stdout.strip().splitlines()[-1] if stdout.strip() else ""
    status = 1
    if answer.startswith("{"):
        keys = json.loads(answer)
        status = 0 if "config" in keys else 2 if "error" in keys else 1
    return status, stdout, b"".join(errors).decode(errors="replace")


def main() -> None:
    request = json.loads(sys.stdin.read())
    try:
        resolved = preflight(request["experiment"], request["overrides"], request["forced"])
    except ConfigError as exc:
        print(json.dumps({"error": str(exc)}))
        sys.exit(2)
    print(json.dumps({"config": resolved.to_dict()}))


if __name__ == "__main__":
    main()
