"""GET /v1/explain: the breakdown and levers over HTTP, with the core's errors."""

from __future__ import annotations

from dataclasses import fields

import pytest

from api.schemas import (
    BreakdownPublic,
    ExplainLeverPublic,
    ExplainPublic,
    ExplainRiskPublic,
    FlagPublic,
    ModuleActivationsPublic,
    ModuleParamsPublic,
)
from autotune.analysis.explain import Breakdown, Explanation, Flag, ModuleActivations, ModuleParams
from autotune.analysis.risks import Risk

# 640 MiB: max batch 150, its searches settled over a tenth of it (on 1 GiB ten times as many replays)
QUERY = {"model": "tiny-bert", "seq_len": 64, "gpu_memory": "640MiB", "batch_size": 16}


@pytest.fixture
def client(idle_client):
    return idle_client


def test_explain_returns_a_breakdown_that_adds_up(client):
    doc = client.get("/v1/explain", params=QUERY | {"levers": "false"}).json()
    assert doc["model"] == "tiny-bert" and doc["batch_size"] == 16 and doc["fits"] is True
    assert doc["max_batch_size"] > 16 and doc["levers"] == []
    assert doc["top_parameters"][0]["name"]
    breakdown = doc["breakdown"]
    assert breakdown["peak_allocated_bytes"] > 0


def test_explain_with_levers(client):
    doc = client.get("/v1/explain", params=QUERY).json()
    assert len(doc["levers"]) >= 5


def test_the_answer_is_what_the_openapi_document_describes(client):
    # ExplainPublic and its parts: autotune.analysis.explain's dataclasses, their keys in order.
    for model, cls in ((ExplainPublic, Explanation), (BreakdownPublic, Breakdown), (FlagPublic, Flag),
                       (ModuleParamsPublic, ModuleParams), (ModuleActivationsPublic, ModuleActivations)):
        assert list(model.model_fields) == [f.name for f in fields(cls)], model.__name__
    doc = client.get("/v1/explain", params=QUERY).json()
    assert list(doc) == list(ExplainPublic.model_fields)
    assert list(doc["breakdown"]) == list(BreakdownPublic.model_fields)
    assert doc["levers"]
    assert all(list(lever) == list(ExplainLeverPublic.model_fields) for lever in doc["levers"])
    assert [field.name for field in fields(Risk)] == list(ExplainRiskPublic.model_fields)
    assert doc["risks"]  # with the levers
    assert all(list(risk) == list(ExplainRiskPublic.model_fields) for risk in doc["risks"])
    document = client.get("/openapi.json").json()
    response = document["paths"]["/v1/explain"]["get"]["responses"]["200"]["content"]["application/json"]
    assert response["schema"] == {"$ref": "#/components/schemas/ExplainPublic"}


@pytest.mark.parametrize(("changes", "status", "text"), [
    ({"model": "no-such-model"}, 404, "unknown model 'no-such-model'"),
    ({"seq_len": 1024}, 422, "sequence length 1024 exceeds max_position_embeddings=128 of tiny-bert"),
    ({"mode": "fp8"}, 422, "unknown mode 'fp8'"),
])
def test_bad_input(client, changes, status, text):
    response = client.get("/v1/explain", params=QUERY | changes)
    assert response.status_code == status and text in response.json()["detail"]
