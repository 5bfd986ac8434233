"""Bad input, limits and auth: the status and the exact detail a client sees.

The runner here has no lanes, so accepted runs stay queued and no worker starts: these tests
are about the request path only.
"""

from __future__ import annotations

import json
import sqlite3

import pytest
from fastapi.testclient import TestClient

from api.main import create_app
from api.runs.runner import LocalRunner
from api.settings import Settings
from autotune.workload.models import PRESETS

TINY = {"model": "tiny-bert", "seq_lens": [32, 64], "modes": ["fp32"], "gpu_memory": "1GiB",
        "max_batch": 64, "backend": "estimate"}
TOKEN = "s3cret-token"


@pytest.fixture
def client(make_client):  # make_client: tests/conftest.py
    return make_client()


def post(client, **changes):
    body = {k: v for k, v in (TINY | changes).items() if v is not None}
    return client.post("/v1/tables", json=body)


def detail(response, status):
    assert response.status_code == status, response.text
    return response.json()["detail"]


def test_unknown_model_is_404_listing_the_presets(client):
    text = detail(post(client, model="no-such-model"), 404)
    assert text.startswith("unknown model 'no-such-model': not a built-in preset, a local config, or a "
                           "reachable Hugging Face hub id")
    assert f"Presets: {', '.join(sorted(PRESETS, key=str.lower))}" in text


@pytest.mark.parametrize(("model", "brief"), [
    ("bert-bsae-uncased", "unknown model 'bert-bsae-uncased': did you mean bert-base-uncased?"),
    # Looked for on the hub (conftest: offline): why the hub was not asked stays in the detail.
    ("someone/not-a-cached-model", "unknown model 'someone/not-a-cached-model': not a built-in preset, a "
                                   "local config, or a reachable Hugging Face hub id"),
])
def test_unknown_model_has_a_brief_for_the_form_without_the_presets_or_the_hub(client, model, brief):
    body = post(client, model=model).json()
    assert body["errors"][0] == {"field": "model", "detail": body["detail"], "brief": brief}
    assert "Presets: " in body["detail"]  # the API's detail still lists them


def test_sequence_beyond_the_model_limit_is_422_naming_the_limit(client):
    assert detail(post(client, seq_lens=[64, 256]), 422) == (
        "sequence length 256 exceeds max_position_embeddings=128 of tiny-bert")


def test_a_refusal_says_its_kind_and_a_step_the_card_cannot_run_is_a_job_that_fails(client):
    # autotune/errors.py: "job fails" where the real stack refuses the step (flash-attn on a T4)
    params = {"model": "tiny-llama", "seq_len": 32, "batch_size": 1, "mode": "amp", "gpu": "T4",
              "attn": "flash_attention_2", "backend": "estimate"}
    check = client.get("/v1/check", params=params)
    assert check.status_code == 422 and check.json()["kind"] == "job fails", check.text
    assert post(client, seq_lens=[64, 256]).json()["kind"] == "invalid"


@pytest.mark.parametrize("size", ["12 bananas", "GiB", "-1GiB", "0"])
def test_malformed_gpu_memory_is_422(client, size):
    text = detail(post(client, gpu_memory=size), 422)
    assert text.startswith("invalid memory size '") and size in text


@pytest.mark.parametrize(("changes", "expected"), [
    ({"gpu": "T5", "gpu_memory": None}, "unknown GPU 'T5': use one of T4, "),
    ({"gpu": "T4", "gpu_memory": "20GiB"},
     "GPU memory 20 GiB is more than the 14.56 GiB of T4: give at most its size, or another GPU"),
    ({"gpu": "T4", "multiprocessors": 46},
     "give either gpu (T4 has its own multiprocessors) or multiprocessors, not both"),
    ({"alloc_conf": "expandable:True"}, "unknown allocator setting 'expandable' (PyTorch refuses it too)"),
    ({"multiprocessors": "46 SMs"},
     "multiprocessors '46 SMs': give the chip's multiprocessor count, e.g. 46"),
    ({"modes": ["fp64"]},
     "unknown mode 'fp64': allowed modes are fp32, amp, bf16, ckpt, amp+ckpt, bf16+ckpt"),
    ({"task": "translation"}, "unknown task 'translation': use one of sequence-classification, "),
    ({"backend": "tpu"}, "unknown backend 'tpu': allowed are auto, cuda, estimate"),
    ({"search": "random"}, "unknown search 'random': allowed are guided, bisect"),
    ({"optimizer": "lion"}, "unknown optimizer 'lion': allowed are adamw_torch_fused, adamw_torch, "
                            "adafactor, adamw_bnb_8bit, paged_adamw_8bit, paged_adamw_32bit, sgd"),
    ({"attn": "flash"}, "unknown attention 'flash': allowed are sdpa, eager, flash_attention_2"),
    ({"dtype": "int8"}, "unknown dtype 'int8': allowed are auto, float32, bfloat16, float16"),
    ({"loss": "chunky"}, "unknown loss 'chunky': allowed are full, chunked, cce, chunked_nll"),
    ({"loss": "chunked"}, "loss 'chunked' needs a per-token language-model head"),
    ({"margin": 1.5}, "margin 1.5 is out of range: use a fraction in [0, 1), e.g. 0.05"),
    ({"seq_lens": []}, "seq_lens is empty: give at least one sequence length, e.g. [128, 256]"),
    ({"seq_lens": [0]}, "sequence length must be an integer >= 1, got 0"),
    ({"max_batch": 0}, "max_batch must be an integer >= 1, got 0"),
    ({"gpu_memory": "256MiB"}, "GPU memory 256 MiB is too small: the CUDA context alone takes about 512 MiB"),
])
def test_invalid_fields_are_422_naming_what_is_allowed(client, changes, expected):
    assert detail(post(client, **changes), 422).startswith(expected)


def test_cuda_on_a_server_without_a_gpu_is_503(client):
    assert detail(post(client, backend="cuda"), 503) == (
        "backend 'cuda' needs a CUDA GPU, and this server has none: use backend 'estimate' (or auto)")


def test_malformed_json_and_unknown_fields_are_422_from_validation(client):
    response = client.post("/v1/tables", content=b"{not json", headers={"content-type": "application/json"})
    assert response.status_code == 422 and response.json()["detail"][0]["type"] == "json_invalid"
    errors = detail(post(client, seq_len=[128]), 422)
    assert errors[0]["type"] == "extra_forbidden" and errors[0]["loc"] == ["body", "seq_len"]
    errors = detail(post(client, seq_lens=["64"]), 422)
    assert errors[0]["loc"] == ["body", "seq_lens", 0]
    assert detail(post(client, model=None), 422)[0]["loc"] == ["body", "model"]


# --- limits ----------------------------------------------------------------------------


def test_limits_on_cells_batch_and_sequence_length(make_client):
    client = make_client(max_cells=4, max_batch=128, max_seq_len=100)
    assert detail(post(client, seq_lens=[16, 32, 48], modes=["fp32", "amp"]), 422) == (
        "3 sequence lengths x 2 modes = 6 cells exceeds this server's limit of 4 cells per request "
        "(AUTOTUNE_MAX_CELLS)")
    assert detail(post(client, max_batch=129), 422) == (
        "max_batch 129 exceeds this server's limit of 128 (AUTOTUNE_MAX_BATCH)")
    assert detail(post(client, seq_lens=[101]), 422) == (
        "sequence length 101 exceeds this server's limit of 100 tokens (AUTOTUNE_MAX_SEQ_LEN)")
    assert post(client, seq_lens=[16, 32], modes=["fp32", "amp"], max_batch=None).status_code == 202


def test_a_body_over_the_size_limit_is_413(make_client):
    client = make_client(max_body_bytes=256)
    big = json.dumps(TINY | {"model": "x" * 300}).encode()
    response = client.post("/v1/tables", content=big, headers={"content-type": "application/json"})
    assert detail(response, 413) == (
        f"request body of {len(big)} bytes exceeds this server's limit of 256 bytes "
        "(AUTOTUNE_MAX_BODY_BYTES)")

    def chunks():  # no Content-Length: counted as it streams in
        yield big[:200]
        yield big[200:]

    response = client.post("/v1/tables", content=chunks(), headers={"content-type": "application/json"})
    assert detail(response, 413) == (
        "request body of more than 256 bytes exceeds this server's limit of 256 bytes "
        "(AUTOTUNE_MAX_BODY_BYTES)")
    assert post(client).status_code == 202  # a normal body passes


# --- model names: no remote code, local paths only inside AUTOTUNE_MODEL_DIRS ------------------


@pytest.mark.parametrize("name", ["../../etc/passwd", "models/../../secret", "/models/../etc"])
def test_model_names_that_climb_directories_are_403(client, name):
    assert detail(post(client, model=name), 403) == (
        f"model name '{name}' contains '..': paths that leave a directory are refused")


@pytest.mark.parametrize("name", ["/etc", "./config.json", "~/model", "a/b/c", "config.json"])
def test_local_paths_are_403_when_no_model_dirs_are_set(client, name):
    assert detail(post(client, model=name), 403) == (
        f"model '{name}' is a local path, and this server reads no local models (AUTOTUNE_MODEL_DIRS is "
        "empty): use a preset or a Hugging Face hub id")


def _write_config(directory, model_type="bert"):
    directory.mkdir(parents=True)
    config = {"model_type": model_type, "hidden_size": 32, "num_hidden_layers": 2, "num_attention_heads": 2,
              "intermediate_size": 64, "vocab_size": 128, "max_position_embeddings": 64}
    (directory / "config.json").write_text(json.dumps(config))
    return directory


def test_local_models_are_read_only_inside_model_dirs(make_client, tmp_path):
    allowed = tmp_path / "models"
    inside = _write_config(allowed / "my-bert")
    outside = _write_config(tmp_path / "elsewhere" / "other-bert")
    (allowed / "link").symlink_to(outside)
    client = make_client(model_dirs=(allowed,))
    resolved = allowed.resolve()

    accepted = post(client, model=str(inside))
    assert accepted.status_code == 202
    table = client.get(accepted.json()["url"]).json()
    assert table["model"] == str(inside) and table["status"] == "queued"
    assert detail(post(client, model=str(inside), seq_lens=[65]), 422) == (
        f"sequence length 65 exceeds max_position_embeddings=64 of {inside}")
    assert detail(post(client, model=str(outside)), 403) == (
        f"local model path '{outside}' is outside the allowed directories: {resolved}")
    # A symlink inside that leads outside is judged by where it leads.
    assert detail(post(client, model=str(allowed / "link")), 403) == (
        f"local model path '{allowed / 'link'}' is outside the allowed directories: {resolved}")
    assert detail(post(client, model="./models/my-bert"), 403) == (
        f"local model path './models/my-bert' must be absolute, inside {resolved}")
    assert detail(post(client, model=str(allowed / "missing")), 404).startswith(
        f"unknown model '{allowed / 'missing'}'")


def test_one_local_model_spelled_several_ways_is_one_run(make_client, tmp_path):
    # Issue #37 (7b): ./ok, //ok, ok/ and ok/config.json made four runs of one model.
    allowed = tmp_path / "models"
    inside = _write_config(allowed / "ok")
    client = make_client(model_dirs=(allowed,))
    spellings = [str(inside), f"{allowed}/./ok", f"/{inside}", f"{inside}/", f"{inside}/config.json",
                 f"{allowed}//ok/./config.json"]
    answers = [post(client, model=name) for name in spellings]
    assert [a.status_code for a in answers] == [202] * len(spellings), [a.text for a in answers]
    assert len({a.json()["id"] for a in answers}) == 1
    assert [a.json()["created"] for a in answers] == [True] + [False] * (len(spellings) - 1)
    assert client.get(answers[0].json()["url"]).json()["model"] == str(inside)
    assert client.get("/v1/tables", params={"model": str(inside)}).json()["count"] == 1


def test_a_config_that_needs_remote_code_is_refused(make_client, tmp_path):
    allowed = tmp_path / "models"
    custom = _write_config(allowed / "custom", model_type="my-custom-arch")
    client = make_client(model_dirs=(allowed,))
    text = detail(post(client, model=str(custom)), 404)
    assert "model_type 'my-custom-arch' is not built into transformers" in text
    assert "autotune does not run remote code (trust_remote_code is off)" in text


def test_a_hub_id_not_in_the_offline_cache_is_404(make_client):
    # conftest sets HF_HUB_OFFLINE=1: only the local cache is searched.
    text = detail(post(make_client(), model="someone/not-a-cached-model"), 404)
    assert "offline: only the local Hugging Face cache was searched" in text


def test_hub_ids_can_be_turned_off(make_client):
    text = detail(post(make_client(allow_hub=False), model="someone/model"), 404)
    assert text.startswith("unknown model 'someone/model': not a built-in preset")


# --- auth --------------------------------------------------------------------------------------


def test_without_a_token_writes_are_open(client):
    response = post(client)
    assert response.status_code == 202
    assert client.delete(response.json()["url"]).status_code == 200


def test_with_a_token_writes_need_it_and_reads_do_not(make_client):
    client = make_client(api_token=TOKEN)
    assert detail(post(client), 401) == (
        "this server requires an API token for writes: send 'Authorization: Bearer <token>'")
    missing = post(client)
    assert missing.headers["www-authenticate"] == "Bearer"
    wrong = client.post("/v1/tables", json=TINY, headers={"Authorization": "Bearer guess"})
    assert detail(wrong, 401) == (
        "invalid API token: send 'Authorization: Bearer <token>' with the server's AUTOTUNE_API_TOKEN")
    basic = client.post("/v1/tables", json=TINY, headers={"Authorization": f"Basic {TOKEN}"})
    assert basic.status_code == 401
    # The token is checked before the body: no hint about what a valid body is.
    assert post(client, model=None).status_code == 401

    auth = {"Authorization": f"Bearer {TOKEN}"}
    accepted = client.post("/v1/tables", json=TINY, headers=auth)
    assert accepted.status_code == 202
    url = accepted.json()["url"]
    assert client.get(url).status_code == 200  # reads are open
    assert client.get("/v1/tables").status_code == 200
    assert client.get("/v1/health").status_code == 200
    assert client.delete(url).status_code == 401
    assert client.delete(url, headers=auth).json()["status"] == "cancelled"


# --- reading and cancelling ----------------------------------------------------------------------


def test_an_unknown_run_is_404(client):
    assert detail(client.get("/v1/tables/nope"), 404) == "no table run with id 'nope'"
    assert detail(client.delete("/v1/tables/nope"), 404) == "no table run with id 'nope'"


def test_list_parameters_are_validated(client):
    assert client.get("/v1/tables", params={"status": "bogus"}).status_code == 422
    assert client.get("/v1/tables", params={"limit": 0}).status_code == 422
    assert client.get("/v1/tables", params={"limit": 101}).status_code == 422
    assert client.get("/v1/tables", params={"offset": -1}).status_code == 422


def test_list_filters_by_model_alias_gpu_and_status(client):
    bert = post(client, model="bert-base-uncased", seq_lens=[128], gpu="t4", gpu_memory=None).json()
    tiny = post(client).json()
    client.delete(tiny["url"])

    def ids(**params):
        return [t["id"] for t in client.get("/v1/tables", params=params).json()["data"]]

    assert ids() == [tiny["id"], bert["id"]]
    assert ids(model="google-bert/bert-base-uncased") == [bert["id"]]
    assert ids(gpu="T4") == [bert["id"]]
    assert ids(gpu="custom 1 GiB") == [tiny["id"]]
    assert ids(status="cancelled") == [tiny["id"]]
    assert ids(status="queued", model="tiny-bert") == []
    page = client.get("/v1/tables", params={"limit": 1, "offset": 1}).json()
    assert page["count"] == 2 and [t["id"] for t in page["data"]] == [bert["id"]]


def test_a_cancelled_queued_run_does_not_answer_a_new_identical_request(client):
    first = post(client).json()
    cancelled = client.delete(first["url"]).json()
    assert cancelled["status"] == "cancelled" and cancelled["error"] == "cancelled by request"
    again = post(client)
    assert again.status_code == 202 and again.json()["created"] and again.json()["id"] != first["id"]


def test_a_queued_run_does_not_resume_on_a_changed_environment(make_client, tmp_path):
    runner = LocalRunner(estimate_workers=0, gpu_lanes=[])
    # The server stops with the run still queued.
    with TestClient(create_app(Settings(db=tmp_path / "errors.db"), runner=runner),
                    base_url="http://localhost") as first:
        queued = post(first).json()
    conn = sqlite3.connect(tmp_path / "errors.db")
    spec = json.loads(conn.execute("SELECT spec FROM runs WHERE id = ?", (queued["id"],)).fetchone()[0])
    spec["environment"]["torch"] = "2.4.0"  # as if torch was upgraded meanwhile
    conn.execute("UPDATE runs SET spec = ? WHERE id = ?", (json.dumps(spec), queued["id"]))
    conn.commit()
    conn.close()
    second = make_client(db=tmp_path / "errors.db")
    table = second.get(f"/v1/tables/{queued['id']}").json()
    assert table["status"] == "failed"
    assert table["error"].startswith(
        "the server's environment changed since the run was queued (torch 2.4.0 -> ")
    assert table["error"].endswith("): ask again for a table measured on one environment")
    assert post(second).json()["created"]  # the same request now measures on this environment


class BrokenRunner(LocalRunner):
    def describe(self):
        raise RuntimeError("a bug")


def test_an_internal_error_is_json_too(tmp_path):
    runner = BrokenRunner(estimate_workers=0, gpu_lanes=[])
    app = create_app(Settings(db=tmp_path / "broken.db"), runner=runner)
    with TestClient(app, base_url="http://localhost", raise_server_exceptions=False) as client:
        response = client.get("/v1/health")
    assert detail(response, 500) == "internal server error (RuntimeError)"


# --- errors name the request's fields, never the CLI's flags ---------------------------------------


def test_errors_name_the_fields_of_the_request_never_the_clis_flags(make_client):
    # autotune/request.py words an error with fields ({lora_r}); only the CLI says them as flags.
    client = make_client(allow_hub=False)
    answers = [
        post(client, lora_r=8),
        post(client, task="translation", load_in_4bit=True, bnb_4bit_quant_type="fp4", gpu="T4"),
        post(client, model="someone/model"),  # the library's hint for a hub id names --hub
        client.get("/v1/check", params={"model": "tiny-bert", "seq_len": 32, "batch_size": 1, "lora_r": 8}),
        client.get("/v1/explain", params={"model": "tiny-bert", "seq_len": 32, "load_in_4bit": "true"}),
    ]
    first = answers[0].json()
    assert (answers[0].status_code, first["field"], first["detail"]) == (
        422, "lora_r", "lora_r needs peft lora or peft qlora")
    for response in answers:
        assert response.status_code in (404, 422), response.text
        body = response.json()
        details = [body["detail"], *(error["detail"] for error in body.get("errors", []))]
        assert not any("--" in text for text in details), details
