"""The circuit breaker on a fake clock: when it trips, how it probes, how it recovers,
and what it reports."""

from __future__ import annotations

import logging

import pytest

from safejit.cache.remote import Breaker, BreakerPolicy
from safejit.errors import ConfigError


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def clock() -> Clock:
    return Clock()


def make(clock: Clock, transitions: list | None = None, **policy) -> Breaker:
    callback = (lambda old, new: transitions.append((old, new))) if transitions is not None else None
    return Breaker(BreakerPolicy(**policy), on_transition=callback, clock=clock)


def calls(breaker: Breaker, outcomes: list[str | None]) -> None:
    for reason in outcomes:
        assert breaker.allow()
        breaker.record(reason)


def test_half_of_ten_calls_failing_opens_it(clock):
    breaker = make(clock)
    calls(breaker, [None] * 5 + ["error"] * 4)
    assert breaker.state == "closed"  # 4 of 9: under the minimum number of calls
    calls(breaker, ["refused"])
    assert breaker.state == "open"
    assert breaker.allow() is False


def test_failures_under_the_ratio_keep_it_closed(clock):
    breaker = make(clock)
    calls(breaker, ([None, None, "error"] * 10))
    assert breaker.state == "closed"


def test_three_consecutive_timeouts_open_it(clock):
    breaker = make(clock)
    calls(breaker, [None] * 20 + ["timeout", "timeout"])
    assert breaker.state == "closed"
    calls(breaker, ["timeout"])
    assert breaker.state == "open"


def test_a_success_between_timeouts_resets_the_run(clock):
    breaker = make(clock)
    calls(breaker, [None] * 20 + ["timeout", "timeout", None, "timeout", "timeout"])
    assert breaker.state == "closed"


def test_answers_from_a_live_server_are_not_failures(clock):
    breaker = make(clock)
    calls(breaker, ["denied", "oversize", "corrupt", "unwritable"] * 10)
    assert breaker.state == "closed"


def test_failures_older_than_the_window_are_forgotten(clock):
    breaker = make(clock)
    calls(breaker, [None] * 5 + ["error"] * 4)
    clock.now += 31
    calls(breaker, [None] * 5 + ["error"])
    assert breaker.state == "closed"


def test_open_breaker_lets_one_probe_through_per_interval(clock):
    breaker = make(clock, consecutive_timeouts=1, probe_interval_s=5)
    calls(breaker, ["timeout"])
    assert [breaker.allow() for _ in range(3)] == [False] * 3
    clock.now += 5
    assert breaker.allow() is True  # the probe
    assert breaker.state == "half_open"
    assert [breaker.allow() for _ in range(3)] == [False] * 3  # one probe at a time


def test_successful_probe_closes_it(clock):
    transitions: list = []
    breaker = make(clock, transitions, consecutive_timeouts=1, probe_interval_s=5)
    calls(breaker, ["timeout"])
    clock.now += 5
    assert breaker.allow()
    breaker.record(None)
    assert breaker.state == "closed"
    assert breaker.allow() is True
    assert transitions == [("closed", "open"), ("open", "half_open"), ("half_open", "closed")]


def test_failed_probe_reopens_it_for_another_interval(clock):
    transitions: list = []
    breaker = make(clock, transitions, consecutive_timeouts=1, probe_interval_s=5)
    calls(breaker, ["timeout"])
    clock.now += 5
    assert breaker.allow()
    breaker.record("refused")
    assert breaker.state == "open"
    clock.now += 4.9
    assert breaker.allow() is False
    clock.now += 0.1
    assert breaker.allow() is True
    assert transitions == [("closed", "open"), ("open", "half_open"), ("half_open", "open"), ("open", "half_open")]


def test_probe_never_recorded_expires_after_an_interval(clock):
    breaker = make(clock, consecutive_timeouts=1, probe_interval_s=5)
    calls(breaker, ["timeout"])
    clock.now += 5
    assert breaker.allow() is True  # this caller never records
    clock.now += 5
    assert breaker.allow() is True


def test_late_outcome_of_a_call_started_before_opening_is_ignored(clock):
    breaker = make(clock, consecutive_timeouts=1)
    assert breaker.allow()  # a slow call starts
    calls(breaker, ["timeout"])  # another one trips the breaker
    breaker.record(None)  # the slow call ends well: no probe was taken, so nothing changes
    assert breaker.state == "open"


def test_closing_starts_a_fresh_window(clock):
    breaker = make(clock, probe_interval_s=5)
    calls(breaker, ["error"] * 10)
    clock.now += 5
    calls(breaker, [None])
    assert breaker.state == "closed"
    calls(breaker, ["error"])
    assert breaker.state == "closed"


def test_transition_callback_failure_is_logged_not_raised(clock, caplog):
    def boom(old, new):
        raise RuntimeError("metrics down")

    breaker = Breaker(BreakerPolicy(consecutive_timeouts=1), on_transition=boom, clock=clock)
    with caplog.at_level(logging.ERROR, logger="safejit.cache.remote.breaker"):
        calls(breaker, ["timeout"])
    assert breaker.state == "open"
    assert [r.getMessage() for r in caplog.records] == ["remote circuit breaker transition callback failed"]


def test_transitions_are_logged(clock, caplog):
    breaker = make(clock, consecutive_timeouts=1)
    with caplog.at_level(logging.INFO, logger="safejit.cache.remote.breaker"):
        calls(breaker, ["timeout"])
    assert [r.getMessage() for r in caplog.records] == ["remote circuit breaker closed -> open"]


@pytest.mark.parametrize(
    "bad",
    [
        {"window_s": 0},
        {"probe_interval_s": -1},
        {"min_calls": 0},
        {"consecutive_timeouts": 0},
        {"failure_ratio": 0},
        {"failure_ratio": 1.5},
    ],
)
def test_bad_policy_is_a_config_error(bad):
    with pytest.raises(ConfigError):
        BreakerPolicy(**bad)


@pytest.mark.parametrize("raised", [ConnectionError("Error connecting to cache:6379"), OSError("handshake failed")])
def test_a_failure_slower_than_any_deadline_is_a_timeout_whatever_it_says(raised):
    """A resolver, TLS or AUTH handshake that stalled and then failed: counted as an
    error, it never made the consecutive-timeout run that opens the breaker."""
    import time

    from safejit.cache.remote import RemoteError, RemoteSettings
    from safejit.cache.remote._guard import Guard

    settings = RemoteSettings.from_url("redis://cache", timeout_s=0.01, timeout_max_s=0.02)
    guard = Guard("redis", settings, Breaker(), lambda exc: "error")

    def slow() -> None:
        time.sleep(0.05)
        raise raised

    def quick() -> None:
        raise raised

    with pytest.raises(RemoteError) as fast:
        guard.run("index", "remote.get", quick)
    assert fast.value.reason == "error"
    for _ in range(3):
        with pytest.raises(RemoteError) as late:
            guard.run("index", "remote.get", slow)
        assert late.value.reason == "timeout"
    assert guard.breaker.state == "open"


def test_the_callers_own_work_before_reading_a_reply_is_not_the_remotes_slowness():
    """A request sent, then the caller's own checks (a closure of a thousand headers), then
    a read that failed at once: counted from the send, the failure was "slow", a timeout."""
    import time

    from safejit.cache.remote import RemoteError, RemoteSettings
    from safejit.cache.remote._guard import Guard

    settings = RemoteSettings.from_url("redis://cache", timeout_s=0.01, timeout_max_s=0.02)
    guard = Guard("redis", settings, Breaker(), lambda exc: "refused")
    sent = time.perf_counter()
    time.sleep(0.05)

    def refused() -> None:
        raise ConnectionRefusedError("refused")

    with pytest.raises(RemoteError) as info:
        guard.run("get_blob", "remote.get", refused, start=sent)
    assert info.value.reason == "refused"
