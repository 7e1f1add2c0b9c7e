"""Group commit: many callers wait for their data to be durable, one write runs
at a time, and each write takes everything pending when it starts.

A caller that arrives while a write runs cannot ride on it (the write took its
pending data before the caller's arrived), so it waits for the next one; every
caller that arrives meanwhile shares that next write. Under load the writes
run back to back and each carries many callers' data in one transaction.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable


class GroupCommit:
    def __init__(self, write: Callable[[], Awaitable[object]]) -> None:
        self._write = write
        self._next: asyncio.Future[None] | None = None  # the write not started yet
        self._writer: asyncio.Task[None] | None = None

    async def commit(self) -> None:
        """Return once a write that started after this call has finished; raise its error."""
        if self._next is None:
            self._next = asyncio.get_running_loop().create_future()
            # Retrieved here so that an error no caller awaited any more is not logged as lost.
            self._next.add_done_callback(lambda f: f.cancelled() or f.exception())
        waiting = self._next
        if self._writer is None or self._writer.done():
            self._writer = asyncio.create_task(self._run(), name="group-commit")
        await asyncio.shield(waiting)

    async def _run(self) -> None:
        while self._next is not None:
            done, self._next = self._next, None
            try:
                await self._write()
            except Exception as exc:
                done.set_exception(exc)
            else:
                done.set_result(None)
