"""A deployment's stored intent: its latest spec and each replica index's last generation, in Ray's key-value store.

The controller writes the spec after every change (scale, switch, swap) and a replica's generation each time it
starts one, so a controller that Ray restarts resumes the latest intent, and replica ids stay unique across
restarts. Outside Ray (unit tests) nothing is stored and every read is empty.
"""

from __future__ import annotations

import json

from zoe_cluster.cluster.spec import DeploymentSpec

KV_PREFIX = "zoe/deployment/"


class IntentStore:
    """The stored intent of deployment `name`."""

    def __init__(self, name: str):
        self.spec_key = KV_PREFIX + name
        self.generations_key = KV_PREFIX + name + "/generations"
        self._generations: dict[str, int] = {}

    def load_spec(self) -> DeploymentSpec | None:
        """The last stored spec, or None when none is stored."""
        stored = _kv_get(self.spec_key)
        return DeploymentSpec.model_validate_json(stored) if stored else None

    def save_spec(self, spec: DeploymentSpec) -> None:
        _kv_put(self.spec_key, spec.model_dump_json())

    def resume_generations(self) -> None:
        """Read the stored generations (a restarted controller continues them instead of starting at 1)."""
        self._generations = {k: int(v) for k, v in json.loads(_kv_get(self.generations_key) or "{}").items()}

    def last_generation(self, index: int) -> int:
        """The last generation started at replica `index` (0: none)."""
        return self._generations.get(str(index), 0)

    def record_generation(self, index: int, generation: int) -> None:
        self._generations[str(index)] = generation
        _kv_put(self.generations_key, json.dumps(self._generations))

    def clear(self) -> None:
        """Forget the deployment (undeploy, or a leftover of an earlier deployment of the same name)."""
        _kv_del(self.spec_key)
        _kv_del(self.generations_key)


def _kv_get(key: str) -> str | None:
    try:
        from ray.experimental.internal_kv import _internal_kv_get, _internal_kv_initialized

        if not _internal_kv_initialized():
            return None
        v = _internal_kv_get(key.encode())
        return v.decode() if v else None
    except Exception:  # noqa: BLE001 - outside Ray (unit tests)
        return None


def _kv_put(key: str, value: str) -> None:
    try:
        from ray.experimental.internal_kv import _internal_kv_initialized, _internal_kv_put

        if _internal_kv_initialized():
            _internal_kv_put(key.encode(), value.encode(), overwrite=True)
    except Exception:  # noqa: BLE001 - outside Ray
        pass


def _kv_del(key: str) -> None:
    try:
        from ray.experimental.internal_kv import _internal_kv_del, _internal_kv_initialized

        if _internal_kv_initialized():
            _internal_kv_del(key.encode())
    except Exception:  # noqa: BLE001 - outside Ray
        pass
