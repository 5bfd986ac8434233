"""At most N requests are handled at once and the rest wait in line, but /v1/health never waits, nor
do the heavy reads, which wait for an analysis worker instead."""

from __future__ import annotations

import asyncio

from api.admission import Admission


def scope(path: str) -> dict:
    return {"type": "http", "path": path, "method": "GET", "headers": []}


def test_health_is_answered_while_every_slot_is_taken_and_the_line_moves_after():
    async def scenario() -> list[str]:
        release = asyncio.Event()
        order: list[str] = []

        async def app(scope, receive, send):
            if scope["path"] == "/slow":
                await release.wait()
            order.append(scope["path"])

        admission = Admission(app, limit=1)

        async def nothing():
            return {"type": "http.request"}

        async def ignore(message):
            pass

        slow = asyncio.create_task(admission(scope("/slow"), nothing, ignore))
        await asyncio.sleep(0.01)  # /slow holds the one slot
        queued = asyncio.create_task(admission(scope("/v1/tables"), nothing, ignore))
        await asyncio.wait_for(admission(scope("/v1/health"), nothing, ignore), timeout=1.0)
        await asyncio.sleep(0.01)
        assert order == ["/v1/health"]  # /v1/tables still waits in line
        release.set()
        await asyncio.wait_for(asyncio.gather(slow, queued), timeout=1.0)
        return order

    assert asyncio.run(scenario()) == ["/v1/health", "/slow", "/v1/tables"]


def test_the_heavy_reads_do_not_hold_a_place_in_the_line():
    async def scenario() -> list[str]:
        release = asyncio.Event()
        order: list[str] = []

        async def app(scope, receive, send):
            if scope["path"] != "/v1/tables":
                await release.wait()  # waiting for an analysis worker
            order.append(scope["path"])

        admission = Admission(app, limit=1)

        async def nothing():
            return {"type": "http.request"}

        async def ignore(message):
            pass

        heavy = [asyncio.create_task(admission(scope(path), nothing, ignore))
                 for path in ("/v1/explain", "/v1/check", "/runs/abc/explain")]
        await asyncio.sleep(0.01)
        await asyncio.wait_for(admission(scope("/v1/tables"), nothing, ignore), timeout=1.0)
        release.set()
        await asyncio.gather(*heavy)
        return order

    assert asyncio.run(scenario())[0] == "/v1/tables"


def test_one_client_holds_at_most_its_share_of_the_line():
    # A client (its token, else its address) holds at most per_client places: another finds one.
    async def scenario() -> list[str]:
        release = asyncio.Event()
        order: list[str] = []

        async def app(scope, receive, send):
            if scope["path"] == "/greedy":
                await release.wait()
            order.append(scope["client"][0])

        admission = Admission(app, limit=4)

        async def nothing():
            return {"type": "http.request"}

        async def ignore(message):
            pass

        def request(path, address):
            return {**scope(path), "client": (address, 1234)}

        greedy = [asyncio.create_task(admission(request("/greedy", "10.0.0.1"), nothing, ignore))
                  for _ in range(6)]
        await asyncio.sleep(0.01)  # the greedy client holds its 3 places, its 3 others wait
        await asyncio.wait_for(admission(request("/v1/tables", "10.0.0.2"), nothing, ignore), timeout=1.0)
        release.set()
        await asyncio.wait_for(asyncio.gather(*greedy), timeout=1.0)
        assert admission._clients == {}  # nothing kept of a client once its requests are done
        return order

    assert asyncio.run(scenario())[0] == "10.0.0.2"


def test_a_slow_body_or_a_missing_token_holds_no_place_in_the_line(tmp_path):
    # Issue #37: the line (4 places) was taken before the body was read, and a body may take
    # AUTOTUNE_BODY_TIMEOUT_S: four clients sending one byte of a body at a time held the service.
    # Now the body is read before the line, and a write without the token is refused before it.
    import socket
    import time

    from liveserver import Server

    server = Server(tmp_path / "serve.db", tmp_path / "serve.log", AUTOTUNE_API_TOKEN="secret",
                    AUTOTUNE_BODY_TIMEOUT_S="60")
    slow = []
    try:
        for i in range(12):
            sock = socket.create_connection(("127.0.0.1", server.port))
            token = b"Authorization: Bearer secret\r\n" if i % 2 else b""  # half send no token
            sock.sendall(b"POST /v1/tables HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                         + token + b"Content-Length: 100\r\n\r\n{")
            slow.append(sock)
        time.sleep(0.5)
        started = time.monotonic()
        for _ in range(5):
            assert server.client.get("/v1/tables").status_code == 200
            assert server.client.get("/").status_code == 200
        assert time.monotonic() - started < 20  # seconds on a loaded machine; held for 60 s before
        refused = [sock for i, sock in enumerate(slow) if i % 2 == 0]
        for sock in refused:  # answered 401 at once, the body never read
            assert sock.recv(4096).startswith(b"HTTP/1.1 401 ")
    finally:
        for sock in slow:
            sock.close()
        server.stop()


def _greedy_scenario(admission_token, greedy_headers, other):
    """Six requests of a greedy client (10.0.0.1, with ``greedy_headers(i)``) held in the app, then
    ``other`` (address, headers): whether the other is served while they are held."""
    async def scenario() -> bool:
        release = asyncio.Event()

        async def app(scope, receive, send):
            if scope["path"] == "/greedy":
                await release.wait()

        admission = Admission(app, limit=4, token=admission_token)

        async def nothing():
            return {"type": "http.request"}

        async def ignore(message):
            pass

        def request(path, address, headers):
            return {**scope(path), "client": (address, 1234), "headers": headers}

        greedy = [asyncio.create_task(admission(request("/greedy", "10.0.0.1", greedy_headers(i)), nothing,
                                                ignore)) for i in range(6)]
        await asyncio.sleep(0.01)
        try:
            await asyncio.wait_for(admission(request("/v1/tables", *other), nothing, ignore), timeout=1.0)
            served = True
        except TimeoutError:
            served = False
        release.set()
        await asyncio.wait_for(asyncio.gather(*greedy), timeout=1.0)
        return served

    return asyncio.run(scenario())


def test_made_up_tokens_do_not_make_one_client_many():
    # Issue #37: the share was by the Authorization header as sent, so a client sending a different
    # made-up token with each request was that many clients and took every place.
    def made_up(i):
        return [(b"authorization", f"Bearer guess-{i}".encode())]

    assert _greedy_scenario(None, made_up, ("10.0.0.2", []))
    assert _greedy_scenario("secret", made_up, ("10.0.0.2", []))


def test_the_server_s_token_sets_a_client_apart_from_the_anonymous_requests_of_its_address():
    # Behind one address (a NAT, an office): the holder of the token keeps a place of its own.
    token = [(b"authorization", b"Bearer secret")]
    assert _greedy_scenario("secret", lambda i: [], ("10.0.0.1", token))
    assert not _greedy_scenario("secret", lambda i: [], ("10.0.0.1", []))  # the same client: it waits


def test_client_of_counts_only_the_server_s_token():
    from api.admission import client_of

    request = {"client": ("10.0.0.1", 5), "headers": [(b"authorization", b"Bearer secret")]}
    assert client_of(request) == "address 10.0.0.1"
    assert client_of(request, "secret") == "address 10.0.0.1 with the token"
    assert client_of(request, "other") == "address 10.0.0.1"
    assert client_of({"headers": []}) == "address unknown"


def test_a_write_without_the_token_is_401_whatever_its_body(make_client):
    # Issue #37 (7e): an unauthenticated POST was answered 422 (its body's errors) before 401.
    client = make_client(api_token="secret")
    for body in ({"content": b"not json"}, {"json": {}}, {"json": {"model": "tiny-bert", "seq_lens": "x"}},
                 {"content": b"x" * 100_000}):
        response = client.post("/v1/tables", **body)
        assert response.status_code == 401, response.text
        assert response.headers["www-authenticate"] == "Bearer"
    wrong = client.post("/v1/tables?force=maybe", json={}, headers={"Authorization": "Bearer guess"})
    assert wrong.status_code == 401 and "invalid API token" in wrong.json()["detail"]
    assert client.delete("/v1/tables/abc").status_code == 401
    authorised = client.post("/v1/tables", json={}, headers={"Authorization": "Bearer secret"})
    assert authorised.status_code == 422  # with the token, the body is read and checked
