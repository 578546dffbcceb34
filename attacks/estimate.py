"""What an attack can do with an update, said in one line before it starts (registers nothing).

An ``Estimate`` counts the row *visits* an update holds (rows x local epochs under FedAvg, the
rows under FedSGD) and the local steps the attack replays, sets them against what the method
separates in closed form (Goliath: the time-embedding route reads at most h/2 visits at the
denoiser's width h; FedAvg with Adam keeps only ~sign(g), which no closed form reads), and expects
a time: the optimisation's objective evaluations x the cost of one, measured on the spot (one
simulated update of candidate rows and its backward pass). The observer prints the line before
the attack runs (``AttackObserver``), so a user learns before a long attack that it is past
what the method separates, and records the numbers beside the scores (``visits``,
``separable``, ``expected_s``).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass


@dataclass(frozen=True)
class Estimate:
    """An attack's outlook on one update."""

    method: str
    rows: int  # examples in the update (the reply's num-examples)
    epochs: int  # local epochs (1 under FedSGD)
    visits: int  # row visits: each row once per local epoch
    steps: int  # local steps the attack replays per objective evaluation
    #: row visits the method's closed form separates (0: it has none for this update)
    separable: int
    evaluations: int  # objective evaluations of the optimisation budget
    seconds_per_evaluation: float  # measured: one simulated update and its backward pass

    @property
    def within(self) -> bool:
        """The closed form can separate every visit."""
        return 0 < self.visits <= self.separable

    @property
    def seconds(self) -> float:
        """Expected time: the optimisation's budget (the closed form alone costs ~2 evaluations;
        when its check fails the optimisation runs anyway, so the budget is the upper figure)."""
        return self.evaluations * self.seconds_per_evaluation

    def metrics(self) -> dict[str, float]:
        return {"visits": float(self.visits), "separable": float(self.separable),
                "expected_s": self.seconds}  # fmt: skip

    def line(self) -> str:
        """The one line a user reads before the attack starts."""
        update = (f"{self.rows} rows x {self.epochs} epochs = {self.visits} row visits"
                  if self.epochs > 1 else f"{self.rows} rows")  # fmt: skip
        head = f"{self.method}: {update} in {self.steps} replayed local step(s)"
        if self.within:
            reach = f"within the closed form's {self.separable} visits (exact where it separates)"
            when = (f"~{2 * self.seconds_per_evaluation:.1f} s, up to {self.seconds:.0f} s if "
                    "its check fails")  # fmt: skip
        elif self.separable:
            reach = (f"BEYOND the closed form's {self.separable} visits: optimisation alone, "
                     "expect little above the prior")  # fmt: skip
            when = f"~{self.seconds:.0f} s"
        else:
            reach = "no closed form for this update: optimisation alone"
            when = f"~{self.seconds:.0f} s"
        return (f"{head}; {reach}; expected {when} ({self.evaluations} evaluations x "
                f"{self.seconds_per_evaluation:.3g} s)")  # fmt: skip


def timed(evaluate: Callable[[], object], repeats: int = 1) -> float:
    """Seconds of one call of ``evaluate`` (the mean of ``repeats``)."""
    start = time.perf_counter()
    for _ in range(repeats):
        evaluate()
    return (time.perf_counter() - start) / repeats
