"""``IoLoop.call``: calls handed to the loop run in order, a failing one stops none after
it, and calls made while a run is scheduled join it (one wake-up of the loop, not one per
call). Pure logic: an asyncio loop in a thread, nothing else running."""

from __future__ import annotations

import threading
import time

from txnstream.coordinator.ioloop import IoLoop


def _wait(cond, seconds: float = 5.0) -> None:
    deadline = time.monotonic() + seconds
    while not cond():
        assert time.monotonic() < deadline, "the loop did not run the calls in time"
        time.sleep(0.005)


def test_calls_from_many_threads_run_each_once_in_each_threads_order():
    io = IoLoop("test-ioloop")
    got: list[tuple[int, int]] = []
    per_thread = 2_000

    def caller(t: int) -> None:
        for i in range(per_thread):
            io.call(got.append, (t, i))

    threads = [threading.Thread(target=caller, args=(t,)) for t in range(4)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    _wait(lambda: len(got) == 4 * per_thread)
    io.close()
    for t in range(4):
        assert [i for tt, i in got if tt == t] == list(range(per_thread)), \
            f"thread {t}'s calls ran out of order, twice or not at all"


def test_calls_made_while_a_run_is_scheduled_wake_the_loop_once():
    io = IoLoop("test-ioloop")
    release = threading.Event()
    wakes = []
    run_calls = io._run_calls

    def counted() -> None:
        wakes.append(1)
        run_calls()

    io._run_calls = counted  # type: ignore[method-assign]
    io.call(release.wait, 5)  # holds the loop while the next calls are made
    got: list[int] = []
    for i in range(500):
        io.call(got.append, i)
    release.set()
    _wait(lambda: len(got) == 500)
    io.close()
    assert got == list(range(500))
    assert len(wakes) <= 2, f"{len(wakes)} wake-ups of the loop for 501 calls"


def test_a_call_that_raises_is_reported_and_the_calls_after_it_still_run():
    io = IoLoop("test-ioloop")
    reported: list[dict] = []
    io.loop.set_exception_handler(lambda loop, ctx: reported.append(ctx))
    got: list[int] = []

    def boom() -> None:
        raise ValueError("boom")

    io.call(got.append, 1)
    io.call(boom)
    io.call(got.append, 2)
    _wait(lambda: len(got) == 2)
    io.close()
    assert got == [1, 2]
    assert [type(c["exception"]) for c in reported] == [ValueError]
    assert "boom" in reported[0]["message"]


def test_a_call_after_close_is_dropped_quietly():
    io = IoLoop("test-ioloop")
    io.close()
    assert io.loop.is_closed()
    got: list[int] = []
    io.call(got.append, 1)  # raises nothing: nothing is sent any more
    io.call(got.append, 2)
    time.sleep(0.05)
    assert got == [], "a call made after close ran"


def test_a_caller_that_never_pauses_does_not_keep_the_loop_from_its_other_work():
    """A run takes the calls made before it; those made meanwhile wait for the loop's
    next iteration. (c9ba3a5's run went on until none was left; it passed this too, as
    the GIL lets the loop catch up with one spinning thread: a guard, not a repro.)"""
    import asyncio

    io = IoLoop("test-ioloop")
    stop = threading.Event()

    def spin() -> None:
        while not stop.is_set():
            for _ in range(100):
                io.call(int)

    spinner = threading.Thread(target=spin)
    spinner.start()
    try:
        t0 = time.monotonic()
        for _ in range(5):
            io.run(asyncio.sleep(0), timeout=5)
        took = time.monotonic() - t0
    finally:
        stop.set()
        spinner.join()
        io.close()
    assert took < 2.0, f"5 coroutines waited {took:.2f} s behind another thread's calls"
