"""A SIGTERM (or Ctrl-C's SIGINT) while a service process starts (app/early_stop.py): the handler records it and
never raises, wherever the signal lands; the process acts on it before its event loop starts
(exit 0) or, once a loop runs, when the role's own handler is in place."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys

import pytest

from app import early_stop

pytestmark = pytest.mark.usefixtures("no_stop_recorded")


def run_python(code: str) -> subprocess.CompletedProcess[str]:
    """`code` in a fresh interpreter, as a service process starts."""
    return subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, env=dict(os.environ)
    )


def test_before_any_loop_it_is_recorded_and_ends_the_start_with_exit_0() -> None:
    early_stop._on_stop_signal(signal.SIGTERM, None)  # raises nothing into the code it interrupts
    assert early_stop.requested()
    with pytest.raises(SystemExit) as exited:
        early_stop.exit_if_requested()
    assert exited.value.code == 0


def test_without_a_stop_the_start_goes_on() -> None:
    early_stop.exit_if_requested()
    assert not early_stop.requested()


def test_inside_a_running_loop_it_is_recorded_not_raised() -> None:
    async def starting() -> bool:
        early_stop._on_stop_signal(signal.SIGTERM, None)  # would raise SystemExit into the loop
        await asyncio.sleep(0)
        return early_stop.requested()

    assert asyncio.run(starting()) is True


@pytest.mark.parametrize("stop", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_a_real_stop_signal_inside_code_that_catches_everything_still_stops_the_start(stop: signal.Signals) -> None:
    # Where a library's bare `except:` (or an extension's import) is running when the signal
    # comes: a handler that raised would be swallowed there, and the process would start
    # anyway and ignore the stop until killed.
    code = (
        "import os, signal\n"
        "from app import early_stop\n"
        "early_stop.install()\n"
        "try:\n"
        f"    os.kill(os.getpid(), {int(stop)})\n"
        "    sum(range(1000))\n"  # the handler runs between these bytecodes
        "except BaseException:\n"
        "    print('swallowed')\n"
        "early_stop.exit_if_requested()\n"
        "print('started anyway')\n"
    )
    done = run_python(code)
    assert (done.returncode, done.stdout) == (0, "")


def test_a_stop_that_comes_while_the_process_exits_leaves_its_exit_code_0() -> None:
    # The parent's SIGTERM can reach a child that a Ctrl-C has already stopped, while Python
    # finalizes it (which puts Python handlers back to the default): it must not turn exit 0 into -15.
    code = (
        "import os, signal\n"
        "from app import early_stop\n"
        "early_stop.install()\n"
        "early_stop.ignore_from_now()\n"
        # From another thread, as the kernel may deliver it to any thread of the process.
        "import threading\n"
        "def stop():\n"
        "    os.kill(os.getpid(), signal.SIGTERM)\n"
        "    os.kill(os.getpid(), signal.SIGINT)\n"
        "t = threading.Thread(target=stop); t.start(); t.join()\n"
        "print('exiting')\n"
    )
    done = run_python(code)
    assert (done.returncode, done.stdout) == (0, "exiting\n")
