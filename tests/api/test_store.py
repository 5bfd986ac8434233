"""The SQLite store: migrations, the run lifecycle, dedupe under concurrency, one server per file."""

from __future__ import annotations

import sqlite3
import threading

import pytest

from api.store import ACTIVE, MIGRATIONS, Store
from autotune.errors import StoreError


@pytest.fixture
def store(tmp_path):
    s = Store(tmp_path / "runs.db")
    yield s
    s.close()


def _create(store, key="k1", **overrides):
    fields = dict(key=key, model="tiny-bert", gpu="T4", backend="estimate",
                  spec={"seq_lens": [32, 64], "modes": ["fp32"], "task": "masked-lm"}, total=2)
    return store.create_run(**(fields | overrides))


def _cell(mode="fp32", seq_len=32, max_batch_size=8):
    return {"seq_len": seq_len, "mode": mode, "max_batch_size": max_batch_size, "probes": 2, "probe_log": []}


def test_migrations_are_applied_in_order_once_and_recorded(tmp_path):
    first = Store(tmp_path / "m.db")
    assert first.migrations() == [(i, name) for i, (name, _) in enumerate(MIGRATIONS, start=1)]
    first.close()
    again = Store(tmp_path / "m.db")
    assert again.migrate() == []  # nothing left to apply
    again.close()


def test_database_is_in_wal_mode(store):
    conn = sqlite3.connect(store.path)
    assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    conn.close()


def test_a_database_from_a_newer_version_is_refused(tmp_path):
    Store(tmp_path / "new.db").close()
    conn = sqlite3.connect(tmp_path / "new.db")
    conn.execute("INSERT INTO _migrations VALUES (99, 'from the future', '2099')")
    conn.commit()
    conn.close()
    with pytest.raises(StoreError, match="made by a newer version"):
        Store(tmp_path / "new.db")


def test_identical_key_reuses_the_run_until_it_fails_or_is_cancelled(store):
    run, created = _create(store)
    assert created and run.status == "queued" and run.done == 0 and run.total == 2
    assert _create(store) == (run, False)
    store.cancel_run(run.id)
    second, created = _create(store)
    assert created and second.id != run.id
    store.mark_running(second.id, lane="estimate:0", worker_pid=None)
    store.finish_run(second.id, "failed", error="boom")
    third, created = _create(store)
    assert created and third.id not in (run.id, second.id)


def test_force_skips_a_finished_run_but_joins_one_in_progress(store):
    run, _ = _create(store)
    assert _create(store, reuse=ACTIVE) == (run, False)  # still queued: same measurement
    store.mark_running(run.id, lane="estimate:0", worker_pid=1)
    store.finish_run(run.id, "done", elapsed_s=1.0)
    fresh, created = _create(store, reuse=ACTIVE)
    assert created and fresh.id != run.id
    # Without force, the newest run of the key answers.
    assert _create(store)[0].id == fresh.id


def test_identical_requests_at_once_create_exactly_one_run(tmp_path):
    # Two stores on one file are two connections, as two server threads or processes would be.
    stores = [Store(tmp_path / "race.db") for _ in range(2)]
    barrier = threading.Barrier(8)
    results = []

    def create(s):
        barrier.wait()
        results.append(_create(s))

    threads = [threading.Thread(target=create, args=(stores[i % 2],)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=30)
    assert len(results) == 8
    assert len({run.id for run, _ in results}) == 1
    assert sum(created for _, created in results) == 1
    for s in stores:
        s.close()


def test_cells_are_recorded_only_while_running_and_never_overwritten(store):
    run, _ = _create(store)
    assert not store.add_cell(run.id, 0, _cell())  # queued: not yet
    assert store.mark_running(run.id, lane="estimate:0", worker_pid=123)
    assert store.add_cell(run.id, 0, _cell(max_batch_size=8))
    assert not store.add_cell(run.id, 0, _cell(max_batch_size=99))  # a resumed run reports it again
    assert store.cells(run.id) == [_cell(max_batch_size=8)]
    assert store.get_run(run.id).done == 1
    store.cancel_run(run.id)
    assert not store.add_cell(run.id, 1, _cell(seq_len=64))
    assert store.get_run(run.id).status == "cancelled" and store.get_run(run.id).done == 1


def test_interrupted_runs_are_requeued_with_their_cells(store):
    run, _ = _create(store)
    store.mark_running(run.id, lane="cuda:0", worker_pid=42)
    store.add_cell(run.id, 0, _cell())
    assert store.requeue_interrupted() == [run.id]
    again = store.get_run(run.id)
    assert again.status == "queued" and again.done == 1 and again.worker_pid is None and again.attempts == 1
    assert [r.id for r in store.queued_runs()] == [run.id]
    store.mark_running(run.id, lane="cuda:0", worker_pid=43)
    assert store.get_run(run.id).attempts == 2


def test_finished_runs_do_not_change(store):
    run, _ = _create(store)
    store.mark_running(run.id, lane="estimate:0", worker_pid=None)
    assert store.finish_run(run.id, "done", elapsed_s=2.5)
    assert not store.finish_run(run.id, "failed", error="late")
    assert store.cancel_run(run.id).status == "done"
    assert not store.mark_running(run.id, lane="estimate:0", worker_pid=None)
    with pytest.raises(ValueError, match="done or failed"):
        store.finish_run(run.id, "cancelled")


def test_list_is_newest_first_filtered_and_paginated(store):
    ids = [_create(store, key=f"k{i}", model="tiny-bert" if i % 2 else "gpt2",
                   gpu="T4" if i < 3 else "A100-80GB")[0].id for i in range(5)]
    runs, count = store.list_runs(limit=2)
    assert count == 5 and [r.id for r in runs] == ids[::-1][:2]
    runs, count = store.list_runs(limit=2, offset=4)
    assert count == 5 and [r.id for r in runs] == [ids[0]]
    runs, count = store.list_runs(model="TINY-BERT")
    assert count == 2 and [r.id for r in runs] == [ids[3], ids[1]]
    runs, count = store.list_runs(gpu="t4", model="gpt2")
    assert [r.id for r in runs] == [ids[2], ids[0]]
    store.cancel_run(ids[4])
    assert [r.id for r in store.list_runs(status="cancelled")[0]] == [ids[4]]
    assert store.counts() == {"queued": 4, "running": 0, "done": 0, "failed": 0, "cancelled": 1}


def test_a_second_server_cannot_claim_the_database(tmp_path):
    first = Store(tmp_path / "one.db")
    first.claim()
    second = Store(tmp_path / "one.db")
    with pytest.raises(StoreError, match="another autotune server uses the database"):
        second.claim()
    first.close()
    second.claim()  # released with the first
    second.close()
