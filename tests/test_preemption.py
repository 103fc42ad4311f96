"""c2jax.preemption.StopRequest in this process: the first SIGTERM / SIGINT is recorded,
a repeat within REPEAT_WINDOW_S is the same notice, a later second signal of the same
kind acts as without it, and leaving restores the old handlers."""

import os
import signal

import pytest

from c2jax import preemption


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
def test_first_signal_is_recorded_and_handlers_are_restored(signum):
  before = signal.getsignal(signum)
  with preemption.StopRequest() as stop:
    assert not stop.requested and not stop.reached(3)
    os.kill(os.getpid(), signum)
    assert stop.requested and stop.reached(4)
    assert stop.signal_name == signal.Signals(signum).name
    # A second signal of the other kind is only recorded too.
    other = signal.SIGINT if signum == signal.SIGTERM else signal.SIGTERM
    os.kill(os.getpid(), other)
    assert stop.signal_name == signal.Signals(other).name
  assert signal.getsignal(signum) is before


def test_a_repeat_within_the_window_is_the_same_notice():
  with preemption.StopRequest() as stop:
    os.kill(os.getpid(), signal.SIGINT)
    os.kill(os.getpid(), signal.SIGINT)  # e.g. from the launcher and from a parent
    assert stop.requested


def test_second_sigint_interrupts_at_once(monkeypatch):
  monkeypatch.setattr(preemption, "REPEAT_WINDOW_S", 0.0)
  with preemption.StopRequest() as stop:
    os.kill(os.getpid(), signal.SIGINT)
    assert stop.requested
    with pytest.raises(KeyboardInterrupt):
      os.kill(os.getpid(), signal.SIGINT)


def test_second_sigterm_kills_the_process():
  pid = os.fork()
  if pid == 0:  # the child: a second SIGTERM must end it with the default action
    preemption.REPEAT_WINDOW_S = 0.0
    # "As without c2jax" is the handler found on entry: an earlier test in this worker
    # (a Ray driver, which exits on SIGTERM) may have left its own, so start from none.
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    try:
      with preemption.StopRequest():
        os.kill(os.getpid(), signal.SIGTERM)
        os.kill(os.getpid(), signal.SIGTERM)
        os._exit(0)  # pylint: disable=protected-access  (not reached if it works)
    finally:
      os._exit(1)  # pylint: disable=protected-access
  _, status = os.waitpid(pid, 0)
  assert os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGTERM


def test_the_marker_tells_a_stopped_run_from_a_finished_one(tmp_path):
  assert not preemption.was_preempted(tmp_path)
  preemption.mark(tmp_path, step=3)
  assert preemption.was_preempted(tmp_path)
  preemption.clear(tmp_path)
  assert not preemption.was_preempted(tmp_path)
