"""The OpenAPI document against a real server, as the attack test of issue #13 used it: schemathesis
generates requests for every operation from the document (valid ones and invalid ones), and each
answer must be no 5xx, have a status the document lists and the body it declares, refuse the
write without the token, and come within RESPONSE_LIMIT_S.

The server is uvicorn in a thread on a loopback port, serving the real app on a temporary database
with a runner that has no lanes (an accepted table stays queued: no worker starts) and an API token,
which the calls send. GET /v1/check and /v1/explain are left out: a cell no stored table covers runs
the estimator, seconds of CPU per example; they are fuzzed once those reads run in the bounded
analysis workers whose time limit (AUTOTUNE_ANALYSIS_TIMEOUT_S) bounds their answers.
"""

from __future__ import annotations

import socket
import threading
import time
from pathlib import Path

import httpx
import pytest
import schemathesis
import uvicorn
from hypothesis import settings
from schemathesis.checks import (
    ignored_auth,
    not_a_server_error,
    response_schema_conformance,
    status_code_conformance,
)

from api.main import create_app
from api.runs.runner import LocalRunner
from api.settings import Settings

TOKEN = "schemathesis-token"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
TINY = {"model": "tiny-bert", "seq_lens": [32], "modes": ["fp32"], "gpu_memory": "1GiB",
        "backend": "estimate"}
# Every operation fuzzed here reads the store or refuses the input; none runs the estimator. They
# take milliseconds once the server is warm (the first model it resolves imports transformers'
# config classes, so the fixture resolves one first); 2 s leaves room for a loaded 2-core machine.
RESPONSE_LIMIT_S = 2.0
# Per operation, drawn afresh each run as an attacker would (a failure prints the request as a
# curl command to replay it); no example database is written into the checkout.
EXAMPLES = 100
# The reads that run the estimator when no stored table covers the cell (see the module's text).
ESTIMATING = r"^/v1/(check|explain)$"
CHECKS = [not_a_server_error, status_code_conformance, response_schema_conformance, ignored_auth]


@pytest.fixture(scope="module")
def server_url(tmp_path_factory):
    """The app under uvicorn on a free loopback port, for this module's tests."""
    app = create_app(Settings(db=tmp_path_factory.mktemp("schemathesis") / "api.db", api_token=TOKEN),
                     runner=LocalRunner(estimate_workers=0, gpu_lanes=[]))
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))  # bound here: no other process can take the port in between
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning"))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    deadline = time.monotonic() + 60
    while not server.started:
        assert thread.is_alive() and time.monotonic() < deadline, "uvicorn did not start"
        time.sleep(0.05)
    url = f"http://127.0.0.1:{sock.getsockname()[1]}"
    warm = httpx.post(f"{url}/v1/tables", json=TINY, headers=AUTH, timeout=60)
    assert warm.status_code == 202, warm.text
    yield url
    server.should_exit = True
    thread.join(timeout=30)
    sock.close()


# The document the server serves, made by the same code at import (building the app reads no
# database: that happens at its startup), so that pytest sees one test per operation.
schema = schemathesis.openapi.from_dict(create_app(Settings(db=Path("unused.db"))).openapi()).exclude(
    path_regex=ESTIMATING)


@schema.parametrize()
@settings(max_examples=EXAMPLES, deadline=None, database=None)
def test_no_operation_answers_a_server_error_or_slowly(case, server_url):
    response = case.call_and_validate(base_url=server_url, headers=AUTH, checks=CHECKS)
    assert response.elapsed < RESPONSE_LIMIT_S, f"{case.method} {case.path}: {response.elapsed:.2f} s"
