"""The analysis pool with fake workers (no torch): bounded, timed, cached, shared, dropped when abandoned.

The fake worker answers an order after ``params["sleep_s"]`` with ``{"n": <orders it answered>}``,
writes its pid to ``params["dir"]/pid-<tag>`` when it takes an order, and refuses an order with
``params["refuse"]`` as InvalidInput (an expected refusal) or fails with ``params["fail"]``.
"""

from __future__ import annotations

import asyncio
import os
import sys
import textwrap
import time

import pytest

from api.runs.analysis import AnalysisOrder, AnalysisPool, ClientGone, run_analysis
from autotune.errors import AutotuneError, InvalidInput, Overloaded

FAKE_ANALYSIS_WORKER = textwrap.dedent("""
    import json, os, pathlib, sys, time
    answered = 0
    for line in sys.stdin:
        order = json.loads(line)
        params = order["params"]
        pathlib.Path(params["dir"], "pid-" + params["tag"]).write_text(str(os.getpid()))
        time.sleep(params.get("sleep_s", 0))
        answered += 1
        if "refuse" in params:
            reply = {"error_type": "InvalidInput", "error": params["refuse"], "field": "seq_len",
                     "expected": True}
        elif "fail" in params:
            reply = {"error_type": "ProbeError", "error": params["fail"], "field": None, "expected": False}
        else:
            reply = {"result": {"n": answered, "kind": order["kind"]}}
        print(json.dumps(reply), flush=True)
""")


@pytest.fixture
def make_pool(tmp_path):
    script = tmp_path / "fake_analysis_worker.py"
    script.write_text(FAKE_ANALYSIS_WORKER)
    pools = []

    def make(**kwargs):
        options = {"workers": 1, "timeout_s": 30, **kwargs}
        pool = AnalysisPool(command=[sys.executable, str(script)], **options)
        pools.append(pool)
        return pool

    yield make
    for pool in pools:
        pool.close()


def order(tmp_path, tag, kind="explain", **params):
    return AnalysisOrder(kind, {"model": "tiny-bert"}, {"dir": str(tmp_path), "tag": tag, **params})


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A killed child is a zombie until reaped; the pool reaps it, so poll briefly.
    return True


def wait_dead(pid: int, timeout_s: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while alive(pid):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.02)
    return True


def wait_file(path, timeout_s: float = 30.0) -> str:
    deadline = time.monotonic() + timeout_s
    while not path.exists() or not path.read_text():
        assert time.monotonic() < deadline, f"{path} never appeared"
        time.sleep(0.02)
    return path.read_text()


async def never_gone() -> bool:
    return False


def answer(pool, an_order):
    return asyncio.run(run_analysis(pool, an_order, never_gone))


def test_an_order_is_answered_by_a_worker_and_the_same_order_again_from_the_cache(make_pool, tmp_path):
    pool = make_pool()
    assert answer(pool, order(tmp_path, "a")) == {"n": 1, "kind": "explain"}
    started = time.monotonic()
    assert answer(pool, order(tmp_path, "a")) == {"n": 1, "kind": "explain"}  # not asked again: n stays 1
    assert time.monotonic() - started < 0.5
    assert answer(pool, order(tmp_path, "b")) == {"n": 2, "kind": "explain"}  # the same worker, kept warm
    assert pool.describe() == {"workers": 1, "busy": 0, "waiting": 0, "cached": 2}


def test_one_more_order_than_workers_is_refused_at_once_with_a_retry_after(make_pool, tmp_path):
    pool = make_pool(workers=1, timeout_s=20)
    slow = pool.analyze(order(tmp_path, "slow", sleep_s=5))
    started = time.monotonic()
    with pytest.raises(Overloaded, match="all 1 analysis workers of this server are busy") as refused:
        pool.analyze(order(tmp_path, "other"))
    assert time.monotonic() - started < 0.5
    assert 1 <= refused.value.retry_after_s <= 20
    slow.release()


def test_identical_orders_in_flight_share_one_worker(make_pool, tmp_path):
    pool = make_pool(workers=1)

    async def both():
        first = run_analysis(pool, order(tmp_path, "same", sleep_s=0.5), never_gone)
        second = run_analysis(pool, order(tmp_path, "same", sleep_s=0.5), never_gone)
        return await asyncio.gather(first, second)

    assert asyncio.run(both()) == [{"n": 1, "kind": "explain"}] * 2  # no 503 for the second: it joined


def test_an_order_past_the_time_limit_kills_its_worker_and_is_refused_at_once_when_asked_again(
        make_pool, tmp_path):
    pool = make_pool(timeout_s=1.0)
    started = time.monotonic()
    with pytest.raises(Overloaded, match="longer than this server's limit of 1 s") as refused:
        answer(pool, order(tmp_path, "hopeless", sleep_s=60))
    assert time.monotonic() - started < 5
    assert refused.value.retry_after_s > 1
    assert wait_dead(int((tmp_path / "pid-hopeless").read_text()))
    started = time.monotonic()
    with pytest.raises(Overloaded, match="limit of 1 s"):
        answer(pool, order(tmp_path, "hopeless", sleep_s=60))
    assert time.monotonic() - started < 0.5  # remembered: no second worker burnt on it
    assert answer(pool, order(tmp_path, "quick")) == {"n": 1, "kind": "explain"}  # a fresh worker


def test_an_order_whose_client_left_has_its_worker_killed_and_frees_the_slot(make_pool, tmp_path):
    pool = make_pool(workers=1)

    async def leave_after_a_moment() -> bool:
        return (tmp_path / "pid-left").exists()

    with pytest.raises(ClientGone):
        asyncio.run(run_analysis(pool, order(tmp_path, "left", sleep_s=60), leave_after_a_moment))
    assert wait_dead(int(wait_file(tmp_path / "pid-left")))
    deadline = time.monotonic() + 5
    while pool.describe()["busy"]:
        assert time.monotonic() < deadline
        time.sleep(0.02)
    assert answer(pool, order(tmp_path, "next")) == {"n": 1, "kind": "explain"}


def test_a_refusal_is_the_same_error_kind_and_cached_but_a_failure_is_not(make_pool, tmp_path):
    pool = make_pool()
    for _ in range(2):
        with pytest.raises(InvalidInput, match="seq_len 9999 exceeds") as refused:
            answer(pool, order(tmp_path, "r", refuse="seq_len 9999 exceeds 512"))
        assert refused.value.field == "seq_len"
    assert pool.describe()["cached"] == 1
    with pytest.raises(AutotuneError, match="probe broke"):
        answer(pool, order(tmp_path, "f", fail="probe broke"))
    assert pool.describe()["cached"] == 1


def test_a_worker_that_dies_fails_the_order_with_how_it_died_and_the_next_order_gets_a_new_one(
        make_pool, tmp_path):
    pool = make_pool(timeout_s=30)
    ticket = pool.analyze(order(tmp_path, "doomed", sleep_s=60))
    pid = int(wait_file(tmp_path / "pid-doomed"))
    os.kill(pid, 9)
    with pytest.raises(AutotuneError, match=f"analysis worker \\(pid {pid}\\) was killed by signal SIGKILL"):
        ticket.future.result(timeout=10)
    ticket.release()
    assert answer(pool, order(tmp_path, "after")) == {"n": 1, "kind": "explain"}


def test_a_refusal_whose_class_takes_more_than_a_message_keeps_its_kind():
    from api.runs.analysis import _error

    exc = _error({"error_type": "SequenceTooLong", "error": "sequence length 9999 exceeds 512",
                  "field": "seq_lens"})
    assert isinstance(exc, InvalidInput) and str(exc) == "sequence length 9999 exceeds 512"
    assert exc.field == "seq_lens"
    assert type(_error({"error_type": "NoSuchError", "error": "x"})) is AutotuneError


def test_a_worker_keeps_the_estimator_of_a_spec_so_the_next_batch_replays_its_traces(monkeypatch):
    """A check of the same spec at another batch (a sweep, CI's next job) traces nothing again."""
    from api.runs import analysis_worker
    from api.runs.spec import normalize
    from api.settings import Settings
    from autotune.backends.estimate.backend import EstimateBackend

    body = {"model": "tiny-bert", "seq_lens": [64], "modes": ["fp32"], "gpu_memory": "1GiB",
            "backend": "estimate"}
    spec = normalize(body, Settings(), lambda backend, gpu=None: {"backend": "estimate"}).to_json()
    traced = []
    original = EstimateBackend.trace

    def trace(self, *args, **kwargs):
        traced.append(args[-1])  # the batch size
        return original(self, *args, **kwargs)

    probed = []
    original_probe = EstimateBackend.probe

    def probe(self, *args, **kwargs):
        probed.append(args[4])  # the batch size
        return original_probe(self, *args, **kwargs)

    monkeypatch.setattr(EstimateBackend, "trace", trace)
    monkeypatch.setattr(EstimateBackend, "probe", probe)
    monkeypatch.setattr(analysis_worker, "_prepared", type(analysis_worker._prepared)())
    monkeypatch.setattr(analysis_worker, "_max_batch", type(analysis_worker._max_batch)())
    params = {"seq_len": 64, "mode": "fp32", "effective_batch": None}
    first = analysis_worker.check_order(spec, {**params, "batch_size": 8})
    assert traced and first["fits"] and len(probed) >= 2
    traced.clear()
    probed.clear()
    # The same cell at another batch: its max batch is kept, one probe of the kept traces answers.
    second = analysis_worker.check_order(spec, {**params, "batch_size": 9})
    assert traced == [] and probed == [9] and second["max_batch_size"] == first["max_batch_size"]
    assert second["peak_memory_bytes"] >= first["peak_memory_bytes"] and second["batch_size"] == 9
    probed.clear()
    too_many = analysis_worker.check_order(spec, {**params, "batch_size": first["max_batch_size"] + 1})
    assert too_many["fits"] is False and too_many["levers"] is not None
    # Another spec gets an estimator of its own; the oldest beyond SPECS_KEPT is dropped.
    for size in range(analysis_worker.SPECS_KEPT):
        other = {**spec, "margin": (size + 1) / 100}
        analysis_worker._prepare(other)
    assert len(analysis_worker._prepared) == analysis_worker.SPECS_KEPT


# --- a client's share of the workers (issue #37: one anonymous client took every heavy read) ---------


def test_a_client_holds_at_most_all_workers_but_one_and_another_finds_the_last(make_pool, tmp_path):
    pool = make_pool(workers=3, timeout_s=20)
    greedy = [pool.analyze(order(tmp_path, f"g{i}", sleep_s=5), "address 10.0.0.1") for i in range(2)]
    started = time.monotonic()
    with pytest.raises(Overloaded, match=r"2 of them with your requests, the most one client may hold \(2\)"):
        pool.analyze(order(tmp_path, "g2", sleep_s=5), "address 10.0.0.1")
    assert time.monotonic() - started < 0.5  # refused at once
    other = pool.analyze(order(tmp_path, "other"), "address 10.0.0.2")
    assert pool.describe()["busy"] == 3
    assert asyncio.run(other.result(never_gone)) == {"n": 1, "kind": "explain"}
    for ticket in [*greedy, other]:
        ticket.release()


def test_one_client_asking_one_order_after_another_takes_turns_with_another_client(make_pool, tmp_path):
    # The case: one worker; client A asks distinct orders one after another, so a worker
    # was never free when client B asked, and B got 503 every time. Now B waits for the worker A
    # frees and gets it before A's next order.
    pool = make_pool(workers=1, timeout_s=30)
    finished: list[str] = []

    async def greedy() -> None:
        for i in range(4):
            await run_analysis(pool, order(tmp_path, f"a{i}", sleep_s=1.0), never_gone, "address 10.0.0.1")
            finished.append(f"a{i}")

    async def other() -> dict:
        while not (tmp_path / "pid-a0").exists():  # A holds the worker
            await asyncio.sleep(0.02)
        answer = await run_analysis(pool, order(tmp_path, "b", sleep_s=0.4), never_gone, "address 10.0.0.2")
        finished.append("b")
        return answer

    async def both():
        return await asyncio.gather(greedy(), other())

    _, answer = asyncio.run(both())
    assert answer["kind"] == "explain"  # served, not 503
    # Right after A's order that held the worker (or the next, on a machine too loaded to ask in time).
    assert finished.index("b") <= 2, finished
    assert pool.describe()["waiting"] == 0


def test_an_order_waits_in_line_at_most_the_time_limit_and_one_per_client(make_pool, tmp_path):
    pool = make_pool(workers=1, timeout_s=1.5)
    running = pool.analyze(order(tmp_path, "long", sleep_s=60), "address 10.0.0.1")
    second = pool.analyze(order(tmp_path, "second", sleep_s=60), "address 10.0.0.2")
    third = pool.analyze(order(tmp_path, "third", sleep_s=60), "address 10.0.0.3")
    assert pool.describe()["waiting"] == 2
    with pytest.raises(Overloaded, match="another request of yours waits for one"):
        pool.analyze(order(tmp_path, "again", sleep_s=60), "address 10.0.0.3")
    started = time.monotonic()
    # "long" is killed at its limit and the worker goes to "second", the first in line; "third"
    # has then waited its limit for a worker: answered 503, not left waiting.
    with pytest.raises(Overloaded, match=r"stayed busy for \d+ s") as refused:
        asyncio.run(third.result(never_gone))
    assert time.monotonic() - started < 10 and refused.value.retry_after_s >= 1
    assert wait_file(tmp_path / "pid-second")
    assert pool.describe()["waiting"] == 0
    for ticket in (running, second, third):
        ticket.release()


def test_an_order_whose_client_left_while_in_line_leaves_the_line(make_pool, tmp_path):
    pool = make_pool(workers=1)
    running = pool.analyze(order(tmp_path, "slow", sleep_s=2), "address 10.0.0.1")

    async def gone() -> bool:
        return True

    with pytest.raises(ClientGone):
        asyncio.run(run_analysis(pool, order(tmp_path, "left", sleep_s=60), gone, "address 10.0.0.2"))
    assert pool.describe()["waiting"] == 0
    assert asyncio.run(running.result(never_gone))["kind"] == "explain"
    running.release()
    assert not (tmp_path / "pid-left").exists()  # it never took the worker
