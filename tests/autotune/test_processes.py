"""processes.Child, the parent's side of every worker (probe, parallel, run, analysis), with scripted
children: replies with a deadline, the end of its output, its stderr's tail, and its group killed."""

from __future__ import annotations

import sys
import textwrap
import time

import pytest

from autotune.processes import STDERR_TAIL_LINES, Child, exit_reason


def python(script: str) -> list[str]:
    return [sys.executable, "-c", textwrap.dedent(script)]


def alive(pid: int) -> bool:
    """Running: a zombie (dead, waiting for whoever adopted it to reap it) is not."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rpartition(")")[2].split()[0] != "Z"
    except FileNotFoundError:
        return False


def test_a_reply_that_does_not_come_in_time_is_a_timeout_then_the_lines_and_the_end():
    child = Child(python("""
        import sys, time
        line = sys.stdin.readline()
        time.sleep(0.5)
        print("got " + line.strip(), flush=True)
    """))
    assert child.send("ping\n")
    with pytest.raises(TimeoutError):
        child.reply(0.05)
    assert child.reply(10) == "got ping\n"
    assert child.reply(10) is None  # it exited: the end of its output
    assert child.wait() == 0
    child.close()


def test_a_child_that_is_gone_takes_no_request_and_says_how_it_died():
    child = Child(python("import sys; sys.stderr.write('boom\\n'); sys.exit(3)"))
    assert list(child.replies()) == []
    assert exit_reason(child.wait()) == "exited with code 3"
    assert not child.send("x" * 100_000 + "\n")  # a broken pipe, not an exception
    assert child.stderr_tail() == ["boom\n"]
    child.close()


def test_the_stderr_tail_keeps_the_last_lines():
    child = Child(python(f"""
        import sys
        for i in range({STDERR_TAIL_LINES + 10}):
            sys.stderr.write(f"line {{i}}\\n")
    """))
    child.wait()
    tail = child.stderr_tail()
    assert len(tail) == STDERR_TAIL_LINES and tail[-1] == f"line {STDERR_TAIL_LINES + 9}\n"
    child.close()


def test_stop_closes_stdin_and_kills_a_child_that_does_not_exit():
    child = Child(python("import time; time.sleep(60)"))
    started = time.monotonic()
    assert child.stop(grace_s=0.2) == -9  # SIGKILL after the grace
    assert time.monotonic() - started < 10


def test_a_child_with_its_own_group_is_killed_with_the_processes_it_started():
    child = Child(python("""
        import subprocess, sys, time
        grandchild = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
        print(grandchild.pid, flush=True)
        time.sleep(60)
    """), own_group=True)
    grandchild = int(child.reply(30) or 0)
    child.kill()
    assert exit_reason(child.wait()) == "was killed by signal SIGKILL"
    child.close()
    deadline = time.monotonic() + 10
    while alive(grandchild) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not alive(grandchild)


def test_close_kills_the_orphans_of_a_child_that_exited():
    child = Child(python("""
        import subprocess, sys
        grandchild = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"],
                                      stdout=subprocess.DEVNULL)
        print(grandchild.pid, flush=True)
    """), own_group=True)
    grandchild = int(child.reply(30) or 0)
    assert child.wait() == 0 and alive(grandchild)
    child.close()
    deadline = time.monotonic() + 10
    while alive(grandchild) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not alive(grandchild)
