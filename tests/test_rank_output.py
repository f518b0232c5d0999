"""Ranks' output at scale, planning only: each launcher's own label and per-rank file options (golden files),
the console filter and its default, the follower that prints the console ranks' files, and --exclude lists.

Golden files (tests/golden/launch/<flavour>.txt) hold @REPO@ and @LOGS@ for this checkout and the log folder.
Regenerate after a reviewed change with SPRITE_UPDATE_GOLDEN=1.
"""

from __future__ import annotations

import io
import os
import shlex
from pathlib import Path

import pytest
from typer.testing import CliRunner

from sprite import contract
from sprite import schedulers
from sprite.cli import app as cli
from sprite.launch import plan
from sprite.contract import console
from sprite.launch import rank_output
from sprite.launch import ranklog
from sprite.launch import world
from sprite.errors import UsageError

REPO = Path(__file__).resolve().parents[1]
GOLDEN = Path(__file__).parent / "golden" / "launch"
SCRIPT = str(REPO / "examples" / "train.py")


def planned(flags: dict, environ: dict, run_env: dict | None = None) -> plan.LaunchPlan:
    """A plan as `sprite run` builds it, with a fixed interpreter name, port and root flag (so it is golden)."""
    job, site = plan.assemble({"script": SCRIPT, "master_port": 29500, **flags}, environ=environ)
    launched = world.resolve(job, site, schedulers.discover(environ, hostname="here"))
    ctx = plan.Context("PYTHON", dict(environ), False, lambda: 29500, run_env=run_env or {})
    return plan.build(job, site, launched, ctx)


@pytest.fixture
def allocations(tmp_path) -> dict:
    nodefile = tmp_path / "nodefile"
    nodefile.write_text("x4000c0s0b0n0\nx4000c0s1b0n0\n")
    return {"none": {}, "pbs": {"PBS_JOBID": "8505298.aurora", "PBS_NODEFILE": str(nodefile)},
            "slurm": {"SLURM_JOB_ID": "4242", "SLURM_JOB_NODELIST": "nid[001-002]", "SLURM_NTASKS_PER_NODE": "4"}}


CASES = {  # flavour -> (allocation, flags)
    "pals": ("pbs", {"site": "aurora"}),
    "hydra": ("none", {"launcher": "mpiexec", "devices": 2}),
    "openmpi": ("none", {"launcher": "mpiexec", "mpi": "openmpi", "devices": 2}),
    "srun": ("slurm", {"site": "perlmutter"}),
    "torchrun": ("none", {"launcher": "torchrun", "devices": 2}),
    "local": ("none", {"devices": 2}),
}


@pytest.mark.parametrize("flavour", sorted(CASES))
def test_labelled_launch_lines_match_golden(flavour, allocations, tmp_path):
    kind, flags = CASES[flavour]
    logs = str(tmp_path / "logs")
    lines = []
    for name, extra in (("plain", {}), ("log-dir", {"log_dir": logs}), ("ranks 0", {"ranks": "0"})):
        launch = planned({**flags, **extra}, allocations[kind])
        assert launch.env[contract.LAUNCHER] == flavour
        split = {k: v for k, v in launch.env.items() if k in (contract.LOG_DIR, contract.CONSOLE_RANKS)}
        lines.append(f"{name}: {shlex.join(launch.argv)}  # env {split}")
    got = "\n".join(lines).replace(logs, "@LOGS@").replace(str(REPO), "@REPO@") + "\n"
    if os.environ.get("SPRITE_UPDATE_GOLDEN"):
        GOLDEN.mkdir(exist_ok=True)
        (GOLDEN / f"{flavour}.txt").write_text(got)
    assert got == (GOLDEN / f"{flavour}.txt").read_text()


def test_each_launcher_labels_with_its_own_option(allocations):
    argv = {flavour: planned(flags, allocations[kind]).argv for flavour, (kind, flags) in CASES.items()}
    assert argv["pals"][:3] == ["mpiexec", "--label", "--line-buffer"]
    assert argv["hydra"][:2] == ["mpiexec", "-prepend-rank"]
    assert argv["openmpi"][:2] == ["mpirun", "--tag-output"]
    assert argv["srun"][:2] == ["srun", "--label"]
    assert "[rank" not in " ".join(argv["local"])  # the supervisor labels "[rank N]" itself
    single = planned({"launcher": "mpiexec", "devices": 1}, {}).argv
    assert "-prepend-rank" not in single  # one rank: nothing to tell apart


def test_log_dir_uses_the_launchers_own_files_else_the_runtime(allocations, tmp_path):
    logs = str(tmp_path / "logs")
    srun = planned({"site": "perlmutter", "log_dir": logs, "ranks": "0"}, allocations["slurm"])
    assert srun.argv[:9] == ["PYTHON", "-m", "sprite.launch.ranklog", "--dir", logs, "--ranks", "0", "--size", "8"]
    assert f"--output={logs}/rank%t.log" in srun.argv and contract.LOG_DIR not in srun.env
    hydra = planned({"launcher": "mpiexec", "devices": 2, "log_dir": logs}, {})
    assert hydra.argv[hydra.argv.index("-outfile-pattern") + 1] == f"{logs}/rank%r.log"
    pals = planned({"site": "aurora", "log_dir": logs}, allocations["pbs"])
    assert pals.argv[0] == "mpiexec" and pals.env[contract.LOG_DIR] == logs  # PALS: each rank tees its own
    assert pals.log_dir == logs and any("rank<N>.log" in note for note in pals.output_notes)


def test_a_relaunch_writes_its_own_attempt_folder(allocations, tmp_path):
    logs = str(tmp_path / "logs")
    first = planned({"site": "aurora", "log_dir": logs}, allocations["pbs"], {contract.ATTEMPT: "1"})
    second = planned({"site": "aurora", "log_dir": logs}, allocations["pbs"], {contract.ATTEMPT: "2"})
    assert first.env[contract.LOG_DIR] == logs and second.env[contract.LOG_DIR] == f"{logs}/attempt2"
    hydra = planned({"launcher": "mpiexec", "devices": 2, "log_dir": logs}, {}, {contract.ATTEMPT: "3"})
    assert hydra.argv[hydra.argv.index("--dir") + 1] == f"{logs}/attempt3" and hydra.log_dir == f"{logs}/attempt3"


def test_console_shows_every_rank_up_to_16_then_rank_0():
    assert console.console_ranks(None, 16) == "all" and console.console_ranks(None, 17) == "0"
    assert console.console_ranks("all", 127488) == "all"
    assert console.members("0,3-5,9", 6) == [0, 3, 4, 5]
    with pytest.raises(UsageError, match="names no rank of this launch"):
        console.console_ranks("7", 4)
    notes = rank_output.notes(24, None, None)
    assert notes == ["the console shows rank 0 of 24 ranks (--ranks all shows every rank; --log-dir DIR keeps "
                     "every rank's output)."]


@pytest.mark.parametrize("text", ["0", "all", "0,3-5", "12"])
def test_ranks_values_accepted(text):
    assert console.check_ranks(text, lambda what, allowed: UsageError(what)) == text


@pytest.mark.parametrize("text", ["", "-1", "0-", "zero", "5-2", "0,,1"])
def test_ranks_values_refused(text):
    with pytest.raises(UsageError):
        console.check_ranks(text, lambda what, allowed: UsageError(what))


def test_follower_prints_whole_lines_as_files_grow(tmp_path):
    sink = io.BytesIO()
    logs = [tmp_path / "rank0.log", tmp_path / "rank1.log"]
    follower = ranklog.Follower(logs, sink)
    follower.poll()  # nothing written yet
    logs[0].write_bytes(b"0: one\n0: tw")
    follower.poll()
    assert sink.getvalue() == b"0: one\n"
    with open(logs[0], "ab") as handle:
        handle.write(b"o\n0: last, no newline")
    logs[1].write_bytes(b"1: other\n")
    follower.poll(final=True)
    assert sink.getvalue() == b"0: one\n0: two\n0: last, no newline\n1: other\n"


def test_prepare_refuses_a_folder_with_old_rank_logs(tmp_path):
    ranklog.prepare(str(tmp_path / "new" / "logs"))
    assert (tmp_path / "new" / "logs").is_dir()
    (tmp_path / "new" / "logs" / "rank0.log").write_text("earlier run\n")
    with pytest.raises(UsageError, match="already holds rank logs"):
        ranklog.prepare(str(tmp_path / "new" / "logs"))
    assert (tmp_path / "new" / "logs" / "rank0.log").read_text() == "earlier run\n"


def test_exclude_splits_only_outside_brackets(tmp_path):
    nodefile = tmp_path / "nodefile"
    nodefile.write_text("nid001235\nnid001236\nnid001237\n")
    environ = {"PBS_JOBID": "1.pbs", "PBS_NODEFILE": str(nodefile)}
    for given in (["nid[001235,001237]"], ["nid001235,nid[001237]"], ["nid001235", "nid001237"]):
        launch = planned({"site": "aurora", "exclude": given}, environ)  # the CLI passes each --exclude as given
        assert launch.world.hosts == ("nid001236",), given
    result = CliRunner().invoke(cli.app, ["run", "--dry-run", "--site", "aurora", "--exclude", "nid[001235,001237]",
                                          SCRIPT], env=environ)
    assert result.exit_code == 0, result.output
    assert "--hosts nid001236 " in result.output


SPLIT = """import sys
from sprite.runtime import output
split = output.install()
print("out line")
print("err line", file=sys.stderr)
split.failed("RuntimeError: boom")
"""


@pytest.mark.parametrize("rank, logs", [(0, False), (1, False), (0, True), (1, True)])
def test_a_rank_splits_its_own_output(rank, logs, tmp_path):
    import subprocess
    import sys

    env = {**os.environ, "PMI_RANK": str(rank), "PMI_SIZE": "2", contract.LAUNCHER: "hydra",
           contract.CONSOLE_RANKS: "0", **({contract.LOG_DIR: str(tmp_path)} if logs else {})}
    done = subprocess.run([sys.executable, "-c", SPLIT], env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    console = rank == 0
    assert done.stdout == ("out line\n" if console else "")
    failure = f"sprite: rank 1 failed: RuntimeError: boom ({'its output: ' + str(tmp_path / 'rank1.log') if logs else 'rerun'}"
    assert done.stderr.startswith("err line\n" if console else failure), done.stderr
    if logs:
        assert sorted((tmp_path / f"rank{rank}.log").read_text().splitlines()) == ["err line", "out line"]


def test_a_hand_set_console_ranks_that_cannot_be_read_is_one_usage_error():
    from sprite import contract
    from sprite.errors import UsageError
    from sprite.runtime import output

    env = {contract.CONSOLE_RANKS: "zz", "RANK": "0", "WORLD_SIZE": "2", contract.LAUNCHER: "local"}
    with pytest.raises(UsageError, match="SPRITE_CONSOLE_RANKS='zz' cannot be read"):
        output.install(env)
