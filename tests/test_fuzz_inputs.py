"""Property-based fuzzing of sprite's inputs (issue 10): specs, site profiles, flags and allocation environments.

For every generated case: either a plan that agrees with the input, or a SpriteError with exit code 2 printed
as one bounded line naming its source (file, line and key for a spec or profile; the flag; the variable), and
never another exception. Planning runs in-process (fast); a small sample runs the real CLI in a subprocess
under a memory limit and a deadline, and checks that nothing outside the output folder was created or changed.
Budgets come from the hypothesis profile (tests/conftest.py: "ci" by default, "deep" for long local runs).
"""

from __future__ import annotations

import json
import os
import re
import resource
import shlex
import subprocess
import sys
import tempfile
from itertools import count
from pathlib import Path

import pytest
import yaml
from hypothesis import event, given, settings
from hypothesis import strategies as st

from sprite.jobs import submit
from sprite.errors import SpriteError, report
from sprite.launch.plan import plan_run

REPO = Path(__file__).resolve().parents[1]
SCRIPT = str(REPO / "examples" / "train.py")
BUDGET = settings().max_examples  # the loaded profile's; each test takes a share of it
WORK = Path(tempfile.mkdtemp(prefix="sprite-fuzz-"))
NAMES = count()
HOSTILE = ["2", "0", "-1", "010", "0x10", "1e3", "yes", "no", "on", "true", "True", "null", "~", "", "²", "١",
           "-c", "1:30:00", "00:00:00", "01:00:00", "USR1@90", "USR1@99999", "KILL@1", "2,walltime=72:00:00",
           "ncpus=2:mpiprocs=2", "nid001,nid002", "nid[001-003,007]", "nid[001", "a b", "$(touch pwned)",
           "`id`", "x; rm -rf /", "--lr=0.1,0.2", "echo 'open", "eval echo hi", "\u202e", "é", "\x1b[31m",
           "a\nb", "x" * 300, "9" * 4400, "ddp", "fsdp", "single", "cpu", "bf16-mixed", "local", "aurora",
           "perlmutter", "polaris", "nosuch", "../x.yaml", "/proc/self", ".", "-l walltime=9:00:00", "--hold"]
SCALARS = st.one_of(st.sampled_from(HOSTILE), st.integers(-5, 3000), st.integers(10**18, 10**20),
                    st.text(max_size=12))
VALUES = st.recursive(SCALARS, lambda inner: st.lists(inner, max_size=3) | st.dictionaries(
    st.sampled_from(HOSTILE[:20]) | st.text(max_size=6), inner, max_size=3), max_leaves=6)
SPEC_KEYS = ["args", "nodes", "devices", "accelerator", "strategy", "precision", "launcher", "mpi", "site", "env",
             "exclude", "master_port"]
BLOCK_KEYS = ["account", "queue", "walltime", "nodes", "job_name", "output_dir", "dependency", "preempt_signal",
              "requeue", "extra", "setup", "python", "select", "place", "filesystems", "partition", "constraint",
              "gpus_per_node", "cpus_per_task"]
SOURCE = re.compile(r"\.ya?ml(:\d+)?: key '")
RAW_LINES = ["a: &a [x, x, x, x, x, x, x, x]\nb: &b [*a, *a, *a, *a, *a, *a, *a, *a]\nc: [*b, *b, *b, *b, *b, *b]\n",
             "env: &e {A: *e}\n", "nodes: 2\nnodes: 3\n", "scheduler: {null: x}\n", "? [k]\n: v\n", "<<: {a: 1}\n",
             "devices: !!int 2\n", 'args: ["\\0"]\n', "env: {A: " + "[" * 40 + "\n", "\tdevices: 2\n", "---\n"]


def one_line_from(err: BaseException) -> str:
    """The printed line of a refusal, checked to be one bounded line of a usage error."""
    assert isinstance(err, SpriteError), f"{type(err).__name__}: {err}"
    line = report(err)
    event("refused")
    assert err.exit_code == 2 and "\n" not in line and len(line) <= 2100, line
    return line


def write(text: bytes | str, suffix: str = ".job.yaml") -> Path:
    path = WORK / f"case{next(NAMES)}{suffix}"
    path.write_bytes(text if isinstance(text, bytes) else text.encode())
    return path


def as_text(value) -> str:
    return value if isinstance(value, str) else str(value)


MUTATIONS = st.sampled_from([0, 0, 0, 1, 1, 2, 3])  # how many values of a valid input turn hostile
WORDS = st.sampled_from(["--max-steps", "5", "--lr=0.1,0.2", "010", "yes", "a b", "$(id)", "é"]) | st.integers(0, 99)
VALID_SPEC = st.fixed_dictionaries({"script": st.just(SCRIPT)}, optional={
    "devices": st.integers(1, 4), "strategy": st.sampled_from(["ddp", "fsdp", "auto"]),
    "precision": st.sampled_from(["32-true", "bf16-mixed", "auto"]), "accelerator": st.sampled_from(["cpu", "auto"]),
    "args": st.lists(WORDS, max_size=4) | st.sampled_from(["--lr=0.1,0.2 --tag 010", "--x 'a b'"]),
    "env": st.dictionaries(st.from_regex(r"[A-Z][A-Z0-9_]{0,6}", fullmatch=True), WORDS, max_size=3),
    "site": st.sampled_from(["local", "aurora"]), "master_port": st.integers(1024, 65535)})
VALID_BLOCK = st.fixed_dictionaries({"walltime": st.sampled_from(["00:10:00", "01:00:00", "1:30:00"])}, optional={
    "nodes": st.integers(1, 2), "output_dir": st.just("jobs"), "account": st.just("proj"), "requeue": st.booleans(),
    "setup": st.just(["module load x"]), "job_name": st.just("train")})


@st.composite
def specs(draw, scheduler: bool = False) -> dict:
    """A valid spec (plus a scheduler block) with 0-3 of its keys given a hostile value or an unknown key added."""
    spec = draw(VALID_SPEC)
    if scheduler:
        spec["scheduler"] = draw(VALID_BLOCK)
    for _ in range(draw(MUTATIONS)):
        inside = scheduler and isinstance(spec.get("scheduler"), dict) and draw(st.booleans())
        where = spec["scheduler"] if inside else spec
        keys = BLOCK_KEYS if where is not spec else [*SPEC_KEYS, "script", "scheduler"]
        where[draw(st.sampled_from(keys) | st.text(max_size=5))] = draw(VALUES)
    return spec


@st.composite
def spec_files(draw, scheduler: bool = False) -> tuple[Path, dict | None]:
    spec = draw(specs(scheduler))
    text = yaml.safe_dump(spec, allow_unicode=True).encode()
    if draw(st.integers(0, 7)):
        return write(text), spec
    position = draw(st.integers(0, len(text)))
    hostile = draw(st.sampled_from(RAW_LINES)).encode() if draw(st.booleans()) else bytes([draw(st.integers(0, 255))])
    return write(text[:position] + hostile + text[position:]), None


def check_run_plan(plan, spec: dict) -> None:
    """A plan that agrees with the spec it came from (local machine, no scheduler)."""
    assert plan.argv[-1 - len(plan.argv[plan.argv.index(SCRIPT) + 1:]):][0] == SCRIPT
    args = spec.get("args", [])
    expected = [as_text(a) for a in args] if isinstance(args, list) else shlex.split(as_text(args))
    assert plan.argv[plan.argv.index(SCRIPT) + 1:] == expected
    if "devices" in spec:
        assert plan.world.devices == int(as_text(spec["devices"]))
    for name, value in spec.get("env", {}).items():
        assert plan.env[name] == as_text(value)
    assert plan.env["WORLD_SIZE"] == str(plan.world.nodes * plan.world.devices)
    assert plan.env["MASTER_ADDR"] == "127.0.0.1"


@settings(max_examples=BUDGET * 4)
@given(spec_files())
def test_specs_plan_or_refuse_naming_file_line_and_key(case):
    path, spec = case
    try:
        plan = plan_run({}, {}, spec_file=str(path))
    except Exception as err:  # noqa: BLE001 - the property: only a usage error, printed as one line
        line = one_line_from(err)
        assert SOURCE.search(line), line
        return
    event("planned")
    if spec is not None:
        check_run_plan(plan, spec)


@settings(max_examples=BUDGET * 3)
@given(spec_files(scheduler=True), st.sampled_from(["slurm", "pbs"]))
def test_job_scripts_render_or_refuse_and_write_nothing(case, kind):
    path, spec = case
    cwd = WORK / "cwd"  # stays empty: a submission is only planned here
    cwd.mkdir(exist_ok=True)
    before = sorted(os.listdir(WORK))
    try:
        prepared = submit.prepare(str(path), kind, cwd=str(cwd))
    except Exception as err:  # noqa: BLE001
        line = one_line_from(err)
        assert SOURCE.search(line) or "schedules jobs with" in line, line
        return
    finally:
        assert sorted(os.listdir(WORK)) == before and not os.listdir(cwd)  # planning writes nothing
    event("planned")
    if spec is not None:
        block = spec["scheduler"]
        nodes = int(as_text(block.get("nodes", spec.get("nodes", 1))))
        directive = f"#SBATCH --nodes={nodes}\n" if kind == "slurm" else f"#PBS -l select={nodes}"
        assert directive in prepared.text and as_text(block.get("walltime", "00:10:00")) in prepared.text
        assert shlex.quote(SCRIPT) in prepared.text


PROFILE_KEYS = ["name", "description", "scheduler", "mpi", "cpu_bind", "depth", "cpus_per_task", "limits", "job",
                "submit", "queues"]
SHIPPED = {name: yaml.safe_load((REPO / "conf" / f"{name}.yaml").read_text()) for name in ("local", "aurora")}


@st.composite
def profiles(draw) -> dict:
    """A shipped profile with 0-3 values (at the top, or inside job:/submit:/limits:) made hostile."""
    profile = json.loads(json.dumps(SHIPPED[draw(st.sampled_from(sorted(SHIPPED)))]))
    profile.pop("name")
    for _ in range(draw(MUTATIONS)):
        section = draw(st.sampled_from([None, "job", "submit", "limits"]))
        where = profile.setdefault(section, {}) if section else profile
        where = where if isinstance(where, dict) else profile
        keys = {None: PROFILE_KEYS, "job": SPEC_KEYS, "submit": BLOCK_KEYS,
                "limits": ["max_nodes", "max_ranks_per_node"]}
        where[draw(st.sampled_from(keys[section]) | st.text(max_size=5))] = draw(VALUES)
    return profile


@settings(max_examples=BUDGET * 2)
@given(profiles())
def test_site_profiles_load_or_refuse_naming_their_line(profile):
    path = write(yaml.safe_dump(profile, allow_unicode=True), ".yaml")
    try:
        plan = plan_run({"script": SCRIPT, "site": str(path)}, {})
    except Exception as err:  # noqa: BLE001
        assert SOURCE.search(one_line_from(err)) or "--" in report(err), report(err)
        return
    event("planned")
    assert plan.env["SPRITE_SITE"] == as_text(profile.get("name", path.stem))
    job = profile.get("job") or {}
    assert plan.world.devices == int(as_text(job.get("devices", 1)))


FLAG_KEYS = ["nodes", "devices", "accelerator", "strategy", "precision", "launcher", "mpi", "master_port", "site"]


@st.composite
def flag_sets(draw) -> dict:
    """Valid flags (as text, the way the CLI passes them) with 0-3 of them hostile."""
    flags = draw(st.fixed_dictionaries({}, optional={
        "devices": st.sampled_from(["1", "2", "4"]), "strategy": st.sampled_from(["ddp", "fsdp"]),
        "master_port": st.sampled_from(["1024", "29500", "65535"]), "site": st.sampled_from(["local", "aurora"]),
        "env": st.dictionaries(st.from_regex(r"[A-Z][A-Z0-9_]{0,5}", fullmatch=True), st.text(max_size=6),
                               max_size=2)}))
    for _ in range(draw(MUTATIONS)):
        key = draw(st.sampled_from([*FLAG_KEYS, "env", "exclude"]))
        flags[key] = draw({"env": st.dictionaries(st.text(max_size=6), st.text(max_size=6), min_size=1, max_size=2),
                           "exclude": st.lists(st.sampled_from(HOSTILE), min_size=1, max_size=2)}.get(key, SCALARS))
    return {key: value if isinstance(value, (dict, list)) else as_text(value) for key, value in flags.items()}


@settings(max_examples=BUDGET * 2)
@given(flag_sets())
def test_flags_plan_or_refuse_naming_the_flag(flags):
    try:
        plan = plan_run({"script": SCRIPT, **flags}, {})
    except Exception as err:  # noqa: BLE001
        line = one_line_from(err)
        assert "--" in line or "Unknown site" in line or SOURCE.search(line), line
        return
    event("planned")
    if "devices" in flags:
        assert plan.world.devices == int(flags["devices"])
    if "master_port" in flags:
        assert plan.env["MASTER_PORT"] == flags["master_port"]
    assert all(plan.env[name] == value for name, value in flags.get("env", {}).items())


NODE_LINES = ["x1000c0s0b0n0", "h1", "h2", "h1", "", " h3 ", "nid001,nid002", "h\u00e9", "-x"]


def either(draw, valid, hostile):
    """Mostly a valid value, sometimes a hostile one."""
    return draw(hostile if draw(st.integers(0, 4)) == 0 else valid)


@st.composite
def allocations(draw) -> dict:
    """Environment variables of a PBS job, a Slurm job, both, or neither, plus stale rendezvous values."""
    env, kind = {}, draw(st.sampled_from(["pbs", "slurm", "both", "none"]))
    if kind in ("pbs", "both"):
        env["PBS_JOBID"] = either(draw, st.sampled_from(["8505298.aurora-pbsadmin-0001", "77[3].pbs"]),
                                  st.sampled_from(["1;x", "é"]) | st.text(max_size=8))
        lines = "\n".join(draw(st.lists(st.sampled_from(NODE_LINES[:4]), min_size=1, max_size=5))).encode()
        hostile = st.binary(max_size=24) | st.lists(st.sampled_from(NODE_LINES), max_size=4).map(
            lambda rows: "\n".join(rows).encode())
        env["PBS_NODEFILE"] = str(write(either(draw, st.just(lines), hostile), ".nodes")) if draw(
            st.integers(0, 6)) else draw(st.sampled_from(["/nonexistent", "/dev/zero", str(WORK)]))
    if kind in ("slurm", "both"):
        env["SLURM_JOB_ID"] = either(draw, st.sampled_from(["4242", "7"]), st.text(max_size=6))
        env["SLURM_JOB_NODELIST"] = either(draw, st.sampled_from(["nid[001-003,007],gpu-[1-2]", "n1", "h[1-2]"]),
                                           st.sampled_from(["n[1-3", "a,b", "x[1-200000]", "h é", ""])
                                           | st.text(max_size=8))
        env["SLURM_NTASKS_PER_NODE"] = either(draw, st.sampled_from(["4", "4(x2)", "1"]),
                                              st.sampled_from(["²", "0", "99999", ""]))
    if draw(st.booleans()):
        env.update(MASTER_ADDR=draw(st.sampled_from(["h1", "nid001", "evil"])), MASTER_PORT=draw(st.sampled_from(
            ["1234", "x", "65536"])))
    return env


@settings(max_examples=BUDGET * 2)
@given(allocations(), st.fixed_dictionaries({"site": st.sampled_from(["local", "aurora", "perlmutter"])}, optional={
    "nodes": st.integers(1, 3), "devices": st.integers(1, 4), "exclude": st.lists(st.sampled_from(NODE_LINES[:4]),
                                                                                     max_size=2)}))
def test_allocations_plan_or_refuse_naming_the_variable(environ, flags):
    try:
        plan = plan_run({"script": SCRIPT, **flags}, environ)
    except Exception as err:  # noqa: BLE001
        line = one_line_from(err)
        assert re.search(r"PBS_|SLURM_|--|\.yaml(:\d+)?: key '", line), line
        return
    event("planned")
    world = plan.world
    assert set(world.hosts) <= set(world.alloc.hosts) and not set(world.hosts) & set(flags.get("exclude", ()))
    assert plan.env["SPRITE_HOSTS"] == ",".join(world.hosts)
    domain = ".hsn.cm.aurora.alcf.anl.gov" if flags["site"] == "aurora" else ""  # Aurora's rendezvous_domain
    first = world.hosts[0].split(".")[0] + domain if domain else world.hosts[0]
    assert plan.env["MASTER_ADDR"] in (first, "127.0.0.1")  # never an inherited or excluded host
    if world.alloc.job_id:
        from sprite.launch.rendezvous import port_from_job_id
        assert plan.env["MASTER_PORT"] == str(port_from_job_id(world.alloc.job_id))


def _limit_memory() -> None:
    resource.setrlimit(resource.RLIMIT_AS, (1 << 30, 1 << 30))  # 1 GiB: planning needs about a tenth of it


def _tree(root: Path) -> dict:
    return {str(p.relative_to(root)): (p.read_bytes() if p.is_file() and not p.is_symlink() else None)
            for p in root.rglob("*")}


@pytest.mark.slow
@settings(max_examples=max(3, BUDGET // 20))
@given(spec_files(scheduler=True))
def test_the_cli_in_a_subprocess_is_bounded_and_writes_only_its_job_files(sprite_cmd, case):
    """A sample through the real CLI: `sprite run --dry-run --json` and `sprite sbatch` (with a FAKE sbatch on
    PATH that prints a job id), each under 1 GiB of address space and a deadline; files change only where the
    submission says it wrote its script."""
    folder = WORK / f"cli{next(NAMES)}"
    (folder / "bin").mkdir(parents=True)
    (folder / "bin" / "sbatch").write_text("#!/bin/sh\necho 4242\n")
    (folder / "bin" / "sbatch").chmod(0o755)
    spec = folder / "a" / "b" / "job.yaml"  # deep, so a relative output_dir such as ../x stays inside `folder`
    spec.parent.mkdir(parents=True)
    spec.write_bytes(case[0].read_bytes())
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PBS_", "SLURM_", "MASTER_", "SPRITE_"))}
    env["PATH"] = f"{folder / 'bin'}{os.pathsep}{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    before = _tree(folder)
    for args in (["run", "--dry-run", "--json", "--spec", str(spec)], ["sbatch", str(spec)]):
        done = subprocess.run([*sprite_cmd, *args], cwd=spec.parent, env=env, capture_output=True, text=True,
                              timeout=120, preexec_fn=_limit_memory)
        assert "Traceback" not in done.stderr and done.returncode in (0, 2), done.stderr[-3000:]
        if done.returncode == 2:
            assert len(done.stderr.strip().splitlines()) == 1 and SOURCE.search(done.stderr) or \
                "schedules jobs with" in done.stderr, done.stderr
        elif args[0] == "run":
            assert set(json.loads(done.stdout)) == {"argv", "env"}
        else:
            script = Path(re.search(r"^script\s+(.+)$", done.stdout, re.M).group(1))
            changed = {k for k, v in _tree(folder).items() if before.get(k, "new") != v}
            allowed = {str(p.relative_to(folder)) for p in (script, *script.parents) if folder in p.parents}
            assert changed <= allowed, (changed, allowed)
