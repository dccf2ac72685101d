"""_forksafe.Lock: the C lock itself, unlocked again in a forked child."""

from __future__ import annotations

import os
import threading

from safejit import _forksafe


def test_a_lock_another_thread_holds_at_fork_is_free_in_the_child():
    lock = _forksafe.Lock()
    held, done = threading.Event(), threading.Event()

    def hold() -> None:
        with lock:
            held.set()
            done.wait(10)

    holder = threading.Thread(target=hold)
    holder.start()
    held.wait(10)
    try:
        pid = os.fork()
        if pid == 0:  # pragma: no cover (the child)
            os._exit(0 if lock.acquire(timeout=5) else 1)
        _, status = os.waitpid(pid, 0)
    finally:
        done.set()
        holder.join(10)
    assert os.waitstatus_to_exitcode(status) == 0


def test_it_is_the_c_lock_so_with_has_no_python_frame_to_interrupt():
    """A Python wrapper's ``__enter__``/``__exit__`` are frames a signal handler can raise
    in: after the acquire, or before the release (the lock then held for good)."""
    assert type(_forksafe.Lock()) is type(threading.Lock())
