"""sprite.recovery.child with real processes: a launcher that forks an orphan in its own session, catches
signals, or ignores SIGTERM. The driver runs in its own process (child.run makes its caller a subreaper)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

LAUNCHER = """
import os, signal, subprocess, sys, time
out = sys.argv[1]
orphan = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"], start_new_session=True)
open(os.path.join(out, "orphan"), "w").write(str(orphan.pid))
for sig in (signal.SIGUSR1, signal.SIGUSR2):
    signal.signal(sig, lambda signum, frame: open(os.path.join(out, f"sig{signum}"), "w").close())
if os.environ.get("IGNORE_TERM"):
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
print("launcher up", flush=True)
print("to stderr", file=sys.stderr, flush=True)
deadline = time.time() + float(os.environ.get("LIVE", "600"))
while time.time() < deadline:
    time.sleep(0.05)
sys.exit(int(os.environ.get("CODE", "0")))
"""

DRIVER = """
import json, os, sys, time
from pathlib import Path
from sprite.recovery import child
out = Path(sys.argv[1])
stop_after = float(os.environ.get("STOP_AFTER", "0"))
t0 = time.monotonic()
def tick():
    return "sprite: error: stopped by the test" if stop_after and time.monotonic() - t0 > stop_after else None
with child.Forwarding() as signals:
    outcome = child.run([sys.executable, str(out / "launcher.py"), str(out)], dict(os.environ), None,
                        out / "attempt.log", tick, signals, grace=(1.0, 30.0), poll=0.1)
json.dump({"code": outcome.code, "forwarded": outcome.forwarded, "stopped_by": outcome.stopped_by},
          open(out / "outcome.json", "w"))
"""


def drive(tmp_path: Path, **env) -> tuple[subprocess.Popen, Path]:
    (tmp_path / "launcher.py").write_text(LAUNCHER)
    (tmp_path / "driver.py").write_text(DRIVER)
    proc = subprocess.Popen([sys.executable, str(tmp_path / "driver.py"), str(tmp_path)],
                            env={**os.environ, **env}, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    return proc, tmp_path


def wait_for(path: Path, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while not path.exists():
        assert time.monotonic() < deadline, f"{path} never appeared"
        time.sleep(0.05)


def alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().split()[2] != "Z"
    except OSError:
        return False


def test_exit_code_output_and_log_pass_through_and_the_orphan_is_killed(tmp_path):
    proc, out = drive(tmp_path, LIVE="1", CODE="7")
    stdout, stderr = proc.communicate(timeout=60)
    assert proc.returncode == 0, stderr
    assert json.loads((out / "outcome.json").read_text()) == {"code": 7, "forwarded": [], "stopped_by": ""}
    assert "launcher up" in stdout and "to stderr" in stderr
    log = (out / "attempt.log").read_text()
    assert "launcher up" in log and "to stderr" in log
    assert oct((out / "attempt.log").stat().st_mode & 0o777) == "0o600"
    assert not alive(int((out / "orphan").read_text()))  # it escaped into its own session; the sweep found it


def test_usr1_and_usr2_are_passed_on_and_sigint_stops_the_launch(tmp_path):
    proc, out = drive(tmp_path)
    wait_for(out / "orphan")
    time.sleep(0.5)
    for sig in (signal.SIGUSR1, signal.SIGUSR2):
        proc.send_signal(sig)
        wait_for(out / f"sig{int(sig)}")  # the launcher got it and keeps running
    assert proc.poll() is None
    proc.send_signal(signal.SIGINT)
    proc.communicate(timeout=60)
    outcome = json.loads((out / "outcome.json").read_text())
    assert outcome["forwarded"] == [signal.SIGUSR1, signal.SIGUSR2, signal.SIGINT]
    assert outcome["code"] == 128 + signal.SIGINT  # the launcher's own fate is the exit code
    log = (out / "attempt.log").read_text()
    assert "sprite: received SIGUSR2; passing it to the launcher." in log
    assert not alive(int((out / "orphan").read_text()))


def test_sigterm_is_passed_on_and_ends_the_launch(tmp_path):
    proc, out = drive(tmp_path)
    wait_for(out / "orphan")
    time.sleep(0.5)
    proc.send_signal(signal.SIGTERM)
    proc.communicate(timeout=60)
    outcome = json.loads((out / "outcome.json").read_text())
    assert outcome["forwarded"] == [signal.SIGTERM] and outcome["code"] == 128 + signal.SIGTERM
    assert not alive(int((out / "orphan").read_text()))


def test_a_stop_reason_ends_a_launcher_that_ignores_sigterm(tmp_path):
    proc, out = drive(tmp_path, IGNORE_TERM="1", STOP_AFTER="1.5")
    started = time.monotonic()
    proc.communicate(timeout=60)
    assert time.monotonic() - started < 20
    outcome = json.loads((out / "outcome.json").read_text())
    assert outcome == {"code": 128 + signal.SIGKILL, "forwarded": [],
                       "stopped_by": "sprite: error: stopped by the test"}
    assert (out / "attempt.log").read_text().rstrip().endswith("sprite: error: stopped by the test")
    assert not alive(int((out / "orphan").read_text()))
