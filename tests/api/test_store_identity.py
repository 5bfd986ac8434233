"""One server per database *file*: Store.claim() follows the file, whatever path reaches it.

A second server through a symlink ran the first one's run again; through a hard link each kept
its own -wal file for one database and runs were lost (issue #13). The claim is an flock on the
database file, and SQLite's own fcntl locks must not notice it.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from api.store import Store
from autotune.errors import StoreError

pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="the claim follows the file on Linux")

REPO = Path(__file__).resolve().parents[2]
SHARED_LOCK = (0x40000002, 510)  # SQLite's SHARED lock bytes of a database file (start, length), os_unix.c


def _create(store, key="k1"):
    return store.create_run(key=key, model="tiny-bert", gpu="T4", backend="estimate",
                            spec={"seq_lens": [32], "modes": ["fp32"]}, total=1)[0]


def _link(kind, target: Path, link: Path) -> Path:
    if kind == "symlink":
        link.symlink_to(target)
    else:
        os.link(target, link)
    return link


def _refusal(path: Path) -> str:
    return (f"another autotune server uses the database {path}: stop it, or give this one another database "
            "(--db or AUTOTUNE_DB)")


def _second_name(path: Path, other: Path) -> str:
    return (f"the database {path} has a second name, {other} (a hard link): each name keeps its own -wal "
            "file and runs would be lost; remove the link, or give this server another database (--db or "
            "AUTOTUNE_DB)")


def _refused(path: Path):
    return pytest.raises(StoreError, match=f"^{re.escape(_refusal(path))}$")


def _python(code: str, *args: str) -> subprocess.Popen[str]:
    return subprocess.Popen([sys.executable, "-c", textwrap.dedent(code), *args], cwd=REPO, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)


def _claim_elsewhere(path: Path) -> str:
    """What a second server process says when it claims ``path``: "claimed", or its StoreError.

    Another process, as a second server is: in one process SQLite shares its locks and its
    -shm between connections of one file, and refuses to open a hard link of an open database.
    """
    second = _python("""
        import sys
        from api.store import Store
        from autotune.errors import StoreError
        try:
            Store(sys.argv[1], claim=True).close()  # as a server opens it: claimed before SQLite
            print("claimed")
        except StoreError as exc:
            print(exc)
    """, str(path))
    out, err = second.communicate(timeout=60)
    assert second.returncode == 0, err
    return out.strip()


@pytest.mark.parametrize("kind", ["symlink", "hard link"])
def test_a_second_server_through_a_link_is_refused_and_the_first_keeps_working(tmp_path, kind):
    first = Store(tmp_path / "runs.db")
    first.claim()
    before = _create(first, "before")
    link = _link(kind, tmp_path / "runs.db", tmp_path / "other-name.db")
    if kind == "symlink":
        assert _claim_elsewhere(link) == _refusal(link)
        assert _claim_elsewhere(tmp_path / "runs.db") == _refusal(tmp_path / "runs.db")
    else:  # a file with two names is refused through either, before SQLite writes a -wal beside it
        assert _claim_elsewhere(link) == _second_name(link, tmp_path / "runs.db")
        assert _claim_elsewhere(tmp_path / "runs.db") == _second_name(tmp_path / "runs.db", link)
        assert not (tmp_path / "other-name.db-wal").exists()
    # The first server goes on writing and reading, and nothing it wrote is lost.
    after = _create(first, "after")
    first.mark_running(after.id, lane="estimate:0", worker_pid=None)
    first.finish_run(after.id, "done", elapsed_s=1.0)
    assert [r.id for r in first.list_runs()[0]] == [after.id, before.id]
    first.close()
    again = Store(tmp_path / "runs.db")
    assert again.counts()["done"] == 1 and again.get_run(before.id) == before
    again.close()


def test_a_second_store_of_this_process_through_a_symlink_is_refused(tmp_path):
    first = Store(tmp_path / "runs.db")
    first.claim()
    link = _link("symlink", tmp_path / "runs.db", tmp_path / "other-name.db")
    second = Store(link)
    with _refused(link):
        second.claim()
    second.close()
    first.close()


@pytest.mark.parametrize("kind", ["symlink", "hard link"])
def test_a_claim_released_by_close_can_be_taken_through_any_path(tmp_path, kind):
    first = Store(tmp_path / "runs.db")
    first.claim()
    link = _link(kind, tmp_path / "runs.db", tmp_path / "other-name.db")
    first.close()
    if kind == "hard link":  # never claimed through any name while it has two
        assert _claim_elsewhere(link) == _second_name(link, tmp_path / "runs.db")
        return
    assert _claim_elsewhere(link) == "claimed"
    again = Store(tmp_path / "runs.db")  # and in this process, which keeps the released descriptor
    again.claim()
    assert _claim_elsewhere(link) == _refusal(link)
    again.close()


def test_a_claimed_database_stays_usable_by_other_connections_and_processes(tmp_path):
    # The claim is an flock on the file SQLite fcntl-locks: on Linux the two kinds never meet.
    claimed = Store(tmp_path / "runs.db")
    claimed.claim()
    _create(claimed, "by the claimer")
    other = Store(tmp_path / "runs.db")  # another connection of this process, not a server
    _create(other, "by another store")
    writer = _python("""
        import sqlite3, sys
        conn = sqlite3.connect(sys.argv[1], timeout=5, isolation_level=None)
        conn.execute("BEGIN IMMEDIATE")
        conn.execute("UPDATE runs SET status = 'cancelled' WHERE key = 'by the claimer'")
        conn.execute("COMMIT")
        print(conn.execute("SELECT count(*) FROM runs").fetchone()[0])
    """, str(tmp_path / "runs.db"))
    out, err = writer.communicate(timeout=60)
    assert writer.returncode == 0, err
    assert out.strip() == "2"
    assert claimed.counts() == {"queued": 1, "running": 0, "done": 0, "failed": 0, "cancelled": 1}
    assert other.counts()["cancelled"] == 1
    other.close()
    claimed.close()


def test_a_claim_dies_with_its_process(tmp_path):
    Store(tmp_path / "runs.db").close()
    holder = _python("""
        import sys, time
        from api.store import Store
        store = Store(sys.argv[1])
        store.claim()
        print("claimed", flush=True)
        time.sleep(120)
    """, str(tmp_path / "runs.db"))
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "claimed", holder.stderr
        link = _link("symlink", tmp_path / "runs.db", tmp_path / "link.db")
        refused = Store(link)
        with _refused(link):
            refused.claim()
        refused.close()
    finally:
        holder.send_signal(signal.SIGKILL)  # no close(), no atexit: only the kernel lets go
        holder.communicate(timeout=30)
    store = Store(tmp_path / "link.db")
    store.claim()
    store.close()


def test_releasing_a_claim_leaves_the_sqlite_locks_of_other_connections(tmp_path):
    # Closing any descriptor of a file drops all the fcntl locks a process holds on it
    # (sqlite.org/howtocorrupt.html 2.2): close() must not close the claimed file's descriptor,
    # or another process could take the file from under this process's other connections.
    server = Store(tmp_path / "runs.db")
    server.claim()
    reader = Store(tmp_path / "runs.db")
    reader.counts()  # in WAL mode a connection holds a SHARED lock on the file while open
    server.close()
    probe = _python("""
        import fcntl, os, sys
        fd = os.open(sys.argv[1], os.O_RDWR)
        try:
            fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB, int(sys.argv[3]), int(sys.argv[2]))
        except OSError:
            print("held")
        else:
            print("free")
    """, str(tmp_path / "runs.db"), *map(str, SHARED_LOCK))
    out, err = probe.communicate(timeout=60)
    assert out.strip() == "held", err
    reader.close()



def test_a_hard_link_to_a_live_database_loses_nothing(tmp_path):
    # Issue #37: a second server through a hard link was refused only after Store() had set WAL
    # and migrated through it: a -wal beside the link, which the next open of the link replayed
    # over the real file, every run gone. Claimed before SQLite opens it, nothing is written.
    first = Store(tmp_path / "runs.db", claim=True)
    runs = [_create(first, f"run {i}") for i in range(3)]
    link = _link("hard link", tmp_path / "runs.db", tmp_path / "copy.db")
    assert _claim_elsewhere(link) == _second_name(link, tmp_path / "runs.db")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["copy.db", "runs.db", "runs.db-shm", "runs.db-wal"]
    _create(first, "after the refusal")
    first.close()
    os.unlink(link)
    again = Store(tmp_path / "runs.db", claim=True)
    assert [again.get_run(run.id) for run in runs] == runs and again.counts()["queued"] == 4
    again.close()
