"""A gate's outcome as a type: pass, fail, no verdict, bad input or interrupted, with its one-line reason.

``rlgauge gate`` (``harness.cli.app``) and the in-process ``harness.gate(...)`` (the pytest plugin's) both
decide through ``verdict_of``: what the gate returned or raised becomes a ``GateVerdict``, so no caller
tells "no verdict" from "bad input" by reading what was printed.
"""

from __future__ import annotations

import enum
from collections.abc import Callable
from dataclasses import dataclass

from reference_trainers.config.schema import ConfigError

from harness.errors import NoVerdict, UserError

from harness.errors import EXIT_BAD_INPUT, EXIT_CHECK_FAILED, EXIT_INTERRUPTED, EXIT_OK  # noqa: F401 (re-exported)


class Outcome(str, enum.Enum):
    """What a gate concluded."""

    PASS = "pass"
    FAIL = "fail"
    NO_VERDICT = "no verdict"
    """The gate could not decide on this machine: a run not trustworthy, or too few repeats or rounds."""
    BAD_INPUT = "bad input"
    INTERRUPTED = "interrupted"


_EXIT_CODES = {Outcome.PASS: EXIT_OK, Outcome.FAIL: EXIT_CHECK_FAILED, Outcome.NO_VERDICT: EXIT_BAD_INPUT,
               Outcome.BAD_INPUT: EXIT_BAD_INPUT, Outcome.INTERRUPTED: EXIT_INTERRUPTED}
_BY_RETURN_CODE = {EXIT_OK: Outcome.PASS, EXIT_CHECK_FAILED: Outcome.FAIL, EXIT_BAD_INPUT: Outcome.NO_VERDICT,
                   EXIT_INTERRUPTED: Outcome.INTERRUPTED}


@dataclass(frozen=True)
class GateVerdict:
    """A gate's outcome, its one-line reason (empty on a plain pass) and, in-process, what it printed."""

    outcome: Outcome
    reason: str = ""
    output: str = ""

    @property
    def exit_code(self) -> int:
        """``rlgauge gate``'s exit code: 0 pass, 1 fail, 2 no verdict or bad input, 130 interrupted."""
        return _EXIT_CODES[self.outcome]

    @property
    def passed(self) -> bool:
        return self.outcome is Outcome.PASS


def verdict_of(decide: Callable[[], int]) -> GateVerdict:
    """Run a gate (``decide`` returns its exit code, or raises) and type what it concluded.

    A returned 2 is a gate that measured and could not decide (``gate --base``'s too few rounds or untrustworthy
    rounds); bad input always raises (``UserError``/``ConfigError``), and a refusal to decide raises
    ``NoVerdict``."""
    try:
        code = decide()
    except NoVerdict as exc:
        return GateVerdict(Outcome.NO_VERDICT, " ".join(str(exc).split()))
    except (UserError, ConfigError) as exc:
        return GateVerdict(Outcome.BAD_INPUT, " ".join(str(exc).split()))
    except KeyboardInterrupt:
        return GateVerdict(Outcome.INTERRUPTED, "interrupted")
    if code not in _BY_RETURN_CODE:
        raise ValueError(f"a gate returned exit code {code}; expected one of {sorted(_BY_RETURN_CODE)}")
    return GateVerdict(_BY_RETURN_CODE[code])
