"""A rank whose script asked to skip the interpreter's teardown (sprite's own harness workers) leaves once its
atexit handlers ran; every other rank, and every rank that ends badly or still runs a thread, exits the usual way
(sprite/runtime/finish.py: skip_teardown, leave)."""

from __future__ import annotations

import atexit
import subprocess
import sys

import pytest

from sprite.runtime import finish

SCRIPT = """
import atexit, pathlib, sys, threading, time, types
from sprite.runtime import finish

out = pathlib.Path(sys.argv[1])
held = types.ModuleType("held")  # a module global, as a user's imported module would hold a log file
sys.modules["held"] = held
held.log = open(out / "buffered.txt", "w")
held.log.write("flushed by the interpreter's teardown")
atexit.register(lambda: (out / "atexit.txt").write_text("ran"))
print("no newline at the end", end="")
if "--skip" in sys.argv:
    finish.skip_teardown()
if "--thread" in sys.argv:
    threading.Thread(target=lambda: (time.sleep(0.5), (out / "thread.txt").write_text("ran"))).start()
if "--fail" in sys.argv:
    sys.exit(3)
"""


def rank(tmp_path, *flags):
    script = tmp_path / "script.py"
    script.write_text(SCRIPT)
    out = tmp_path / "out"
    out.mkdir()
    done = subprocess.run([sys.executable, "-m", "sprite.runtime", str(script), str(out), *flags],
                          capture_output=True, text=True, timeout=120)
    return done, out


def test_a_script_that_did_not_ask_keeps_the_whole_teardown(tmp_path):
    done, out = rank(tmp_path)
    assert done.returncode == 0, done.stderr
    assert (out / "buffered.txt").read_text() == "flushed by the interpreter's teardown"
    assert (out / "atexit.txt").read_text() == "ran" and done.stdout == "no newline at the end"


def test_a_script_that_asked_leaves_after_its_atexit_handlers_and_flushed_streams(tmp_path):
    done, out = rank(tmp_path, "--skip")
    assert done.returncode == 0, done.stderr
    assert (out / "atexit.txt").read_text() == "ran" and done.stdout == "no newline at the end"
    # What it gives up, and why a user's script never asks: a buffer only the teardown would have written.
    assert (out / "buffered.txt").read_text() == ""


@pytest.mark.parametrize("flag, code, marker", [("--thread", 0, "thread.txt"), ("--fail", 3, None)])
def test_a_running_thread_or_a_failure_keeps_the_usual_exit(tmp_path, flag, code, marker):
    done, out = rank(tmp_path, "--skip", flag)
    assert done.returncode == code, done.stderr
    assert (out / "buffered.txt").read_text() == "flushed by the interpreter's teardown"
    if marker:
        assert (out / marker).read_text() == "ran"  # the usual exit waited for the thread


def test_this_python_has_the_handler_run_leave_relies_on():
    """finish.leave runs the atexit handlers through CPython's atexit._run_exitfuncs; without it nothing is skipped.
    Fails, naming it, on a Python that dropped the name (checked on 3.11 here and 3.12 on the H200 image)."""
    assert callable(getattr(atexit, "_run_exitfuncs", None)), f"atexit._run_exitfuncs is gone in {sys.version}"


@pytest.mark.parametrize("module", ["sprite.parity.check.arm", "sprite.parity.pool.worker",
                                    "sprite.parity.ckpt.worker", "sprite.parity.bench.step"])
def test_sprite_s_harness_workers_ask_to_skip_the_teardown(module, monkeypatch):
    import importlib

    worker = importlib.import_module(module)
    monkeypatch.setattr(finish, "_skip_teardown", False)
    with pytest.raises(SystemExit):
        worker.main(["--no-such-option"])  # bad arguments: the request comes first, before anything is read
    assert finish._skip_teardown
