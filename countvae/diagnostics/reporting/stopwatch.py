"""Seconds per step of the report (``DiagnosticReport.timings``)."""

from __future__ import annotations

import time


class Stopwatch:
    """Records, under each step's name, the seconds since the previous step ended (or since it was made)."""

    def __init__(self, timings: dict[str, float] | None = None):
        self.timings: dict[str, float] = {} if timings is None else timings
        self.started = self.last = time.perf_counter()

    def lap(self, name: str) -> None:
        """End the step ``name``."""
        now = time.perf_counter()
        self.timings[name] = round(now - self.last, 3)
        self.last = now

    def total(self) -> float:
        """Seconds since the stopwatch was made, rounded as the steps are."""
        return round(time.perf_counter() - self.started, 3)
