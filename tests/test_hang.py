"""Hang diagnosis end to end (issue 27): six injected hangs, each a 2-rank CPU fit under sprite run with a short
stall timeout, under the local launcher and under MPICH Hydra. For each: exit 124 within the stall timeout + 10 s
of the hang, every rank's stacks in the run folder, the hung rank named as the likely culprit with its function,
the same lines in the audit's stall record and in ``sprite runs show``. The six runs of one launcher run at once
(hung ranks mostly sleep)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from conftest import LEAK_GUARDED, SCHEDULER_VARS

pytestmark = pytest.mark.slow
SCRIPT = str(Path(__file__).parent / "scripts" / "hang_fit.py")
STALL = 6
LAUNCHERS = {"local": ["--launcher", "local"], "hydra": ["--launcher", "mpiexec", "--mpi", "hydra"]}
# kind: what the culprit's line must say (the rank is always 1)
CASES = {
    "train-sleep": "stuck in training_step (hang_fit.py:",
    "loader": "stuck in __getitem__ (hang_fit.py:",
    "val-sleep": "stuck in validation_step (hang_fit.py:",
    "extra-collective": "waiting in barrier called from training_step (hang_fit.py:",
    "fifo": "stuck in read_fifo (hang_fit.py:",
    "c-loop": "stuck in long_torch_op (hang_fit.py:",
}
PLAIN = {"plain-sleep": "stuck in plain_step (hang_fit.py:",  # no Trainer: sprite.beat(step); local launcher only
         "fabric-sleep": "stuck in fabric_step (hang_fit.py:"}


class Launch:
    """One ``sprite run`` of hang_fit.py in the background, each output line with the time it came."""

    def __init__(self, sprite_cmd, env, top: Path, kind: str, launcher: list[str]):
        self.kind, self.run_dir = kind, top / kind
        work = top / f"{kind}-work"
        work.mkdir()
        self.proc = subprocess.Popen([*sprite_cmd, "run", "--devices", "2", *launcher, "--stall-timeout", str(STALL),
                                      "--run-dir", str(self.run_dir), SCRIPT, "--hang", kind, "--rank", "1",
                                      "--step", "3", "--work", str(work)],
                                     env=env, cwd=work, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        self.lines: list[tuple[float, str]] = []
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()

    def _read(self):
        for line in iter(self.proc.stdout.readline, ""):
            self.lines.append((time.monotonic(), line.rstrip("\n")))
        self.ended = time.monotonic()  # sprite exited (the ranks' output reaches this pipe only through sprite)

    def wait(self, timeout: float) -> None:
        try:
            self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self.reader.join(timeout=5)

    @property
    def output(self) -> str:
        return "\n".join(line for _, line in self.lines)

    def stall_lines(self) -> list[str]:
        return [line for _, line in self.lines if line.startswith("sprite: stall: ")]


def _env() -> dict:
    env = {k: v for k, v in os.environ.items() if k not in (*LEAK_GUARDED, *SCHEDULER_VARS)}
    env["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), env.get("PATH", "")])
    return env


@pytest.fixture(scope="module", params=sorted(LAUNCHERS))
def hangs(request, sprite_cmd, tmp_path_factory):
    top = tmp_path_factory.mktemp(f"hang-{request.param}")
    kinds = {**CASES, **(PLAIN if request.param == "local" else {})}
    launches = {kind: Launch(sprite_cmd, _env(), top, kind, LAUNCHERS[request.param]) for kind in kinds}
    deadline = time.monotonic() + 300
    for launch in launches.values():
        launch.wait(max(1.0, deadline - time.monotonic()))
    return launches


@pytest.mark.parametrize("kind", [*CASES, *PLAIN])
def test_the_hung_rank_and_its_function_are_named(hangs, kind):
    if kind not in hangs:
        pytest.skip("plain and Fabric scripts run under the local launcher only here")
    launch = hangs[kind]
    assert launch.proc.returncode == 124, launch.output[-3000:]
    hung = next(t for t, line in launch.lines if f"rank 1 hangs: {kind}" in line)
    assert launch.ended - hung < STALL + 10, launch.output[-3000:]
    culprit = [line for line in launch.stall_lines() if "<- the likely culprit" in line]
    assert len(culprit) == 1, launch.output[-3000:]
    assert culprit[0].startswith("sprite: stall: rank 1 on ") and {**CASES, **PLAIN}[kind] in culprit[0], culprit[0]
    others = [line for line in launch.stall_lines() if line.startswith("sprite: stall: rank 0 on ")]
    assert len(others) == 1 and "waiting in " in others[0] and others[0].endswith(", for rank 1"), others


@pytest.mark.parametrize("kind", list(CASES))
def test_every_rank_left_its_stacks_in_the_run_folder(hangs, kind):
    folder = hangs[kind].run_dir / "stacks" / "attempt-1"
    for rank in (0, 1):
        text = (folder / f"rank{rank}.txt").read_text()
        assert text.startswith("# sprite stacks {") and "(most recent call first):" in text, text[:2000]
        assert "\nTimeout (0:00:04.800000)!\n" in text  # the rank's own timed dump, 6 s less two 0.6 s intervals
        recorded = json.loads((folder / f"rank{rank}.collectives.json").read_text())
        assert recorded["backend"] == "gloo" and recorded["groups"][0]["last_enqueued"] > 0, recorded
    function = CASES[kind].split(" (")[0].split()[-1]
    assert f" in {function}\n" in (folder / "rank1.txt").read_text()


def test_the_stall_record_and_runs_show_hold_the_diagnosis(hangs, sprite_cmd):
    launch = hangs["train-sleep"]
    records = [json.loads(line) for line in (launch.run_dir / "audit.jsonl").read_text().splitlines()]
    stall = next(r for r in records if r["kind"] == "stall")
    printed = [line.removeprefix("sprite: stall: ") for line in launch.stall_lines()]
    assert stall["culprits"] == [1] and stall["diagnosis"] == printed[:-1], (stall, printed)
    assert stall["stacks"] == "stacks/attempt-1"
    assert stall["culprit_reason"] == "not in a collective while the others wait in one"  # docs/hangs.md, rule 1
    assert printed[-1] == f"every rank's stacks and collectives are in {launch.run_dir / 'stacks' / 'attempt-1'}/"
    shown = subprocess.run([*sprite_cmd, "runs", "show", str(launch.run_dir)], capture_output=True, text=True,
                           timeout=60, env=_env())
    assert shown.returncode == 0, shown.stderr
    assert all(line in shown.stdout for line in stall["diagnosis"]), shown.stdout
