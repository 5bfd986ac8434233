"""One request, declared once (autotune/request.py): the CLI's flags, the service's body and query
and the Python API's keywords are its fields; resolve finds every invalid one; errors name fields
and only the CLI words them as flags."""

from __future__ import annotations

import inspect

import pytest

import autotune
from autotune.cli import build_parser
from autotune.cli.common import worded
from autotune.errors import InvalidInput
from autotune.request import (
    CheckRequest,
    ExplainRequest,
    PeftOptions,
    Step,
    TableRequest,
    Target,
    fields_of,
    flag_names,
    request_from,
    resolve,
)


def http_fields(cls: type) -> set[str]:
    return {f.name for f in fields_of(cls) if f.about.http}


def cli_fields(cls: type) -> set[str]:
    return {f.name for f in fields_of(cls) if f.about.cli}


def test_the_table_body_has_the_table_request_fields():
    from api.schemas import TableCreate

    assert set(TableCreate.model_fields) == http_fields(TableRequest)


@pytest.mark.parametrize(("route", "cls", "apart"), [
    ("/v1/check", CheckRequest, set()),
    ("/v1/explain", ExplainRequest, {"backend"}),  # explain runs the estimator: no backend to choose
])
def test_the_query_of_check_and_explain_has_their_request_fields(route, cls, apart):
    from api.main import create_app

    parameters = create_app().openapi()["paths"][route]["get"]["parameters"]
    assert {p["name"] for p in parameters} == http_fields(cls) - apart


@pytest.mark.parametrize(("command", "cls"), [("table", TableRequest), ("check", CheckRequest),
                                               ("explain", ExplainRequest)])
def test_every_cli_field_is_a_flag_of_its_command_with_the_fields_choices(command, cls):
    parser = build_parser()
    sub = next(a for a in parser._actions if a.dest == "command").choices[command]  # type: ignore[union-attr]
    actions = {a.dest: a for a in sub._actions}
    for f in fields_of(cls):
        if not f.about.cli:
            continue
        action = actions[f.name]
        assert f.flag in action.option_strings
        if f.about.choices and not (command == "explain" and f.name == "backend"):
            assert tuple(action.choices) == f.about.choices  # type: ignore[arg-type]


def test_the_python_api_takes_every_field_as_a_keyword():
    # The step's fields once, as StepOptions (a TypedDict every function takes as **step); the
    # others in each signature.
    from autotune.public import StepOptions

    step = set(StepOptions.__annotations__)
    assert step == {f.name for f in fields_of(Step)} - {"model"} | {"adapter"}
    for function, cls in ((autotune.table, TableRequest), (autotune.check, CheckRequest),
                          (autotune.explain, ExplainRequest), (autotune.max_batch_size, None)):
        parameters = inspect.signature(function).parameters
        assert parameters["step"].kind is inspect.Parameter.VAR_KEYWORD, function.__name__
        if cls is not None:
            assert {f.name for f in fields_of(cls)} <= set(parameters) | step, function.__name__


def test_a_keyword_no_step_has_is_refused_by_name():
    with pytest.raises(TypeError, match="unexpected keyword argument 'lora_rank'"):
        autotune.max_batch_size("tiny-bert", seq_len=32, gpu_memory="1GiB", lora_rank=8)


def test_an_error_naming_fields_says_them_as_fields_and_the_cli_as_flags():
    with pytest.raises(InvalidInput) as caught:
        PeftOptions(lora_r=8, bnb_4bit_quant_type="fp4").adapter()
    assert str(caught.value) == "lora_r, bnb_4bit_quant_type need peft lora or peft qlora"
    assert caught.value.field == "lora_r"
    assert worded(caught.value) == "--lora-r, --bnb-4bit-quant-type need --peft lora or --peft qlora"
    assert flag_names()["model"] == "MODEL"


def test_an_error_without_fields_is_worded_as_it_is():
    exc = InvalidInput("unknown dtype 'x'")
    assert worded(exc) == str(exc) == "unknown dtype 'x'"


def test_resolve_finds_every_invalid_field_of_a_request():
    request = TableRequest(Step("tiny-bert", task="translation", dtype="int4", optimizer="lion"),
                           Target(gpu="T4", margin=1.5), seq_lens=[64], modes="fp32,turbo")
    with pytest.raises(InvalidInput) as caught:
        resolve(request)
    fields = [caught.value.field, *(e.field for e in caught.value.others)]
    assert fields == ["modes", "task", "dtype", "optimizer", "margin"]


def test_resolve_gives_the_workload_backend_and_cells():
    resolved = resolve(TableRequest(Step("tiny-llama", peft_options=PeftOptions(peft="lora", lora_r=4)),
                                    Target(gpu_memory="1GiB", backend="estimate"), seq_lens="64,128"))
    assert resolved.seq_lens == [64, 128] and [m.name for m in resolved.modes] == ["fp32", "amp", "ckpt",
                                                                                    "amp+ckpt"]
    assert resolved.workload.task == "causal-lm" and resolved.workload.adapter.r == 4
    assert resolved.backend.name == "estimate" and resolved.gpu.total_memory_bytes == 2**30


def test_a_check_request_names_what_is_missing():
    with pytest.raises(InvalidInput) as caught:
        resolve(CheckRequest(Step("tiny-bert"), Target(backend="estimate")))
    assert [caught.value.field, *(e.field for e in caught.value.others)] == ["seq_len", "batch_size"]
    assert worded(caught.value) == "missing --seq-len: the step's sequence length"


def test_flat_values_build_the_nested_request_and_unknown_names_are_a_bug():
    request = request_from(CheckRequest, {"model": "tiny-bert", "seq_len": 64, "batch_size": 2,
                                          "lora_r": 8, "gpu": "T4", "task": None})
    assert request == CheckRequest(Step("tiny-bert", peft_options=PeftOptions(lora_r=8)), Target(gpu="T4"),
                                   seq_len=64, batch_size=2)
    with pytest.raises(KeyError, match="lora_rank"):
        request_from(CheckRequest, {"lora_rank": 8})


@pytest.mark.parametrize(("model", "dtype", "table", "check"), [
    ("tiny-llama", "auto", ["fp32", "amp", "ckpt", "amp+ckpt"], "fp32"),  # float32 weights
    ("tiny-llama", "bfloat16", ["bf16", "bf16+ckpt"], "bf16"),
    ("tiny-llama", "float16", ["fp32", "ckpt"], "fp32"),  # GradScaler refuses float16 gradients
    ("meta-llama/Llama-3.2-1B", "auto", ["bf16", "bf16+ckpt"], "bf16"),  # its config says bfloat16
    ("meta-llama/Llama-3.2-1B", "float32", ["fp32", "amp", "ckpt", "amp+ckpt"], "fp32"),
])
def test_the_default_modes_follow_the_weights(model, dtype, table, check):
    target = Target(gpu_memory="1GiB", backend="estimate")
    resolved = resolve(TableRequest(Step(model, dtype=dtype), target, seq_lens=[64]))
    assert [m.name for m in resolved.modes] == table
    one = resolve(CheckRequest(Step(model, dtype=dtype), target, seq_len=64, batch_size=1))
    assert [m.name for m in one.modes] == [check]
    asked = resolve(TableRequest(Step(model, dtype=dtype), target, seq_lens=[64], modes="amp"))
    assert [m.name for m in asked.modes] == ["amp"]
