"""Stall-watch dumps in a worker's log, against the nemesis's pauses (pure logic)."""

from __future__ import annotations

from datetime import UTC, datetime

from chaos.stalls import find_stalls, unexplained


def at(hms: str) -> float:
    return datetime.strptime(f"2026-12-01 {hms}", "%Y-%m-%d %H:%M:%S").replace(
        tzinfo=UTC).timestamp()


LOG = """\
2026-12-01 02:14:07,100 INFO txnstream.coordinator.worker: serving tc 1
Timeout (0:00:05)!
Thread 0x00007f99b07e86c0 (most recent call first):
  File "/w/txnstream/coordinator/txn_log.py", line 175 in assigned
  File "/w/txnstream/kafka/fetch.py", line 83 in drain

Thread 0x00007f99b17ea6c0 (most recent call first):
  File "/usr/lib/python3.11/selectors.py", line 468 in select

%6|1796090912.644|FAIL|rdkafka#producer-7| [thrd:127.0.0.1:12843/3]: Disconnected
2026-12-01 02:14:19,000 INFO txnstream.coordinator.worker: tc 1 replayed
"""


def test_a_dump_is_found_with_the_times_around_it_and_the_first_threads_frames():
    (s,) = find_stalls(LOG)
    assert s.before == at("02:14:07") + 0.1
    assert s.after == 1796090912.644  # librdkafka's epoch seconds count too
    assert s.frames == ['File "/w/txnstream/coordinator/txn_log.py", line 175 in assigned',
                        'File "/w/txnstream/kafka/fetch.py", line 83 in drain']


def test_a_pause_ending_between_the_lines_around_a_dump_explains_it():
    log = LOG.replace("%6|1796090912.644|FAIL|rdkafka#producer-7| [thrd:127.0.0.1:12843/3]: "
                      "Disconnected\n", "")
    stalls = find_stalls(log)
    assert unexplained(stalls, [(at("02:14:08"), at("02:14:18"))]) == []
    # A pause of the same worker at another time, or none: the stall is unexplained.
    assert unexplained(stalls, [(at("02:20:00"), at("02:20:10"))]) == stalls
    assert unexplained(stalls, []) == stalls


def test_the_nemesis_clock_may_be_a_few_seconds_off():
    log = LOG.replace("%6|1796090912.644|FAIL|rdkafka#producer-7| [thrd:127.0.0.1:12843/3]: "
                      "Disconnected\n", "")
    stalls = find_stalls(log)
    assert unexplained(stalls, [(at("02:14:05"), at("02:14:21"))]) == []  # 2 s either side
    # ended 7 s before the last line before the dump: the process ran after it
    assert unexplained(stalls, [(at("02:13:50"), at("02:14:00"))]) == stalls


def test_a_log_without_dumps_has_no_stalls():
    assert find_stalls("2026-12-01 02:14:07,100 INFO x: y\n") == []


def test_a_line_logged_as_the_process_is_continued_may_come_before_the_dump():
    # seed 61: a thread logged at the pause's end, then the timer's thread wrote the dump
    log = ("2026-12-01 02:14:18,000 INFO x: resumed\nTimeout (0:00:05)!\n"
           "Thread 0x1 (most recent call first):\n  File \"a.py\", line 1 in f\n\n"
           "2026-12-01 02:14:18,050 INFO x: next\n")
    stalls = find_stalls(log)
    assert unexplained(stalls, [(at("02:14:08"), at("02:14:18"))]) == []
    assert unexplained(stalls, [(at("02:13:00"), at("02:13:10"))]) == stalls
