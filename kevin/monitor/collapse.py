"""``CollapseMonitor``: turns each step's responses and update metrics into a history row and a list of alerts.

It calibrates the opening on the base model's first batch, applies the thresholds with their streaks (patience),
and raises its stop flag; it never steers training itself (the trainer reads ``should_stop``). Its state goes into
checkpoints, so a resumed run neither recalibrates on a drifted policy nor forgets a streak.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Mapping, Sequence
from typing import Any

from kevin.monitor.batch import forgotten_share, text_metrics
from kevin.monitor.config import MonitorConfig
from kevin.monitor.events import Alert, Severity
from kevin.monitor.names import CHECK_KEY, HINTS, base_metric
from kevin.monitor.opening import calibrate_opening, not_okay_ratio, opening_counts

# The package's logger, as before it was split into modules: flows and users filter the monitor's warnings by the
# name "kevin.monitor".
logger = logging.getLogger(__package__)


def _crosses(value: float, threshold: float, bound: str) -> bool:
    # A NaN / inf grad norm or KL is a failure in itself, so non-finite values always cross.
    if not math.isfinite(value):
        return True
    return value > threshold if bound == "max" else value < threshold


def _ordinal(k: int) -> str:
    suffix = "th" if 10 <= k % 100 <= 20 else {1: "st", 2: "nd", 3: "rd"}.get(k % 10, "th")
    return f"{k}{suffix}"


class CollapseMonitor:
    """Turns each step's responses and update metrics into a history row and alerts.

    Usage in a training loop::

        monitor = CollapseMonitor(MonitorConfig(expected_opening="Okay,"))
        for step in ...:
            alerts = monitor.observe(step, responses, truncated, {"entropy": h, "grad_norm": g, ...})
            ...  # hand alerts to tracking / notifications
            if monitor.should_stop:
                save_checkpoint(); break

    State (opening, history, alerts, streaks) goes into checkpoints through `state_dict` so a resumed run
    neither recalibrates on a drifted policy nor forgets how long a metric has been over its limit.
    """

    def __init__(self, config: MonitorConfig | None = None) -> None:
        self.config = config or MonitorConfig()
        self.opening: str | None = self.config.expected_opening
        self.opening_share: float | None = None  # set by calibration; None with a configured opening
        self.history: list[dict[str, float]] = []
        self.alerts: list[Alert] = []
        self._streaks: dict[str, int] = {}  # "metric:bound" -> consecutive crossing steps
        self._last_step: int | None = None
        self.solved: dict[str, bool] = {}  # task -> whether its latest draw had a correct kernel (forgotten_share)

    # -- calibration --

    @property
    def opening_trusted(self) -> bool:
        """Whether Not-Okay alerts are meaningful: a configured opening, or a calibrated one the base model
        used in at least min_opening_share of its first batch."""
        return self._trusts(self.opening, self.opening_share)

    def _trusts(self, opening: str | None, opening_share: float | None) -> bool:
        if opening is None:
            return False
        return opening_share is None or opening_share >= self.config.min_opening_share

    def calibrate(self, texts: Sequence[str], step: int = 0) -> list[Alert]:
        """Set the opening from a batch of the base model's responses (observe does this on its first batch
        when no opening is configured). Returns an info alert when the opening is too rare to be trusted."""
        self.opening, self.opening_share, alerts = self._calibration(texts, step)
        return alerts

    def _calibration(self, texts: Sequence[str], step: int) -> tuple[str, float, list[Alert]]:
        # Pure: observe commits the result only once the whole step has been validated.
        opening = calibrate_opening(texts, self.config.opening_words)
        share = 1.0 - not_okay_ratio(texts, opening)
        logger.info("calibrated opening %r (share %.3f of %d responses)", opening, share, len(texts))
        if share >= self.config.min_opening_share:
            return opening, share, []
        alert = Alert(
            metric="opening_share", value=share, threshold=self.config.min_opening_share,
            step=step, severity=Severity.INFO, should_stop=False, bound="min",
            message=(
                f"step {step}: calibrated opening {opening!r} starts only {share:.0%} of the "
                f"base batch (< {self.config.min_opening_share:.0%}); {HINTS['opening_share']}. Set "
                "MonitorConfig.expected_opening or raise opening_words if the model has a longer habit."
            ),
        )
        return opening, share, [alert]

    # -- observation --

    def observe(
        self,
        step: int,
        responses: Sequence[str],
        truncated_flags: Sequence[bool] | None = None,
        train_metrics: Mapping[str, Any] | None = None,
        *,
        token_counts: Sequence[int] | None = None,
        turns: Sequence[int] | None = None,
        solved: Mapping[str, bool] | None = None,
    ) -> list[Alert]:
        """Record one step and return its alerts (at most one per metric and bound).

        ``responses`` are the step's response texts (the whole response or just its reasoning: the opening
        is at the start either way). ``truncated_flags`` and ``token_counts`` give one entry per response.
        ``train_metrics`` holds the update's numbers (TRAIN_METRICS; floats or 0-dim tensors); other keys,
        e.g. loss or lr, are recorded in the history too but cannot have thresholds. ``turns`` (the turn index
        of each response) adds per-turn Not-Okay and junk shares to the row, because collapse shows first in
        the last turn. ``solved`` (each task of the step -> whether any of its kernels is correct) adds
        ``forgotten_share`` against each task's previous draw, which the monitor remembers. Steps must increase.
        """
        if self._last_step is not None and step <= self._last_step:
            raise ValueError(
                f"step {step} observed after step {self._last_step}; observe steps in increasing order (after a "
                "resume, restore the monitor with load_state_dict from the same checkpoint)"
            )
        cfg = self.config
        alerts: list[Alert] = []
        opening, opening_share = self.opening, self.opening_share
        # Calibrate on the first batch that has openings; an all-empty batch defers it to the next step.
        if opening is None and opening_counts(responses, cfg.opening_words):
            opening, opening_share, alerts = self._calibration(responses, step)

        row: dict[str, float] = {"step": step, "n_responses": len(responses)}
        row.update(text_metrics(
            responses, opening=opening, truncated_flags=truncated_flags, token_counts=token_counts,
            turns=turns, ngram_size=cfg.ngram_size, max_period=cfg.max_period,
            junk_response_threshold=cfg.junk_response_threshold, code_copies=cfg.code_copies,
            tail_words=cfg.tail_words,
        ))
        row[CHECK_KEY] = float(self._trusts(opening, opening_share))
        forgotten = forgotten_share(self.solved, solved) if solved is not None else None
        if forgotten is not None:
            row["forgotten_share"] = forgotten
        for key, value in (train_metrics or {}).items():
            if key in row:
                raise ValueError(f"train metric {key!r} clashes with a monitor metric; rename it")
            try:
                row[key] = float(value)
            except (TypeError, ValueError) as exc:
                raise TypeError(f"train metric {key!r} must be a number (or 0-dim tensor), got {value!r}") from exc

        # Everything validated: commit, so a rejected call leaves the monitor as it was.
        self.opening, self.opening_share = opening, opening_share
        self.history.append(row)
        self._last_step = step
        self.remember(solved or {})
        if len(self.history) > cfg.min_steps:
            alerts += self._check(step, row)
        for alert in alerts:
            logger.log(logging.WARNING if alert.severity != Severity.INFO else logging.INFO, alert.message)
        self.alerts += alerts
        return alerts

    def _check(self, step: int, row: Mapping[str, float]) -> list[Alert]:
        cfg = self.config
        alerts = []
        for bound, table in (("max", cfg.max_thresholds), ("min", cfg.min_thresholds)):
            for metric, threshold in table.items():
                key = f"{metric}:{bound}"
                value = row.get(metric)
                # An untrusted calibrated opening has no habit to lose: record the ratio, do not alert on it.
                skip = value is None or (base_metric(metric) == "not_okay_ratio" and not self.opening_trusted)
                if skip or not _crosses(value, threshold, bound):
                    self._streaks[key] = 0
                    continue
                streak = self._streaks.get(key, 0) + 1
                self._streaks[key] = streak
                stop = metric in cfg.stop_on and streak >= cfg.patience
                alerts.append(Alert(
                    metric=metric, value=value, threshold=threshold, step=step,
                    severity=Severity.CRITICAL if stop else Severity.WARNING, should_stop=stop,
                    message=self._message(metric, value, threshold, step, bound, streak, stop),
                    bound=bound, consecutive=streak,
                ))
        return alerts

    def _message(self, metric: str, value: float, threshold: float, step: int, bound: str, streak: int,
                 stop: bool) -> str:
        sign = ">" if bound == "max" else "<"
        text = f"step {step}: {metric} {value:.4g} {sign} {threshold:.4g}"
        if streak > 1:
            text += f" ({_ordinal(streak)} step in a row)"
        base = base_metric(metric) or metric
        hint = HINTS.get(base, "")
        if base != metric:
            hint = f"{hint} ({metric.split('/', 1)[1].replace('_', ' ')})"
        if base == "not_okay_ratio" and self.opening:
            hint = f"{hint}; expected opening {self.opening!r}"
        text += f": {hint}"
        return text + (". Stopping training." if stop else ".")

    # -- results --

    @property
    def should_stop(self) -> bool:
        """True once any alert asked to stop (stays True: a collapsed run does not recover by itself)."""
        return any(a.should_stop for a in self.alerts)

    @property
    def stop_alert(self) -> Alert | None:
        """The first alert that asked to stop, for the run's final status message."""
        return next((a for a in self.alerts if a.should_stop), None)

    def state_dict(self) -> dict[str, Any]:
        """Plain data for a checkpoint (JSON-serialisable)."""
        return {
            "opening": self.opening,
            "opening_share": self.opening_share,
            "history": [dict(r) for r in self.history],
            "alerts": [a.to_dict() for a in self.alerts],
            "streaks": dict(self._streaks),
            "last_step": self._last_step,
            "solved": dict(self.solved),
        }

    def remember(self, solved: Mapping[str, bool]) -> None:
        """Record each task's latest draw (task -> whether any of its kernels was correct) for ``forgotten_share``:
        ``observe`` does it for every step; a resume from a checkpoint written before the monitor kept it replays
        the steps' verdicts through here."""
        self.solved.update({task: bool(ok) for task, ok in solved.items()})

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        self.opening = state["opening"]
        self.opening_share = state["opening_share"]
        self.history = [dict(r) for r in state["history"]]
        self.alerts = [Alert.from_dict(a) for a in state["alerts"]]
        self._streaks = dict(state["streaks"])
        self._last_step = state["last_step"]
        self.solved = dict(state.get("solved", {}))  # checkpoints written before forgotten_share lack it
