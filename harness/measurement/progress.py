"""A progress bar for long runs (rich), with a windowed steps/sec; silent when disabled.

The total is the planned env steps (warm-up plus every timed repeat). An iteration collects all its
env steps at once, so each phase can end past its budget: the bar then grows its total to the steps
really taken, and never shows more completed steps than its total."""

from __future__ import annotations

from types import TracebackType

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from harness.measurement.metrics import RateWindow


class RunProgress:
    """Context manager; ``advance(n, trainer_total)`` after each iteration."""

    def __init__(self, total: int, enabled: bool) -> None:
        self.enabled = enabled
        self.window = RateWindow()
        self.completed = 0
        self.total = total
        if enabled:
            self._progress = Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                                      TextColumn("{task.fields[rate]}"), TimeElapsedColumn(),
                                      console=Console(stderr=True), transient=True)
            self._task = self._progress.add_task("", total=total, rate="")

    def __enter__(self) -> "RunProgress":
        if self.enabled:
            self._progress.start()
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        if self.enabled:
            self._progress.stop()

    def describe(self, label: str) -> None:
        self.window = RateWindow()
        if self.enabled:
            self._progress.update(self._task, description=label, rate="")

    def advance(self, steps: int, trainer_total: int) -> None:
        if not self.enabled:
            return
        self.completed += steps
        self.total = max(self.total, self.completed)  # an overshooting iteration grows the total, honestly
        rate = self.window.add(trainer_total)
        self._progress.update(self._task, completed=self.completed, total=self.total,
                              rate=f"{rate:,.0f} steps/s" if rate else "")
