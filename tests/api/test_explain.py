"""GET /v1/explain: the breakdown and levers over HTTP, with the core's errors."""

from __future__ import annotations

import pytest

QUERY = {"model": "tiny-bert", "seq_len": 64, "gpu_memory": "1GiB", "batch_size": 16}


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


@pytest.mark.parametrize(("changes", "status", "text"), [
    ({"model": "no-such-model"}, 404, "unknown model 'no-such-model'"),
    ({"seq_len": 1024}, 422, "sequence length 1024 exceeds max_position_embeddings=128 of tiny-bert"),
    ({"mode": "fp8"}, 422, "unknown mode 'fp8'"),
])
def test_bad_input(client, changes, status, text):
    response = client.get("/v1/explain", params=QUERY | changes)
    assert response.status_code == status and text in response.json()["detail"]
