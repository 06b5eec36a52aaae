"""Capped exponential backoff with jitter, for loops that reconnect to a service."""

from __future__ import annotations

import random


class Backoff:
    """Delays from `first` doubling up to `cap`, +-20 % jitter; `reset()` after a success."""

    def __init__(self, first: float, cap: float) -> None:
        self.first, self.cap, self.current = first, cap, 0.0

    def next(self) -> float:
        """The next delay in seconds."""
        self.current = self.first if self.current == 0 else min(self.cap, self.current * 2)
        return self.current * random.uniform(0.8, 1.2)

    def reset(self) -> None:
        self.current = 0.0
