"""The shapes of the plain values that cross a process boundary, as types.

``JsonValue``: what a config is before :func:`~flowerbed.clients.core.config.resolve` types it
(YAML and JSON files, dotlist overrides, the dict a ClientApp receives), and what a cache's
metadata file holds. ``RoundConfig``: the ConfigRecord a round's message carries to a workload's
``fit`` and ``evaluate`` (what Flower's strategies and flowerbed's wrappers put there).
"""

from __future__ import annotations

from typing import NotRequired, TypeAlias, TypedDict

#: a JSON (or YAML, as omegaconf reads it) value: scalars, lists and string-keyed mappings
JsonValue: TypeAlias = "None | bool | int | float | str | list[JsonValue] | dict[str, JsonValue]"

#: a JSON object: a config, a config section, a cache entry's metadata
JsonObject: TypeAlias = "dict[str, JsonValue]"

#: the round's ConfigRecord as a workload receives it (``clients/runtime.py``, without the
#: experiment): the client's ``partition-id`` (added by the runtime) and Flower's
#: ``server-round``, plus what a strategy or wrapper adds for its clients
RoundConfig = TypedDict(
    "RoundConfig",
    {
        "partition-id": int,
        "server-round": int,
        #: FedProx's proximal term (Flower's ``FedProx`` strategy)
        "proximal-mu": NotRequired[float],
        #: ``fed-kmeans``: which phase a round is (``init`` seeds the centroids)
        "phase": NotRequired[str],
        #: ``fcm``: the versioned concept registry (JSON)
        "fcm-registry": NotRequired[str],
        #: the aggregation rule the server applies, for malicious clients that adapt to it (JSON)
        "fb-aggregation": NotRequired[str],
    },
)
