"""The SDK stands without the controller package: importing any client module loads no
`controller` module, and the admin client's own result models describe the same JSON as
the controller's views (same fields, types, defaults and required keys), so the two cannot
drift apart unnoticed."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from controller import views
from dataplane.client import admin_models

ROOT = Path(__file__).resolve().parent.parent

PAIRS = ["Health", "ControllerInfo", "Cluster", "BrokerView", "BrokerList", "PartitionView", "TopicSummary",
         "TopicList", "TopicDetail", "PartitionList", "ReassignmentList", "ElectionResult", "Done"]


def test_client_modules_import_nothing_from_controller():
    code = ("import sys\n"
            "import dataplane.client, dataplane.client.admin, dataplane.client.admin_models\n"
            "import dataplane.client.sync, dataplane.client.cli\n"
            "from dataplane.client import AdminClient\n"
            "bad = sorted(m for m in sys.modules if m == 'controller' or m.startswith('controller.'))\n"
            "print(','.join(bad))\n")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "", f"client imports pulled in: {out.stdout.strip()}"


def _shape(schema: dict) -> dict:
    """A JSON schema without what only says how strictly each side reads (extra keys) or what
    it is called (titles)."""
    if isinstance(schema, dict):
        return {k: _shape(v) for k, v in schema.items() if k not in ("additionalProperties", "title")}
    if isinstance(schema, list):
        return [_shape(v) for v in schema]
    return schema


@pytest.mark.parametrize("name", PAIRS)
def test_client_model_has_the_controller_views_json_shape(name):
    client_schema = getattr(admin_models, name).model_json_schema()
    server_schema = getattr(views, name).model_json_schema()
    assert _shape(client_schema) == _shape(server_schema)


def test_every_client_model_is_checked():
    """A model added on one side only is noticed here."""
    client = {n for n in admin_models.__all__ if not n.startswith("Snapshot")}
    assert client == set(PAIRS)


def test_a_controller_answer_parses_and_a_newer_field_is_ignored():
    detail = views.TopicDetail(name="t", topic_id="abc", metadata_offset=7, config={"partitions": 2},
                               partitions=[views.PartitionView(topic="t", partition=0, replicas=[1, 2], isr=[1],
                                                               leader=1, leader_epoch=3, partition_epoch=4)])
    doc = detail.model_dump(mode="json")
    parsed = admin_models.TopicDetail.model_validate(doc)
    assert parsed.model_dump(mode="json") == doc
    assert parsed.partitions[0].isr == [1] and parsed.partitions[0].adding == []
    doc["partitions"][0]["added_in_a_later_version"] = True
    assert admin_models.TopicDetail.model_validate(doc).partitions[0] == parsed.partitions[0]
