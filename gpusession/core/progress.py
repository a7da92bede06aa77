"""Stages with elapsed time for long operations, and errors that name their stage."""

from __future__ import annotations

import contextlib
import time
from typing import Callable, Iterator

from .errors import GpuSessionError, StageError

Reporter = Callable[[str], None]


class Progress:
    """`with progress.stage("provision", "starting container"):` reports
    `[  0.4s] provision: starting container` and turns any failure inside into a StageError
    naming the stage."""

    def __init__(
        self, report: Reporter | None = None, *, clock: Callable[[], float] = time.monotonic
    ):
        self._report = report or (lambda line: None)
        self._clock = clock
        self.started = clock()
        self.current: str | None = None

    def elapsed(self) -> float:
        return self._clock() - self.started

    def say(self, text: str) -> None:
        line = f"[{self.elapsed():6.1f}s] {text}"
        self._report(line)

    def step(self, detail: str) -> None:
        """A sub-step inside the current stage."""
        self.say(f"{self.current}: {detail}" if self.current else detail)

    @contextlib.contextmanager
    def stage(self, name: str, detail: str = "") -> Iterator["Progress"]:
        outer, self.current = self.current, name
        self.say(f"{name}: {detail}" if detail else name)
        try:
            yield self
        except StageError:
            raise
        except GpuSessionError as exc:
            raise StageError(name, str(exc)) from exc
        except (OSError, RuntimeError, TimeoutError, ValueError) as exc:
            raise StageError(name, f"{type(exc).__name__}: {exc}") from exc
        finally:
            self.current = outer
