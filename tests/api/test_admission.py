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
