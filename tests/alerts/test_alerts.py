"""Collapse alerts: the event built for an alert (pure), nothing sent without a server, and against a real
`prefect server start` on loopback: the automation is made once and delivers Slack-style JSON to a webhook."""

from __future__ import annotations

import json
import logging
import math
import queue
import time

import pytest

from kevin.alerts import (
    AlertConfig,
    alert_event,
    alert_text,
    emit_collapse_alert,
    ensure_collapse_automation,
    should_notify,
    stop_reason,
)
from kevin.monitor import Alert, Severity
from tests.servers import prefect_server, webhook  # noqa: F401  (fixtures)

WARNING = Alert(metric="not_okay_ratio", value=0.35, threshold=0.2, step=7, severity=Severity.WARNING,
                should_stop=False, message="step 7: not_okay_ratio 0.35 > 0.2: reasoning drifts.", consecutive=1)
REPEAT = Alert(metric="not_okay_ratio", value=0.4, threshold=0.2, step=8, severity=Severity.WARNING,
               should_stop=False, message="step 8: not_okay_ratio 0.4 > 0.2 (2nd step in a row).", consecutive=2)
STOP = Alert(metric="junk_share", value=0.25, threshold=0.1, step=9, severity=Severity.CRITICAL, should_stop=True,
             message="step 9: junk_share 0.25 > 0.1: many responses are repetitive junk. Stopping training.")
ROW = {"step": 9, "n_responses": 64, "not_okay_ratio": 0.5, "junk_share": 0.25, "grad_norm": math.nan, "loss": 0.1}


# ---------------------------------------------------------------------------------------------------
# Pure


def test_alert_event_names_the_run_and_carries_the_metrics():
    kwargs = alert_event(STOP, ROW, run_id="abc123", run_name="gamma-0.4")
    assert kwargs["event"] == "kevin.collapse.alert"
    assert kwargs["resource"] == {
        "prefect.resource.id": "kevin.run.abc123", "prefect.resource.name": "gamma-0.4",
        "kevin.alert.metric": "junk_share", "kevin.alert.severity": "critical", "kevin.alert.notify": "true",
    }
    payload = kwargs["payload"]
    assert payload["text"] == (
        "[Kevin STOPPED] run gamma-0.4: " + STOP.message + "\n"
        "metrics: not_okay_ratio=0.5, junk_share=0.25, grad_norm=nan"
    )
    assert payload["alert"] == STOP.to_dict()
    assert payload["metrics"] == {"step": 9, "n_responses": 64, "not_okay_ratio": 0.5, "junk_share": 0.25,
                                  "grad_norm": "nan", "loss": 0.1}  # NaN is not JSON: sent as its text
    json.dumps(payload, allow_nan=False)  # the payload is strict JSON
    assert alert_event(REPEAT, None, run_id="r")["resource"]["kevin.alert.notify"] == "false"
    with pytest.raises(ValueError, match="run_id"):
        alert_event(STOP, ROW, run_id="")


def test_which_alerts_notify():
    assert should_notify(WARNING) and should_notify(STOP) and not should_notify(REPEAT)
    assert should_notify(REPEAT, notify_repeats=True)
    assert stop_reason(STOP) == f"collapse: junk_share at step 9 ({STOP.message})"
    assert alert_text(WARNING) == "[Kevin WARNING] run ?: " + WARNING.message


def test_alert_config_reads_the_url_from_the_environment_and_validates():
    assert AlertConfig().resolved_webhook_url({"KEVIN_ALERT_WEBHOOK_URL": "https://hooks.example/x"}) == "https://hooks.example/x"
    assert AlertConfig(webhook_url="https://a/b").resolved_webhook_url({"KEVIN_ALERT_WEBHOOK_URL": "https://c"}) == "https://a/b"
    assert AlertConfig().resolved_webhook_url({}) == ""
    with pytest.raises(ValueError, match="min_severity"):
        AlertConfig(min_severity="loud")
    with pytest.raises(ValueError, match="http"):
        AlertConfig(webhook_url="hooks.slack.com/x")
    with pytest.raises(ValueError, match="unknown alerts settings"):
        AlertConfig.from_dict({"webhook": "x"})


def test_without_a_server_nothing_is_sent(caplog, tmp_path):
    from prefect.settings import PREFECT_API_URL, PREFECT_HOME, temporary_settings

    with temporary_settings(updates={PREFECT_HOME: str(tmp_path)}, restore_defaults={PREFECT_API_URL}):
        with caplog.at_level(logging.INFO, logger="kevin.alerts"):
            assert emit_collapse_alert(STOP, ROW, run_id="r1") is None
            assert ensure_collapse_automation("http://127.0.0.1:9/hook") is None
    assert "alert not sent as an event" in caplog.text and STOP.message in caplog.text
    assert "no collapse automation" in caplog.text
    assert not (tmp_path / "prefect.db").exists()  # no temporary server was started for it
    # Below min_severity nothing is emitted, server or not.
    assert emit_collapse_alert(WARNING, ROW, run_id="r1", config=AlertConfig(min_severity="critical")) is None


# ---------------------------------------------------------------------------------------------------
# A real Prefect server on loopback and a webhook listener


def _automations(name: str):
    from prefect.client.orchestration import get_client

    with get_client(sync_client=True) as client:
        return client.read_automations_by_name(name)


def test_the_automation_is_made_once_and_kept_up_to_date(prefect_server, caplog):
    # An event name of its own: its dead URL must not fire (and be retried) on the delivery test's events.
    config = AlertConfig(automation_name="kevin-idempotent", block_name="kevin-idempotent-hook",
                         event_name="kevin.test.idempotent")
    caplog.set_level(logging.INFO, logger="kevin.alerts")
    first = ensure_collapse_automation("http://127.0.0.1:9/a", config)
    assert ensure_collapse_automation("http://127.0.0.1:9/a", config) == first
    assert "created Prefect automation" in caplog.text and "updated" not in caplog.text  # found as it is
    found = _automations("kevin-idempotent")
    assert [a.id for a in found] == [first]
    automation = found[0]
    assert automation.trigger.expect == {"kevin.test.idempotent"}
    assert automation.trigger.match.model_dump() == {"prefect.resource.id": "kevin.run.*", "kevin.alert.notify": "true"}
    assert automation.actions[0].type == "send-notification"
    block_id = automation.actions[0].block_document_id
    # A new URL updates the block in place (same document), still one automation.
    assert ensure_collapse_automation("http://127.0.0.1:9/b", config) == first
    again = _automations("kevin-idempotent")
    assert [a.id for a in again] == [first] and again[0].actions[0].block_document_id == block_id
    from prefect.blocks.notifications import CustomWebhookNotificationBlock

    block = CustomWebhookNotificationBlock.load("kevin-idempotent-hook", _sync=True)
    assert block.secrets.get_secret_value() == {"webhook_url": "http://127.0.0.1:9/b"}
    # A changed definition (another event name) updates the automation found by name.
    moved = AlertConfig(automation_name="kevin-idempotent", block_name="kevin-idempotent-hook", event_name="kevin.test.moved")
    assert ensure_collapse_automation("http://127.0.0.1:9/b", moved) == first
    assert "updated Prefect automation 'kevin-idempotent'" in caplog.text
    assert [a.trigger.expect for a in _automations("kevin-idempotent")] == [{"kevin.test.moved"}]
    # Copies (say, from two runs racing at their start) are reduced to one.
    from prefect.automations import AutomationCore
    from prefect.client.orchestration import get_client

    with get_client(sync_client=True) as client:
        client.create_automation(AutomationCore(**_automations("kevin-idempotent")[0].model_dump(exclude={"id"})))
    assert len(_automations("kevin-idempotent")) == 2
    assert ensure_collapse_automation("http://127.0.0.1:9/b", moved) == first
    assert [a.id for a in _automations("kevin-idempotent")] == [first]


def _post(api: str, path: str, body: dict):
    import httpx

    response = httpx.post(f"{api}{path}", json=body, timeout=30)
    response.raise_for_status()
    return response.json()


def test_the_ui_lists_the_automation_it_counts(prefect_server):
    """What the Automations page reads: the UI counts the list POST /automations/filter returns (the V2 UI sends a
    sort and offset, the V1 UI an empty body), draws each item's trigger and actions, and looks the notification's
    block up by id without secrets. Our automation must be in that list in a shape both draw."""
    config = AlertConfig(automation_name="kevin-ui", block_name="kevin-ui-hook", event_name="kevin.test.ui")
    created = str(ensure_collapse_automation("http://127.0.0.1:9/ui", config))
    v2 = _post(prefect_server, "/automations/filter", {"sort": "CREATED_DESC", "offset": 0})
    v1 = _post(prefect_server, "/automations/filter", {})
    assert _post(prefect_server, "/automations/count", {}) == len(v2) == len(v1)
    (listed,) = [a for a in v2 if a["name"] == "kevin-ui"]
    assert listed["id"] == created and listed["enabled"] is True and listed["description"]
    assert listed == next(a for a in v1 if a["id"] == created)
    trigger = listed["trigger"]  # an event trigger the UI calls "A custom trigger"
    assert trigger["type"] == "event" and trigger["posture"] in ("Reactive", "Proactive")
    assert trigger["expect"] == ["kevin.test.ui"] and trigger["threshold"] == 1
    assert all(isinstance(v, str) for v in trigger["match"].values()) and trigger["match_related"] == {}
    (action,) = listed["actions"]
    assert action["type"] == "send-notification" and action["body"] == "{{ event.payload.text }}"
    # The block the action names resolves, by the filter the V2 UI sends and the read the V1 UI makes.
    blocks = _post(prefect_server, "/block_documents/filter", {
        "offset": 0, "sort": "BLOCK_TYPE_AND_NAME_ASC", "include_secrets": False,
        "block_documents": {"operator": "and_", "id": {"any_": [action["block_document_id"]]}, "is_anonymous": {}}})
    assert [(b["id"], b["name"], b["block_type_name"]) for b in blocks] == [
        (action["block_document_id"], "kevin-ui-hook", "Custom Webhook")]
    import httpx

    one = httpx.get(f"{prefect_server}/block_documents/{action['block_document_id']}", timeout=30).json()
    assert one["name"] == "kevin-ui-hook" and one["block_type"]["name"] == "Custom Webhook"
    assert "http://127.0.0.1:9/ui" not in json.dumps(blocks) + json.dumps(one)  # the URL stays a secret


def _wait_until_live(config: AlertConfig, received: queue.Queue, timeout: float = 60.0) -> None:
    """Emit probe alerts until one reaches the webhook. A sqlite-backed server loads a new automation into its
    trigger cache a moment after creating it (a task on its event loop); an event in that moment is stored
    but triggers nothing. A training run creates the automation at its start, long before an alert."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        emit_collapse_alert(WARNING, None, run_id="probe", config=config)
        try:
            received.get(timeout=2)
            return
        except queue.Empty:
            continue
    raise AssertionError(f"the automation delivered no probe within {timeout} s")


def _messages(received: queue.Queue, timeout: float) -> list:
    """What the webhook receives within ``timeout`` seconds, late probes left out."""
    out, deadline = [], time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            item = received.get(timeout=max(0.01, deadline - time.monotonic()))
        except queue.Empty:
            break
        if "run probe:" not in item[2]["text"]:
            out.append(item)
    return out


def test_a_stop_alert_reaches_the_webhook_as_slack_json(prefect_server, webhook):
    url, received = webhook
    config = AlertConfig(automation_name="kevin-delivery", block_name="kevin-delivery-hook")
    assert ensure_collapse_automation(url, config) is not None
    _wait_until_live(config, received)
    # A repeated warning is an event but no message; the stop is both.
    assert emit_collapse_alert(REPEAT, ROW, run_id="run42", run_name="gamma-0.4", config=config) is not None
    assert emit_collapse_alert(STOP, ROW, run_id="run42", run_name="gamma-0.4", config=config) is not None
    got = []
    deadline = time.monotonic() + 60
    while not got and time.monotonic() < deadline:
        got = _messages(received, 1.0)
    got += _messages(received, 3.0)  # room for a wrongly sent second message to arrive
    assert [(path, ctype) for path, ctype, _ in got] == [("/hooks/kevin", "application/json")]
    assert got[0][2] == {"text": alert_text(STOP, ROW, run_name="gamma-0.4")}
