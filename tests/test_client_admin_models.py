"""The SDK stands without the controller package: importing any client module loads no
`controller` module. The admin API's answers (common/api_models.py, one set of models for
the controller and the client) are read leniently: a field a newer controller adds is
ignored, while the published schemas still describe this version's answers exactly."""
from __future__ import annotations

import pkgutil
import subprocess
import sys
from pathlib import Path

import dataplane.client
from common import api_models
from controller.api import openapi_document

ROOT = Path(__file__).resolve().parent.parent


def test_client_modules_import_nothing_from_controller():
    modules = sorted(f"dataplane.client.{m.name}" for m in pkgutil.iter_modules(dataplane.client.__path__))
    assert "dataplane.client.admin" in modules and "dataplane.client.producer" in modules
    code = ("import sys, importlib\n"
            f"for name in {modules!r}:\n"
            "    importlib.import_module(name)\n"
            "from dataplane.client import AdminClient\n"
            "bad = sorted(m for m in sys.modules if m == 'controller' or m.startswith('controller.'))\n"
            "print(','.join(bad))\n")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "", f"client imports pulled in: {out.stdout.strip()}"


def test_a_controller_answer_parses_and_a_newer_field_is_ignored():
    detail = api_models.TopicDetail(
        name="t", topic_id="abc", metadata_offset=7, config={"partitions": 2},
        partitions=[api_models.PartitionView(topic="t", partition=0, replicas=[1, 2], isr=[1],
                                             leader=1, leader_epoch=3, partition_epoch=4)])
    doc = detail.model_dump(mode="json")
    parsed = api_models.TopicDetail.model_validate(doc)
    assert parsed == detail and parsed.partitions[0].adding == []
    doc["added_in_a_later_version"] = 1
    doc["partitions"][0]["added_in_a_later_version"] = True
    assert api_models.TopicDetail.model_validate(doc) == detail


def test_published_answer_schemas_stay_closed():
    """Lenient reading does not leak into the OpenAPI document: every answer schema still says
    additionalProperties: false, as its first key."""
    schemas = openapi_document()["components"]["schemas"]
    answers = [name for name in schemas if isinstance(getattr(api_models, name, None), type)]
    assert {"Health", "TopicDetail", "PartitionView", "ErrorBody"} <= set(answers)
    for name in answers:
        assert next(iter(schemas[name].items())) == ("additionalProperties", False), name
