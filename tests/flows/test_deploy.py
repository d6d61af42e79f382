"""`python -m flows.deploy` against a real temporary Prefect server (the test harness): the work pool, the training
deployment and the collapse automation, read back through the client and through the request the UI's Automations
page makes."""

from __future__ import annotations

import pytest

from tests.conftest import REPO

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")

PARAMS = [str(REPO / "params.yaml"), str(REPO / "configs" / "cpu.yaml")]
HOOK = "http://127.0.0.1:9/hooks/kevin"


def test_deploy_registers_the_training_flow_and_a_complete_collapse_automation(harness, monkeypatch, tmp_path, capsys):
    import httpx
    from prefect.client.orchestration import get_client

    from flows import deploy

    monkeypatch.setenv("KEVIN_ALERT_WEBHOOK_URL", HOOK)
    argv = ["--pool", "kevin-test", "--cron", "", "--no-evaluation", "--project", str(tmp_path)]
    assert deploy.main([*argv, *(arg for path in PARAMS for arg in ("--params", path))]) == 0
    printed = capsys.readouterr().out
    assert "deployed kevin-train (flows/train.py:train) to pool 'kevin-test', no schedule" in printed

    with get_client(sync_client=True) as client:
        deployment = client.read_deployment_by_name("kevin-train/kevin-train")
        (automation,) = client.read_automations_by_name("kevin-collapse-alert")
        block = client.read_block_document(automation.actions[0].block_document_id)
    assert deployment.work_pool_name == "kevin-test"
    assert deployment.parameters == {"params": PARAMS, "overrides": [], "resume": True, "project_dir": str(tmp_path)}
    assert f"collapse automation: {automation.id}" in printed

    # The automation as the server holds it: the trigger, and an action whose block exists under its name.
    assert automation.enabled and automation.description.startswith("Kevin: post collapse alerts")
    assert automation.trigger.expect == {"kevin.collapse.alert"} and automation.trigger.posture == "Reactive"
    assert automation.trigger.match.model_dump() == {"prefect.resource.id": "kevin.run.*", "kevin.alert.notify": "true"}
    action = automation.actions[0]
    assert (action.type, action.subject, action.body) == ("send-notification", "Kevin collapse alert",
                                                          "{{ event.payload.text }}")
    assert (block.name, block.is_anonymous, block.block_type.slug) == ("kevin-collapse-webhook", False, "custom-webhook")

    # What the UI's Automations page requests: the automation is listed with every field a card shows.
    listed = httpx.post(f"{harness}/automations/filter", json={"sort": "CREATED_DESC", "offset": 0}).json()
    assert [a["id"] for a in listed] == [str(automation.id)]
    card = listed[0]
    assert (card["name"], card["enabled"], card["trigger"]["type"]) == ("kevin-collapse-alert", True, "event")
    assert card["actions"] == [{"type": "send-notification", "block_document_id": str(block.id),
                                "subject": "Kevin collapse alert", "body": "{{ event.payload.text }}"}]
