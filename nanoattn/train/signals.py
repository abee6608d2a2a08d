"""A stop request: the first SIGINT/SIGTERM during training becomes a flag the loop reads.

The loop finishes its step, writes a checkpoint and returns; a second signal gets the original
behaviour (stop at once). Handlers are installed only on the main thread, where Python allows it.
"""

from __future__ import annotations

import signal
import threading
from typing import Any

from nanoattn.logging import note


class StopSignals:
    """Turns the first SIGINT/SIGTERM into a flag; a second one gets the original behaviour."""

    def __init__(self) -> None:
        self.requested = False
        self._old: dict[int, Any] = {}

    def __enter__(self) -> StopSignals:
        if threading.current_thread() is threading.main_thread():
            for sig in (signal.SIGINT, signal.SIGTERM):
                self._old[sig] = signal.signal(sig, self._handle)
        return self

    def _handle(self, signum: int, frame: Any) -> None:
        self.requested = True
        signal.signal(signum, self._old[signum])
        note(f"\n{signal.Signals(signum).name}: finishing this step, then saving a checkpoint "
             "(send it again to stop at once)")

    def __exit__(self, *exc: Any) -> None:
        for sig, old in self._old.items():
            signal.signal(sig, old)
