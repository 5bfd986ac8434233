"""The service's request models are made from the request's fields (autotune/request.py): a field
declared there is a property of the table body and a parameter of the check and explain queries,
with its help as its description; the service adds its own forms, defaults and bounds."""

from __future__ import annotations

from dataclasses import dataclass

import pytest
from pydantic import ValidationError

from api.schemas import ADDED, MODEL, CheckQuery, ExplainQuery, TableCreate, request_model
from autotune.request import CheckRequest, ExplainRequest, TableRequest, fields_of, option


@dataclass(frozen=True)
class Probe:
    """A request of four fields, one the service does not take."""

    model: str = option(None, "the model")
    seq_len: int = option(None, "sequence length")
    warmup_steps: int = option(2, "steps before the one measured", metavar="N")
    compiled: bool = option(False, "torch.compile the step")
    trace_dir: str | None = option(None, "where to write a trace", http=False)


def test_a_new_field_is_a_property_of_the_body_and_a_parameter_of_the_query():
    body, query = request_model(Probe, "body"), request_model(Probe, "query")
    assert list(body.model_fields) == list(query.model_fields) == ["model", "seq_len", "warmup_steps",
                                                                   "compiled"]
    assert body.model_fields["warmup_steps"].description == "steps before the one measured"
    # A body: every field but the required optional (None: normalize's default), integers strict.
    assert body(model="m", seq_len=1).model_dump() == {"model": "m", "seq_len": 1, "warmup_steps": None,
                                                       "compiled": None}
    with pytest.raises(ValidationError, match="warmup_steps"):
        body(model="m", seq_len=1, warmup_steps="3")
    # A query: text, read as the field's type; the field's own default; the service's bounds.
    assert query(model="m", seq_len="64", warmup_steps="3").model_dump() == {
        "model": "m", "seq_len": 64, "warmup_steps": 3, "compiled": False}
    with pytest.raises(ValidationError, match="greater than or equal to 1"):
        query(model="m", seq_len="0")  # QUERY_LIMITS["seq_len"]
    with pytest.raises(ValidationError, match="model"):
        query(seq_len=64)  # required: typed without None, and None by default


@pytest.mark.parametrize(("model", "cls", "own"), [
    (TableCreate, TableRequest, {"model": MODEL["body"]}),
    (CheckQuery, CheckRequest, {"model": MODEL["query"]}),
    (ExplainQuery, ExplainRequest, {"model": MODEL["query"], "seq_len": "sequence length of the step, in "
                                    "tokens", "batch_size": "default: the cell's max batch"}),
])
def test_each_field_is_described_by_its_help_but_where_the_service_has_its_own_words(model, cls, own):
    location = "body" if model is TableCreate else "query"
    for f in fields_of(cls):
        if f.name in model.model_fields:
            expected = own.get(f.name, f.about.help + ADDED.get((location, f.name), ""))
            assert model.model_fields[f.name].description == expected, f.name


def test_the_query_keeps_the_cells_defaults_and_leaves_the_steps_to_normalize():
    query = CheckQuery(model="tiny-bert", seq_len=64, batch_size=8).model_dump()
    assert (query["accumulation_steps"], query["load_in_4bit"]) == (1, False)
    # As in a table's body, None: the default normalize fills in (the server's backend among them;
    # the mode: the weights', schemas.mode_of).
    assert all(query[name] is None for name in ("mode", "dtype", "optimizer", "loss", "backend", "margin"))
    assert ExplainQuery(model="tiny-bert", seq_len=64).model_dump()["levers"] is True
    assert "backend" not in ExplainQuery.model_fields  # explain runs the estimator
