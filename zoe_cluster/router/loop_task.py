"""`LoopTask`: one asyncio task running an object's `_loop()` from `_start_loop()` until `_stop_loop()`.

The router's periodic jobs (`health.HealthChecker`, `picture_store.PictureKeeper`'s saver,
`picture_sharing.PictureSharer`) each run one; their `start()` decides whether it runs at all.
"""

from __future__ import annotations

import asyncio
import contextlib


class LoopTask:
    """Mixin: `_loop()` (a coroutine that runs until cancelled) as one task of the running event loop."""

    _task: asyncio.Task | None = None

    async def _loop(self) -> None:
        raise NotImplementedError

    def _start_loop(self) -> None:
        """Start the task unless it runs already."""
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._loop())

    async def _stop_loop(self) -> None:
        """Cancel the task and wait until it has ended (nothing when it does not run)."""
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
