"""What the API refuses before any work, found by an attack test (schemathesis over the OpenAPI
document, issue #13): numbers beyond what handles them, empty modes, several wrong fields at once,
foreign Host headers, requests with no security scheme in the document, and bodies that stall.

Each is answered with a 4xx naming the field and what is allowed, never a 500 or a hang.
"""

from __future__ import annotations

import asyncio
import socket
import time

import pytest
from liveserver import Server

from api.hosts import LOOPBACK_HOSTS, host_of, with_host
from api.main import create_app
from api.settings import Settings
from autotune.errors import InvalidInput

TINY = {"model": "tiny-bert", "seq_lens": [32, 64], "modes": ["fp32"], "gpu_memory": "1GiB",
        "max_batch": 64, "backend": "estimate"}
CELL = {"model": "tiny-bert", "seq_len": 32, "batch_size": 1, "gpu_memory": "1GiB"}
SQLITE_MAX = 2**63 - 1
ALL_MODES = "fp32, amp, bf16, ckpt, amp+ckpt, bf16+ckpt"


@pytest.fixture
def client(make_client):  # make_client: tests/conftest.py
    return make_client()


def post(client, **changes):
    body = {k: v for k, v in (TINY | changes).items() if v is not None}
    return client.post("/v1/tables", json=body)


def only_error(response, loc):
    """The one pydantic error of a 422, which must be about ``loc``."""
    assert response.status_code == 422, response.text
    [error] = response.json()["detail"]
    assert error["loc"] == loc
    return error["msg"]


# --- numbers within what handles them ----------------------------------------------------------


@pytest.mark.parametrize("path", ["/v1/tables", "/", "/runs"])
def test_an_offset_beyond_sqlites_integers_is_422_naming_the_bound(client, path):
    assert only_error(client.get(path, params={"offset": SQLITE_MAX + 1}), ["query", "offset"]) == (
        f"Input should be less than or equal to {SQLITE_MAX}")
    assert client.get(path, params={"offset": SQLITE_MAX}).status_code == 200  # an empty page


@pytest.mark.parametrize("path", ["/v1/check", "/v1/explain"])
def test_a_batch_size_beyond_the_documented_maximum_is_422(client, path):
    response = client.get(path, params=CELL | {"batch_size": 2**62})
    assert only_error(response, ["query", "batch_size"]) == "Input should be less than or equal to 1048576"


def test_accumulation_steps_have_the_same_maximum(client):
    response = client.get("/v1/check", params=CELL | {"accumulation_steps": 2**62})
    assert only_error(response, ["query", "accumulation_steps"]) == (
        "Input should be less than or equal to 1048576")


@pytest.mark.parametrize(("size", "shown"), [
    ("5TiB", "5 TiB"),
    (2**70, "1073741824 TiB"),
    (10**400, "1" + "0" * 39 + "..."),  # beyond a float: the start of what was sent
])
def test_gpu_memory_beyond_4_tib_is_422(client, size, shown):
    response = post(client, gpu_memory=size)
    assert response.status_code == 422, response.text
    assert response.json()["detail"] == (
        f"GPU memory {shown} is too large: at most 4 TiB (the largest cards today have 288 GB)")
    assert response.json()["field"] == "gpu_memory"
    assert post(client, gpu_memory="4TiB").status_code == 202


def test_gpu_memory_of_a_check_has_the_same_bound(client):
    response = client.get("/v1/check", params=CELL | {"gpu_memory": "5TiB"})
    assert response.status_code == 422 and response.json()["field"] == "gpu_memory"


# --- empty modes ---------------------------------------------------------------------------------


@pytest.mark.parametrize("modes", [[], "", " "])
def test_empty_modes_are_refused_as_empty_seq_lens_are(client, modes):
    response = post(client, modes=modes)
    assert response.status_code == 422, response.text
    assert response.json()["detail"] == f"modes is empty: give at least one of {ALL_MODES}"
    assert response.json()["field"] == "modes"


def test_modes_left_out_are_the_defaults(client):
    accepted = post(client, modes=None, seq_lens=[32])
    assert accepted.status_code == 202
    assert client.get(accepted.json()["url"]).json()["modes"] == ["fp32", "amp", "ckpt", "amp+ckpt"]


# --- every invalid field at once -----------------------------------------------------------------


def test_every_invalid_field_of_a_table_request_is_reported(client):
    response = post(client, task="translation", modes=["fp64"], gpu_memory="12 bananas", seq_lens=[64, 256])
    assert response.status_code == 422
    body = response.json()
    # The first found stays the detail, as when it is the only one.
    assert body["detail"].startswith("unknown task 'translation': use one of sequence-classification")
    assert body["field"] == "task"
    assert [e["field"] for e in body["errors"]] == ["task", "modes", "gpu_memory", "seq_lens"]
    assert body["errors"][0]["detail"] == body["detail"]
    assert body["errors"][1]["detail"] == f"unknown mode 'fp64': allowed modes are {ALL_MODES}"
    assert body["errors"][2]["detail"].startswith("invalid memory size '12 bananas'")
    assert body["errors"][3]["detail"] == (
        "sequence length 256 exceeds max_position_embeddings=128 of tiny-bert")


def test_a_single_invalid_field_is_listed_too(client):
    body = post(client, search="random").json()
    assert body["errors"] == [{"field": "search", "detail": body["detail"]}]


def test_the_status_is_the_first_errors(client):
    response = post(client, model="../secret", modes=["fp64"], max_batch=0)
    assert response.status_code == 403
    assert [e["field"] for e in response.json()["errors"]] == ["model", "modes", "max_batch"]
    # The model is resolved after the fields checked on their own: its 404 comes after them.
    response = post(client, model="no-such-model", modes=["fp64"])
    assert response.status_code == 422
    assert [e["field"] for e in response.json()["errors"]] == ["modes", "model"]


def test_checks_that_need_a_valid_field_wait_for_it(client):
    # The sequence lengths are checked against the model only once it resolved; the cells only
    # once the modes are valid.
    response = post(client, model="no-such-model", seq_lens=[4096], modes=["fp64"])
    assert [e["field"] for e in response.json()["errors"]] == ["modes", "model"]


def test_a_checks_errors_name_its_query_parameters(client):
    response = client.get("/v1/check", params=CELL | {"mode": "fp64", "seq_len": 4096})
    assert response.status_code == 422
    errors = response.json()["errors"]
    assert [e["field"] for e in errors] == ["mode", "seq_len"]
    assert errors[1]["detail"] == "sequence length 4096 exceeds max_position_embeddings=128 of tiny-bert"


def test_the_shape_of_a_request_lists_every_error_too(client):
    # pydantic's own 422 (FastAPI's format): one entry per wrong field, with its location.
    response = post(client, seq_lens=["x"], max_batch="many", seq_len=[1])
    assert response.status_code == 422
    locs = [e["loc"] for e in response.json()["detail"]]
    assert ["body", "seq_lens", 0] in locs and ["body", "max_batch"] in locs and ["body", "seq_len"] in locs


# --- Host: only the names the server is reached by -----------------------------------------------


def test_a_request_for_another_host_is_400(client):
    before = client.get("/v1/tables").json()["count"]
    response = client.post("/v1/tables", json=TINY, headers={"host": "attacker.example:8000"})
    assert response.status_code == 400
    assert response.json() == {"detail": "host 'attacker.example:8000' is not one this server answers to: "
                                         "name it in the server's AUTOTUNE_ALLOWED_HOSTS"}
    assert client.get("/v1/tables").json()["count"] == before  # nothing was queued
    assert client.get("/v1/health", headers={"host": "attacker.example"}).status_code == 400


def test_starlettes_default_test_host_is_not_allowed(make_client):
    assert make_client(base_url="http://testserver").get("/v1/health").status_code == 400


@pytest.mark.parametrize("host", ["localhost", "LOCALHOST:8000", "127.0.0.1:8000", "[::1]:8000", "[::1]"])
def test_loopback_names_are_allowed_and_echoed_in_urls(client, host):
    response = client.post("/v1/tables", json=TINY, headers={"host": host})
    assert response.status_code in (200, 202), response.text
    assert response.json()["url"].startswith(f"http://{host}/v1/tables/")
    assert response.headers["location"] == response.json()["url"]


def test_allowed_hosts_are_a_setting_with_domain_wildcards(make_client):
    client = make_client(allowed_hosts=("gpu-box.internal", "*.corp.example"))

    def status(host):
        return client.get("/v1/health", headers={"host": host}).status_code

    assert status("GPU-Box.internal:8000") == 200 and status("gpu-box.internal.") == 200
    assert status("api.corp.example") == 200 and status("corp.example") == 400
    assert status("localhost") == 200 and status("127.0.0.1:8000") == 200  # loopback: always answered
    assert status("rebind.attacker.example") == 400
    anyone = make_client(allowed_hosts=("*",))
    assert anyone.get("/v1/health", headers={"host": "any.where"}).status_code == 200


def test_allowed_hosts_from_the_environment():
    settings = Settings.from_env({"AUTOTUNE_ALLOWED_HOSTS": " GPU-Box.internal, [::1],*.corp.example "})
    assert settings.allowed_hosts == ("gpu-box.internal", "::1", "*.corp.example")
    assert Settings.from_env({"AUTOTUNE_ALLOWED_HOSTS": " "}).allowed_hosts == LOOPBACK_HOSTS
    assert Settings().allowed_hosts == ("localhost", "127.0.0.1", "::1")
    with pytest.raises(InvalidInput, match=r"^AUTOTUNE_ALLOWED_HOSTS='localhost,http://gpu-box:8000': "
                                           r"'http://gpu-box:8000' is not a host name: use host names or IP "
                                           r"addresses without scheme or port"):
        Settings.from_env({"AUTOTUNE_ALLOWED_HOSTS": "localhost,http://gpu-box:8000"})


def test_serve_allows_the_address_it_binds_to():
    assert with_host(LOOPBACK_HOSTS, "192.0.2.7") == (*LOOPBACK_HOSTS, "192.0.2.7")
    assert with_host(LOOPBACK_HOSTS, "[2001:db8::1]") == (*LOOPBACK_HOSTS, "2001:db8::1")
    assert with_host(LOOPBACK_HOSTS, "127.0.0.1") == LOOPBACK_HOSTS
    for wildcard in ("0.0.0.0", "::"):  # no client names the server so
        assert with_host(LOOPBACK_HOSTS, wildcard) == LOOPBACK_HOSTS


@pytest.mark.parametrize(("header", "host"), [
    ("localhost", "localhost"), ("Example.COM:80", "example.com"), ("[::1]:8000", "::1"),
    ("[::1", None), ("example.com:http", None), ("", None), ("[::1]x", None),
])
def test_host_of_a_host_header(header, host):
    assert host_of(header) == host


# --- the raw ASGI path: no Host, a stalled body ---------------------------------------------------


def asgi_call(app, headers, receive, timeout_s=5.0):
    """One POST /v1/tables straight into the app: (status, headers, body, seconds taken)."""
    scope = {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": "POST",
             "scheme": "http", "path": "/v1/tables", "raw_path": b"/v1/tables", "query_string": b"",
             "root_path": "", "headers": headers, "client": ("127.0.0.1", 50000),
             "server": ("127.0.0.1", 8000)}
    sent = []

    async def send(message):
        sent.append(message)

    async def run():
        await asyncio.wait_for(app(scope, receive, send), timeout_s)  # a hang fails, not blocks

    start = time.monotonic()
    asyncio.run(run())
    elapsed = time.monotonic() - start
    [head] = [m for m in sent if m["type"] == "http.response.start"]
    body = b"".join(m.get("body", b"") for m in sent if m["type"] == "http.response.body")
    return head["status"], {k.decode(): v.decode() for k, v in head["headers"]}, body, elapsed


def stalling_receive(first=b'{"model": "tiny-'):
    """A client that sends the start of its body and then nothing, never leaving."""
    messages = [{"type": "http.request", "body": first, "more_body": True}]

    async def receive():
        if messages:
            return messages.pop()
        await asyncio.Event().wait()  # forever

    return receive


def test_a_body_that_stalls_is_408_after_the_timeout(tmp_path):
    app = create_app(Settings(db=tmp_path / "stall.db", body_timeout_s=0.3))
    headers = [(b"host", b"localhost"), (b"content-type", b"application/json"), (b"content-length", b"200")]
    status, sent_headers, body, elapsed = asgi_call(app, headers, stalling_receive())
    assert status == 408
    assert body == (b'{"detail": "the request body did not arrive within this server\'s limit of 0.3 s '
                    b'(AUTOTUNE_BODY_TIMEOUT_S): send the whole body at once"}')
    assert sent_headers["connection"] == "close"  # the rest of the body is never read
    assert 0.3 <= elapsed < 3


def test_a_request_without_a_host_header_is_400(tmp_path):
    app = create_app(Settings(db=tmp_path / "nohost.db"))
    status, _, body, _ = asgi_call(app, [(b"content-type", b"application/json")], stalling_receive())
    assert (status, body) == (400, b'{"detail":"the request has no Host header: HTTP/1.1 requires one"}')


def test_body_timeout_from_the_environment():
    assert Settings().body_timeout_s == 10.0
    assert Settings.from_env({"AUTOTUNE_BODY_TIMEOUT_S": " 2.5 "}).body_timeout_s == 2.5
    with pytest.raises(InvalidInput, match="^AUTOTUNE_BODY_TIMEOUT_S='0': Input should be greater than 0"):
        Settings.from_env({"AUTOTUNE_BODY_TIMEOUT_S": "0"})


@pytest.mark.slow
def test_a_real_server_answers_a_stalled_body_with_408(tmp_path):
    server = Server(tmp_path / "serve.db", tmp_path / "serve.log", AUTOTUNE_BODY_TIMEOUT_S="1")
    try:
        with socket.create_connection(("127.0.0.1", server.port), timeout=10) as sock:
            sock.sendall(b"POST /v1/tables HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                         b"Content-Length: 200\r\n\r\n{\"model\": ")
            start = time.monotonic()
            answer = b""
            while chunk := sock.recv(4096):  # the server closes the connection after its answer
                answer += chunk
            elapsed = time.monotonic() - start
    finally:
        server.stop()
    assert answer.startswith(b"HTTP/1.1 408 ")
    assert b"AUTOTUNE_BODY_TIMEOUT_S" in answer
    assert 1 <= elapsed < 5


# --- the OpenAPI document --------------------------------------------------------------------------


def test_the_openapi_document_declares_the_bearer_scheme_of_writes(client):
    document = client.get("/openapi.json").json()
    assert document["components"]["securitySchemes"]["HTTPBearer"] == {
        "type": "http", "scheme": "bearer",
        "description": "AUTOTUNE_API_TOKEN: writes (POST, DELETE) need it when the server sets one; "
                       "reads are open"}
    paths = document["paths"]
    assert paths["/v1/tables"]["post"]["security"] == [{"HTTPBearer": []}]
    assert paths["/v1/tables/{table_id}"]["delete"]["security"] == [{"HTTPBearer": []}]
    assert "security" not in paths["/v1/tables"]["get"]
    assert "security" not in paths["/v1/tables/{table_id}"]["get"]


# --- preference trainers (issue 36) ----------------------------------------------------------------


@pytest.mark.parametrize("changes", [{"precompute_ref_log_probs": True}, {"kto_loss_type": "kto"},
                                     {"num_generations": 4}])
def test_a_trainer_s_setting_without_its_trainer_is_refused_naming_it_never_answered_as_sft(client, changes):
    response = post(client, **changes)
    assert response.status_code == 422, response.text
    assert response.json()["field"] == next(iter(changes))
    assert "trainer sft has none" in response.json()["detail"]
    response = client.get("/v1/check", params=CELL | changes)
    assert response.status_code == 422 and response.json()["field"] == next(iter(changes))
    assert post(client, trainer="sft").status_code == 202
