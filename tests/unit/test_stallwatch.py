"""The stall watch: every thread's stack when no Python thread ran for a while."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

from txnstream.stallwatch import StallWatch

PROGRAM = textwrap.dedent("""
    import sys, time
    from txnstream.stallwatch import StallWatch

    def hold_the_lock(seconds):
        # A C call holding the interpreter lock, as a librdkafka call that waits without
        # releasing it would: with a switch interval of 60 s no other thread runs.
        sys.setswitchinterval(60)
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            pass
        sys.setswitchinterval(0.005)

    def let_others_run(seconds):
        time.sleep(seconds)

    watch = StallWatch(stall_s={stall}, rearm_s=0.1).start()
    time.sleep(0.3)  # the watch thread is running
    {call}({seconds})
    watch.stop()
    print("done", flush=True)
""")


def run(call: str, stall: float, seconds: float) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", PROGRAM.format(call=call, stall=stall,
                                                                seconds=seconds)],
                          capture_output=True, text=True, timeout=60)


def test_a_stall_dumps_the_stack_of_the_thread_holding_the_lock():
    out = run("hold_the_lock", stall=1.0, seconds=2.5)
    assert out.returncode == 0 and "done" in out.stdout, out.stderr
    assert "Timeout (0:00:01)!" in out.stderr
    assert "hold_the_lock" in out.stderr  # the culprit's frame is named
    assert "stall-watch" in out.stderr or "_run" in out.stderr  # every thread is dumped


def test_threads_that_keep_running_dump_nothing():
    # twice the stall, and 1.4 s of slack for the re-arming thread on a loaded machine
    out = run("let_others_run", stall=1.5, seconds=3.0)
    assert out.returncode == 0 and "done" in out.stdout, out.stderr
    assert "Timeout" not in out.stderr and "Thread 0x" not in out.stderr


def test_a_stall_shorter_than_the_rearm_interval_is_refused():
    with pytest.raises(ValueError, match="stall_s must exceed rearm_s"):
        StallWatch(stall_s=0.5, rearm_s=1.0)
