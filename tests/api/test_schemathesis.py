"""The OpenAPI document against a real server, as the attack test of issue #13 used it: schemathesis
generates requests for every operation from the document (valid ones and invalid ones), and each
answer must be no 5xx, have a status the document lists and the body it declares, refuse the
write without the token, and come within RESPONSE_LIMIT_S.

The server is uvicorn in a thread on a loopback port, serving the real app on a temporary database
with a runner that has no lanes (an accepted table stays queued: no worker starts) and an API token,
which the calls send. A check or explain that gets past validation runs in the runner's one analysis
worker under a time limit of ANALYSIS_LIMIT_S, answered 503 when over: its answer is bounded too.
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
# A check or explain estimated on the spot (a worker starting alone takes seconds) is cut off here
# with a 503; every other answer reads the store or refuses the input.
ANALYSIS_LIMIT_S = 1.0
# Answers take milliseconds once the server is warm (the first model it resolves imports
# transformers' config classes, so the fixture resolves one first), an estimate at most
# ANALYSIS_LIMIT_S; 3 s leaves room for a loaded 2-core machine.
RESPONSE_LIMIT_S = 3.0
# Per operation, drawn afresh each run as an attacker would (a failure prints the request as a
# curl command to replay it); no example database is written into the checkout.
EXAMPLES = 100
CHECKS = [not_a_server_error, status_code_conformance, response_schema_conformance, ignored_auth]


@pytest.fixture(scope="module")
def server_url(tmp_path_factory):
    """The app under uvicorn on a free loopback port, for this module's tests."""
    app = create_app(Settings(db=tmp_path_factory.mktemp("schemathesis") / "api.db", api_token=TOKEN),
                     runner=LocalRunner(estimate_workers=0, gpu_lanes=[], analysis_workers=1,
                                        analysis_timeout_s=ANALYSIS_LIMIT_S))
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
schema = schemathesis.openapi.from_dict(create_app(Settings(db=Path("unused.db"))).openapi())


@schema.parametrize()
@settings(max_examples=EXAMPLES, deadline=None, database=None)
def test_no_operation_answers_a_server_error_or_slowly(case, server_url):
    response = case.call_and_validate(base_url=server_url, headers=AUTH, checks=CHECKS)
    assert response.elapsed < RESPONSE_LIMIT_S, f"{case.method} {case.path}: {response.elapsed:.2f} s"
