"""A progress bar for long runs (rich), with a windowed steps/sec; silent when disabled."""

from __future__ import annotations

from types import TracebackType

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from .metrics import RateWindow


class RunProgress:
    """Context manager; ``advance(n, trainer_total)`` after each iteration."""

    def __init__(self, total: int, enabled: bool) -> None:
        self.enabled = enabled
        self.window = RateWindow()
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
        rate = self.window.add(trainer_total)
        self._progress.update(self._task, advance=steps, rate=f"{rate:,.0f} steps/s" if rate else "")
