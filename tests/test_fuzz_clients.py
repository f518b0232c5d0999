"""Property-based fuzzing of what sprite reads from scheduler clients and of paths that reach a launcher's file
pattern (issue 32).

Client output: ``sprite status`` / ``sprite status --json`` and the submit commands' job id read whatever squeue,
scontrol and qstat print: Slurm's and PBS Pro's JSON (generated from scratch, and real-shaped records with forged
fields), ``scontrol -o`` text and arbitrary bytes. For every case: a record whose fields have the types sprite
documents, or a SpriteError printed as one bounded line, and never another exception. (sprite does not call
``sacct``: accounting is often off, and scontrol keeps finished jobs for MinJobAge.)

Paths: ``--log-dir`` under srun and MPICH Hydra, and ``scheduler.output_dir`` under sbatch, built from text with
``%`` patterns and backslashes. For every case: refused in one line (exit 2), or the launcher's pattern, read
back by that launcher's own rules, names exactly the folder sprite names. Budgets come from the hypothesis profile
(tests/conftest.py: "ci" by default, "deep" for long runs).
"""

from __future__ import annotations

import json
import re
import subprocess
import tempfile
from itertools import count
from pathlib import Path
from unittest import mock

import yaml
from hypothesis import event, given, settings
from hypothesis import strategies as st

from sprite import schedulers
from sprite.errors import SpriteError, report
from sprite.jobs import clients, submit
from sprite.launch.plan import plan_run

BUDGET = settings().max_examples
WORK = Path(tempfile.mkdtemp(prefix="sprite-fuzz-clients-"))
NAMES = count()
JOB_ID = "5"

# --- client output ----------------------------------------------------------------------------------------------

HOSTILE_TEXT = ["", "5", "5.server", "²", "9" * 5000, "(null)", "RUNNING", "x\ny", "\x1b[31m", "a=b=c", "null",
                "ExitCode=²:0", "ExitCode=" + "9" * 5000 + ":0", "JobId=5", "é", "\u202e"]
SCALAR = st.one_of(st.none(), st.booleans(), st.integers(-2**70, 2**70), st.floats(allow_nan=False),
                   st.sampled_from(HOSTILE_TEXT), st.text(max_size=8))
JSONISH = st.recursive(SCALAR, lambda inner: st.lists(inner, max_size=3) | st.dictionaries(
    st.sampled_from(["jobs", "Jobs", "job_id", "5", "5.server", "exit_code", "return_code", "number", "set"])
    | st.text(max_size=5), inner, max_size=4), max_leaves=12)
SLURM_FIELDS = ["job_id", "name", "job_state", "state_reason", "exit_code", "nodes", "standard_output"]
PBS_FIELDS = ["Job_Name", "job_state", "comment", "Exit_status", "exec_host", "Output_Path", "queue",
              "Account_Name"]
FIELD_VALUES = JSONISH | st.fixed_dictionaries({"return_code": JSONISH | st.fixed_dictionaries(
    {"number": SCALAR}, optional={"set": SCALAR})}) | st.lists(st.sampled_from(["RUNNING", "PENDING"]) | SCALAR)


@st.composite
def slurm_json(draw) -> str:
    """``squeue --json`` / ``scontrol --json`` output: real-shaped with forged fields, or any JSON at all."""
    if draw(st.integers(0, 3)) == 0:
        return json.dumps(draw(JSONISH))
    jobs = []
    for _ in range(draw(st.integers(0, 3))):
        job = {"job_id": draw(st.sampled_from([5, "5", 6, None]) | SCALAR)}
        for key in draw(st.lists(st.sampled_from(SLURM_FIELDS), max_size=6)):
            job[key] = draw(FIELD_VALUES)
        jobs.append(job if draw(st.integers(0, 5)) else draw(JSONISH))
    return json.dumps({"jobs": jobs})


@st.composite
def pbs_json(draw) -> str:
    """``qstat -f -F json`` output: real-shaped with forged fields, or any JSON at all."""
    if draw(st.integers(0, 3)) == 0:
        return json.dumps(draw(JSONISH))
    jobs = {}
    for _ in range(draw(st.integers(0, 3))):
        key = draw(st.sampled_from(["5", "5.aurora-pbs-0001", "6.x", "5."]) | st.text(max_size=6))
        job = {field: draw(FIELD_VALUES) for field in draw(st.lists(st.sampled_from(PBS_FIELDS), max_size=8))}
        jobs[key] = job if draw(st.integers(0, 5)) else draw(JSONISH)
    return json.dumps({"Jobs": jobs})


@st.composite
def scontrol_text(draw) -> str:
    words = draw(st.lists(st.sampled_from(["JobId", "JobName", "JobState", "ExitCode", "Reason", "NodeList",
                                           "StdOut", "x"]).flatmap(
        lambda key: st.sampled_from(HOSTILE_TEXT).map(lambda value: f"{key}={value}")) | st.text(max_size=10),
        max_size=8))
    return " ".join(words)


OUTPUT = st.one_of(slurm_json(), pbs_json(), scontrol_text(), st.sampled_from(HOSTILE_TEXT),
                   st.text(max_size=40), st.just("[" * 100_000), st.just('{"jobs": ' + "[" * 3000 + "]" * 3000 + "}"))


def fake_call(outputs):
    """``clients.call`` answering every client with the next (exit code, stdout) of ``outputs``."""
    answers = iter(outputs)

    def call(argv, what, env=None):
        code, out = next(answers, (1, ""))
        return subprocess.CompletedProcess(argv, code, out, "")
    return call


def check_record(record: dict, kind: str) -> None:
    json.dumps(record)
    assert record["scheduler"] == kind and isinstance(record["job_id"], str)
    for key in ("name", "reason", "nodes", "log"):
        assert record[key] is None or isinstance(record[key], str), (key, record[key])
    assert isinstance(record["state"], str) or (kind == "pbs" and record["state"] is None), record["state"]
    code = record["exit_code"]
    assert code is None or (type(code) is int and 0 <= code <= 0xFFFF), code


def one_line(err: BaseException) -> str:
    assert isinstance(err, SpriteError), f"{type(err).__name__}: {err}"
    line = report(err)
    assert "\n" not in line and len(line) <= 2100 and err.exit_code in (1, 2), line
    event("refused")
    return line


def ask(kind: str, outputs, json_out: bool):
    scheduler = schedulers.get(kind)
    with mock.patch.object(clients, "call", fake_call(outputs)), \
            mock.patch.object(clients, "program", lambda name, scheduler: name):
        if json_out:
            return clients.status_record(JOB_ID, scheduler)
        return clients.status(JOB_ID, scheduler)


@settings(max_examples=BUDGET)
@given(st.sampled_from(["slurm", "pbs"]), st.lists(st.tuples(st.sampled_from([0, 0, 0, 1]), OUTPUT), max_size=4),
       st.booleans())
def test_client_output_gives_a_typed_record_or_one_line(kind, outputs, json_out):
    try:
        answer = ask(kind, outputs, json_out)
    except Exception as err:  # noqa: BLE001 - the property: only a SpriteError, printed as one line
        one_line(err)
        return
    event("answered")
    if json_out:
        check_record(answer, kind)
    else:
        assert isinstance(answer, str) and all(line.isprintable() for line in answer.splitlines())


@settings(max_examples=BUDGET // 2)
@given(st.sampled_from(["slurm", "pbs"]), OUTPUT)
def test_submit_output_gives_a_job_id_or_none(kind, stdout):
    job_id = schedulers.get(kind).parse_job_id(stdout)
    assert isinstance(job_id, str)


# --- paths with launcher patterns -------------------------------------------------------------------------------

PIECES = st.sampled_from(["%", "%%", "%r", "%t", "%j", "%u", "%x", "%N", "%n", "%5t", "\\", "\\\\", "a", "logs", "/",
                          "-", ".", "é", " ", "rank%r.log"])
PATHS = st.lists(PIECES | st.text(alphabet="%\\/ab.", max_size=4), min_size=1, max_size=6).map("".join)
SLURM_ENV = {"SLURM_JOB_ID": "7", "SLURM_JOB_NODELIST": "n1", "SLURM_NTASKS_PER_NODE": "2"}


def srun_folder(option: str) -> str:
    """The folder srun writes ``--output=FOLDER/rank%t.log`` into, by srun(1)'s pattern rules (or fail)."""
    assert option.startswith("--output=") and option.endswith("/rank%t.log"), option
    folder = option[len("--output="):-len("/rank%t.log")]
    assert "\\" not in folder and re.fullmatch(r"([^%]|%%)*", folder), folder  # every % escaped, no \ at all
    return folder.replace("%%", "%")


@settings(max_examples=BUDGET)
@given(st.sampled_from(["srun", "hydra"]), PATHS)
def test_log_dir_reaches_the_launcher_pattern_as_written_or_is_refused(flavour, log_dir):
    flags = {"script": str(WORK / "t.py"), "log_dir": log_dir, "devices": "2"}
    environ = SLURM_ENV if flavour == "srun" else {}
    flags.update({"launcher": "srun"} if flavour == "srun" else {"launcher": "mpiexec", "mpi": "hydra"})
    try:
        plan = plan_run(flags, environ)
    except Exception as err:  # noqa: BLE001
        line = one_line(err)
        assert err.exit_code == 2 and "--log-dir" in line, line
        return
    event("planned")
    folder = plan.argv[plan.argv.index("--dir") + 1]
    assert folder == plan.log_dir
    if flavour == "srun":
        assert srun_folder(next(a for a in plan.argv if a.startswith("--output="))) == folder
    else:
        pattern = plan.argv[plan.argv.index("-outfile-pattern") + 1]
        assert pattern == f"{folder}/rank%r.log" and "%" not in folder, pattern


@settings(max_examples=BUDGET // 2)
@given(PATHS)
def test_output_dir_reaches_sbatch_as_written_or_is_refused(output_dir):
    path = WORK / f"case{next(NAMES)}.job.yaml"
    path.write_text(yaml.safe_dump({"script": "t.py", "site": "perlmutter", "scheduler": {
        "walltime": "00:10:00", "account": "a", "output_dir": output_dir}}, allow_unicode=True))
    try:
        prepared = submit.prepare(str(path), "slurm")
    except Exception as err:  # noqa: BLE001
        line = one_line(err)
        assert err.exit_code == 2 and "output" in line, line
        return
    event("rendered")
    output = next(line for line in prepared.text.splitlines() if line.startswith("#SBATCH --output="))
    folder, _, name = output[len("#SBATCH --output="):].rpartition("/")
    assert "%" not in folder and "\\" not in folder and name.endswith("-%j.log"), output
    assert folder == prepared.block.output_dir


(WORK / "t.py").write_text("print('hi')\n")
