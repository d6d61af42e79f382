"""Collapse alerts through Prefect: one event per monitor alert, and an automation that posts them to a webhook.

How an alert reaches a person:
1. ``CollapseMonitor.observe`` returns ``Alert`` records (kevin/monitor/events.py) for each indicator over its limit.
2. ``emit_collapse_alert`` turns each warning/critical alert into a Prefect event, ``kevin.collapse.alert``,
   whose resource is the training run (``kevin.run.<run id>``) with the alert's metric, severity and whether
   it should notify as labels, and whose payload holds the alert, the step's monitor metrics and the text of
   the message. Inside a flow run Prefect also relates the event to that flow run, so it shows on its page.
3. ``ensure_collapse_automation`` creates, once, an automation on the server: trigger = each such event that
   should notify; action = send a notification through a Custom Webhook block that POSTs
   ``{"text": <message>}`` (the JSON a Slack incoming webhook, and Mattermost or Teams' Slack-compatible
   ones, accept) to the configured URL. Calling it again finds the automation and block and brings them up
   to date instead of adding copies.

Without a Prefect server configured (no ``PREFECT_API_URL``) nothing is sent: the alert is only logged, and
the MLflow tag and the flow's final state carry the reason; Prefect's in-process temporary server is never
started for an alert. prefect is imported inside the functions that need it: importing this module costs
nothing and works where prefect is not installed.

The webhook URL is a secret (it lets anyone post to the channel): keep it out of params.yaml and set it in
the environment variable named by ``AlertConfig.webhook_url_env``; it is stored in the block as a secret
value, which the Prefect UI does not display.
"""

from __future__ import annotations

import logging
import math
import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from kevin.settings import Settings

if TYPE_CHECKING:
    from uuid import UUID

    from kevin.monitor import Alert

logger = logging.getLogger(__name__)

SEVERITY_ORDER = ("info", "warning", "critical")
# The monitor metrics quoted in a notification, in this order, when the step's row has them.
MESSAGE_METRICS = ("not_okay_ratio", "junk_share", "junk_mean", "junk_max", "truncated_share", "forgotten_share",
                   "mean_tokens", "entropy", "grad_norm", "clip_fraction", "approx_kl")


@dataclass
class AlertConfig(Settings):
    """Where collapse alerts go (Prefect events and a webhook automation)."""

    section = "alerts"

    webhook_url: str = ""
    """The Slack-compatible incoming webhook that receives alerts; "" reads it from ``webhook_url_env``. With
    neither set, events are still emitted (when a Prefect server is configured) but no automation is made."""

    webhook_url_env: str = "KEVIN_ALERT_WEBHOOK_URL"
    """Environment variable that holds the webhook URL, so the secret stays out of params.yaml."""

    event_name: str = "kevin.collapse.alert"
    """Name of the Prefect event each alert emits (the automation's trigger expects it)."""

    automation_name: str = "kevin-collapse-alert"
    """Name of the automation; ``ensure_collapse_automation`` finds it by this name, so it is made only once."""

    block_name: str = "kevin-collapse-webhook"
    """Name of the Custom Webhook notification block that holds the URL."""

    min_severity: str = "warning"
    """Least severity that emits an event: "info" (also the calibration notice), "warning" or "critical"
    (only alerts that stop training)."""

    notify_repeats: bool = False
    """Send a message for every step an indicator stays over its limit; False sends the first step of each
    streak and every stop, while still emitting an event per alert (the record on the server)."""

    def __post_init__(self) -> None:
        if self.min_severity not in SEVERITY_ORDER:
            raise ValueError(f"alerts.min_severity {self.min_severity!r}; use one of {list(SEVERITY_ORDER)}")
        for name in ("event_name", "automation_name", "block_name"):
            if not getattr(self, name).strip():
                raise ValueError(f"alerts.{name} is empty; give it a name or leave the default")
        if self.webhook_url and not self.webhook_url.startswith(("http://", "https://")):
            raise ValueError(f"alerts.webhook_url must be an http(s) URL, got {self.webhook_url!r}")

    def resolved_webhook_url(self, env: Mapping[str, str] | None = None) -> str:
        """The configured URL, else the one in ``webhook_url_env`` ("" when neither is set)."""
        env = os.environ if env is None else env
        return self.webhook_url or (env.get(self.webhook_url_env, "") if self.webhook_url_env else "")


# ----------------------------------------------------------------------------------------------------
# The event (pure)


def severity_at_least(alert: Alert, minimum: str) -> bool:
    return SEVERITY_ORDER.index(_severity(alert)) >= SEVERITY_ORDER.index(minimum)


def should_notify(alert: Alert, notify_repeats: bool = False) -> bool:
    """Whether this alert's event should reach the webhook: a stop always, else the first step of a streak
    (or every step with ``notify_repeats``)."""
    return alert.should_stop or notify_repeats or alert.consecutive == 1


def stop_reason(alert: Alert) -> str:
    """The one line that says why training stopped, for the flow's final state and the MLflow tag."""
    return f"collapse: {alert.metric} at step {alert.step} ({alert.message})"


def alert_text(alert: Alert, metrics: Mapping[str, float] | None = None, *, run_name: str = "") -> str:
    """The notification text: who (run), what (the alert's message) and the step's main monitor metrics."""
    head = "STOPPED" if alert.should_stop else _severity(alert).upper()
    lines = [f"[Kevin {head}] run {run_name or '?'}: {alert.message}"]  # the message starts with its step
    shown = [(k, metrics[k]) for k in MESSAGE_METRICS if metrics and k in metrics]
    if shown:
        lines.append("metrics: " + ", ".join(f"{k}={_number(v)}" for k, v in shown))
    return "\n".join(lines)


def alert_event(alert: Alert, metrics: Mapping[str, float] | None = None, *, run_id: str, run_name: str = "",
                config: AlertConfig | None = None) -> dict[str, Any]:
    """The keyword arguments of ``prefect.events.emit_event`` for one alert: event name, resource (the run,
    labelled with the alert's metric, severity and ``kevin.alert.notify``), and a JSON-safe payload."""
    config = config or AlertConfig()
    if not run_id:
        raise ValueError("run_id is empty; pass the MLflow run id (or another id that names the training run)")
    resource = {
        "prefect.resource.id": f"kevin.run.{run_id}",
        "prefect.resource.name": run_name or run_id,
        "kevin.alert.metric": alert.metric,
        "kevin.alert.severity": _severity(alert),
        "kevin.alert.notify": str(should_notify(alert, config.notify_repeats)).lower(),
    }
    payload = {
        "text": alert_text(alert, metrics, run_name=run_name or run_id),
        "alert": _json_safe(alert.to_dict()),
        "metrics": _json_safe(dict(metrics or {})),
    }
    return {"event": config.event_name, "resource": resource, "payload": payload}


def _severity(alert: Alert) -> str:
    return getattr(alert.severity, "value", str(alert.severity))


def _number(value: Any) -> str:
    return f"{value:.4g}" if isinstance(value, float) else str(value)


def _json_safe(data: Any) -> Any:
    # Event payloads are JSON: a NaN/inf value (a diverged grad norm) would not survive; it becomes its text.
    if isinstance(data, float) and not math.isfinite(data):
        return str(data)
    if isinstance(data, Mapping):
        return {str(k): _json_safe(v) for k, v in data.items()}
    if isinstance(data, (list, tuple)):
        return [_json_safe(v) for v in data]
    return data


# ----------------------------------------------------------------------------------------------------
# Prefect


def prefect_api_url() -> str:
    """The Prefect API the current settings point at (``PREFECT_API_URL`` from the environment or the active
    profile); "" when none is configured, or when prefect is not installed (a training run driven without Prefect,
    e.g. on a GPU machine that lacks it: alerts are then logged only)."""
    try:
        from prefect.settings import get_current_settings
    except ImportError:
        return ""

    return get_current_settings().api.url or ""


def emit_collapse_alert(alert: Alert, metrics: Mapping[str, float] | None = None, *, run_id: str,
                        run_name: str = "", config: AlertConfig | None = None) -> str | None:
    """Emit the Prefect event of one alert; returns the event id, or None when nothing was sent (an alert below
    ``min_severity``, or no server configured: then it is only logged). Prefect sends events from a
    background worker that flushes when the process exits, so a run that stops right after its alert still
    delivers it; a delivery problem is logged by that worker and never stops training."""
    config = config or AlertConfig()
    if not severity_at_least(alert, config.min_severity):
        return None
    kwargs = alert_event(alert, metrics, run_id=run_id, run_name=run_name, config=config)
    if not prefect_api_url():
        logger.warning("no Prefect server configured (PREFECT_API_URL): alert not sent as an event: %s",
                       kwargs["payload"]["text"])
        return None
    from prefect.events import emit_event

    event = emit_event(**kwargs)
    return str(event.id) if event is not None else None


def _webhook_block(url: str, config: AlertConfig):
    from prefect.blocks.notifications import CustomWebhookNotificationBlock

    # The URL sits in the block's secrets and the url field only names it, so the UI shows no secret.
    # The notification's body is the whole Slack message: the automation renders it from the event.
    return CustomWebhookNotificationBlock(
        name=config.block_name, url="{{webhook_url}}", method="POST", json_data={"text": "{{body}}"},
        secrets={"webhook_url": url},
    )


def _desired_automation(block_id: UUID, config: AlertConfig):
    from prefect.automations import AutomationCore, EventTrigger, SendNotification

    return AutomationCore(
        name=config.automation_name,
        description="Kevin: post collapse alerts (Not-Okay Ratio, junk, ...) of training runs to a webhook.",
        enabled=True,
        trigger=EventTrigger(
            expect={config.event_name},
            match={"prefect.resource.id": "kevin.run.*", "kevin.alert.notify": "true"},
            posture="Reactive", threshold=1, within=0,
        ),
        actions=[SendNotification(block_document_id=block_id, subject="Kevin collapse alert",
                                  body="{{ event.payload.text }}")],
    )


def _same(existing: Any, desired: Any) -> bool:
    # Compare only the fields we define: the server's copy carries more (its id, timestamps).
    want = desired.model_dump(mode="json")
    have = existing.model_dump(mode="json")
    return all(have.get(k) == v for k, v in want.items())


def ensure_collapse_automation(webhook_url: str | None = None, config: AlertConfig | None = None) -> UUID | None:
    """Create the collapse automation on the configured Prefect server, or find it and bring it up to date.

    Idempotent: the webhook block is saved under ``config.block_name`` (overwritten in place, same id) and
    the automation is looked up by ``config.automation_name``; an identical one is left alone, a different
    one updated, and copies left by earlier runs are deleted. Returns the automation id, or None (and logs
    why) when no server is configured or no webhook URL is set. A configured server that cannot be reached
    raises (Prefect's HTTP error): call it when the run starts, where a wrong PREFECT_API_URL should stop it.
    """
    config = config or AlertConfig()
    url = webhook_url or config.resolved_webhook_url()
    if not prefect_api_url():
        logger.info("no Prefect server configured (PREFECT_API_URL): no collapse automation; alerts are logged only")
        return None
    if not url:
        logger.info("no webhook URL (alerts.webhook_url or $%s): no collapse automation", config.webhook_url_env)
        return None
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.sorting import AutomationSort
    from prefect.events.filters import AutomationFilter, AutomationFilterName

    # _sync: this is sync code even when called from inside an async flow (Prefect would hand back a coroutine).
    block_id = _webhook_block(url, config).save(config.block_name, overwrite=True, _sync=True)
    desired = _desired_automation(block_id, config)
    with get_client(sync_client=True) as client:
        by_name = AutomationFilter(name=AutomationFilterName(any_=[config.automation_name]))
        found = client.read_automations(automations=by_name, sort=AutomationSort.CREATED_DESC)
        if not found:
            automation_id = client.create_automation(desired)
            logger.info("created Prefect automation %r (%s)", config.automation_name, automation_id)
            return automation_id
        keep, extra = found[-1], found[:-1]  # the oldest stays, so its id is stable across calls
        for copy in extra:
            client.delete_automation(copy.id)
        if not _same(keep, desired):
            client.update_automation(keep.id, desired)
            logger.info("updated Prefect automation %r (%s)", config.automation_name, keep.id)
        return keep.id
