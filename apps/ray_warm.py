"""Ray hooks of the simulation engine: ClientApp actors that import their work as they start.

Flower's Ray backend (``flwr-simulation``) calls ``ray.init(runtime_env={"env_vars": ...})``. With
``RAY_RUNTIME_ENV_HOOK=flowerbed.apps.ray_warm.runtime_env`` in its environment (the simulation
engine sets it on the SuperLink it starts), Ray passes that runtime environment through
:func:`runtime_env`, which adds Ray's documented ``worker_process_setup_hook``: every worker of the
run (Flower's ``ClientAppActor``\\ s) runs :func:`warm_client` when its process starts, so the
ClientApp's imports (torch, the runtime) and torch's first optimizer step are paid while the
ServerApp still imports, loads its data and evaluates the initial model, not when the first
message arrives. Nothing of a run's state is touched: the warm-up trains a throw-away model and
every client seeds its own work.
"""

from __future__ import annotations

SETUP_HOOK = "flowerbed.apps.ray_warm.warm_client"


def runtime_env(env: dict[str, object] | None) -> dict[str, object]:
    """``env`` (the driver's runtime environment) with :func:`warm_client` as the workers'
    setup hook (one the driver set itself is kept)."""
    out = dict(env or {})
    out.setdefault("worker_process_setup_hook", SETUP_HOOK)
    return out


def warm_client() -> None:
    """Import the ClientApp and take torch's first optimizer step (it imports ~800 modules).

    A failure here only loses the head start: the first message imports the same modules.
    """
    try:
        import flowerbed.apps.client_app  # noqa: F401  (what Flower's ClientApp unpickles)
        from flowerbed.clients import runtime

        runtime.warm_up()
    except Exception:  # noqa: BLE001, S110  (the ClientApp itself reports real failures)
        pass
