"""``sprite run --stage``: the environment packed once, broadcast, unpacked on every node, ranks run from the copy.

The staged environment is a small venv made for these tests (benchmarks/startup_scale.py: hard links to this
venv's torch, Lightning and sprite; the Hugging Face stack and plotting left out), so what is packed and unpacked
is real torch and Lightning at about 1 GB, not the 1.4 GB of this venv. Node-local storage is a fresh folder in
/dev/shm (a ramdisk, as on Aurora); the archive cache is one per session, so the second launch reuses it.
The launches: a real single-node Slurm (sbcast), and two simulated Hydra nodes (a PBS nodefile listing
127.0.0.1 and 127.0.0.2, HYDRA_LAUNCHER=fork) whose "nodes" share this machine's /dev/shm: there the first
node's unpacker unpacks and the other waits for it (node.py).
"""

from __future__ import annotations

import importlib.util
import io
import json
import os
import re
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

from conftest import sprite_free_env

from slurm_cluster import slurm  # noqa: F401  (fixture)
from sprite.launch.stage import archive as archmod
from sprite.errors import UsageError
from sprite.launch.stage import node

REPO = Path(__file__).resolve().parent.parent
VENV_BIN = str(Path(sys.executable).parent)
STRIP = ("MASTER_ADDR", "MASTER_PORT", "RANK", "WORLD_SIZE", "LOCAL_RANK", "NODE_RANK", "LOCAL_WORLD_SIZE",
         "GROUP_RANK", "PBS_JOBID", "PBS_NODEFILE", "SLURM_JOB_ID", "SLURM_JOB_NODELIST", "SLURM_NODELIST",
         "SLURM_NTASKS_PER_NODE", "SLURM_TASKS_PER_NODE", "HYDRA_LAUNCHER", "TMPDIR", "SPRITE_STAGE_CACHE")
FIT = '''
import json, os, sys
import lightning as L, torch
from torch.utils.data import DataLoader, TensorDataset

class M(L.LightningModule):
    def __init__(self):
        super().__init__()
        self.net = torch.nn.Linear(4, 1)
    def training_step(self, batch, batch_idx):
        return self.net(batch[0]).pow(2).mean()
    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)

L.Trainer(max_steps=2, logger=False, enable_checkpointing=False, enable_progress_bar=False,
          enable_model_summary=False).fit(M(), DataLoader(TensorDataset(torch.randn(32, 4)), batch_size=8))
attempt = os.environ.get("SPRITE_ATTEMPT", "1")
with open(os.path.join(sys.argv[1], f"rank{os.environ['RANK']}.json"), "w") as out:
    json.dump({"torch": torch.__file__, "lightning": L.__file__, "prefix": sys.prefix,
               "base_prefix": sys.base_prefix, "os": os.__file__, "attempt": attempt}, out)
if len(sys.argv) > 2 and sys.argv[2] == "--fail-first" and attempt == "1" and os.environ["RANK"] == "1":
    raise RuntimeError("the first attempt fails after its fit, so --retries relaunches it")
'''


def _bench():
    spec = importlib.util.spec_from_file_location("startup_scale", REPO / "benchmarks" / "startup_scale.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="session")
def small_venv(tmp_path_factory) -> str:
    """A venv holding real torch, Lightning and sprite (hard links), its python."""
    return _bench().make_small_venv(str(tmp_path_factory.mktemp("stagevenv") / "venv"))


@pytest.fixture(scope="session")
def stage_cache(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("stagecache")


@pytest.fixture
def node_local(tmp_path):
    """A fresh folder on the ramdisk standing for every node's local storage; must be empty at the end."""
    base = Path("/dev/shm") if os.path.isdir("/dev/shm") else tmp_path
    folder = Path(__import__("tempfile").mkdtemp(prefix="sprite-test-stage-", dir=base))
    yield folder
    # torch's own compile cache ($TMPDIR/torchinductor_<user>) is the script's, not the stage's
    left = sorted(name for name in os.listdir(folder) if not name.startswith("torchinductor_"))
    for entry in os.listdir(folder):  # clean up, then fail below on what the stage left
        __import__("shutil").rmtree(folder / entry, ignore_errors=True)
    folder.rmdir()
    assert not left, f"the stage left {left} behind"


def _env(extra: dict) -> dict:
    env = sprite_free_env(STRIP)
    env["PATH"] = f"{VENV_BIN}{os.pathsep}{env.get('PATH', '')}"  # MPICH's mpiexec
    return {**env, **extra}


def _stage_record(run_dir: Path) -> dict:
    kinds = [json.loads(line) for line in (run_dir / "audit.jsonl").read_text().splitlines()]
    return next(entry for entry in kinds if entry["kind"] == "stage")


def _check_ranks(out: Path, ranks: int, stage_dir: str, attempt: str = "1") -> None:
    for rank in range(ranks):
        seen = json.loads((out / f"rank{rank}.json").read_text())
        assert seen["attempt"] == attempt, (rank, seen)
        for key in ("torch", "lightning", "os"):
            assert seen[key].startswith(stage_dir + "/"), (rank, key, seen[key])
        assert seen["prefix"] == f"{stage_dir}/env" and seen["base_prefix"] == f"{stage_dir}/base"


# ---- the archive itself --------------------------------------------------------------------------------------
def _tar(*members) -> bytes:
    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for info, body in members:
            tar.addfile(info, io.BytesIO(body) if body is not None else None)
    return raw.getvalue()


def _member(name, kind=tarfile.REGTYPE, link="", body=b"x"):
    info = tarfile.TarInfo(name)
    info.type, info.linkname = kind, link
    info.size = len(body) if kind == tarfile.REGTYPE else 0
    return info, body if kind == tarfile.REGTYPE else None


@pytest.mark.parametrize("member", [
    _member("/etc/evil"), _member("a/../../evil"), _member("link", tarfile.SYMTYPE, "/etc/passwd"),
    _member("link", tarfile.SYMTYPE, "../outside"), _member("hard", tarfile.LNKTYPE, "x"),
    _member("dev", tarfile.CHRTYPE),
], ids=["absolute", "dotdot", "link-absolute", "link-up", "hardlink", "device"])
def test_a_member_leaving_the_folder_is_refused_and_nothing_lands_outside(tmp_path, member):
    archive = tmp_path / "a.tar"
    archive.write_bytes(_tar(_member("ok.txt"), member))
    dest = tmp_path / "dest"
    dest.mkdir()
    with pytest.raises(archmod.UnsafeArchive):
        archmod.unpack(str(archive), str(dest), None)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.tar", "dest"]


def test_an_archive_that_does_not_hash_as_packed_is_refused(tmp_path):
    archive = tmp_path / "a.tar"
    archive.write_bytes(_tar(_member("ok.txt")))
    (tmp_path / "d").mkdir()
    with pytest.raises(archmod.UnsafeArchive, match="SHA-256"):
        archmod.unpack(str(archive), str(tmp_path / "d"), "0" * 64)


def test_unpacking_drops_setuid_and_group_write_keeps_mtimes_and_a_link_pointing_down(tmp_path):
    """docs/staging.md: modes lose setuid, setgid, sticky and group/other write; mtimes are kept; a relative link
    without .. is accepted; a fifo is refused."""
    loose, _ = _member("bin/tool")
    loose.mode, loose.mtime = 0o7777, 1000  # setuid, setgid and sticky
    down, _ = _member("lib/current", tarfile.SYMTYPE, "v1/mod.py")
    archive = tmp_path / "a.tar"
    archive.write_bytes(_tar((loose, b"x"), _member("lib/v1/mod.py"), (down, None)))
    dest = tmp_path / "dest"
    dest.mkdir()
    archmod.unpack(str(archive), str(dest), archmod.digest(str(archive)))
    tool = dest / "bin" / "tool"
    assert oct(tool.stat().st_mode & 0o7777) == oct(0o755) and tool.stat().st_mtime == 1000
    assert os.readlink(dest / "lib" / "current") == "v1/mod.py" and (dest / "lib" / "current").read_bytes() == b"x"
    fifo = tmp_path / "f.tar"
    fifo.write_bytes(_tar(_member("pipe", tarfile.FIFOTYPE)))
    (tmp_path / "d2").mkdir()
    with pytest.raises(archmod.UnsafeArchive):
        archmod.unpack(str(fifo), str(tmp_path / "d2"), None)


def _one_module_environment(tmp_path: Path):
    """(a Source class, the files of an environment of one module) for the archive cache's tests."""
    class Source:
        def manifest(self):
            return {"python": "3"}

    module = tmp_path / "env" / "m.py"
    module.parent.mkdir()
    module.write_text("x = 1\n")
    return Source, [("m.py", str(module), os.lstat(module))]


def test_the_archive_is_packed_once_per_fingerprint_and_a_stray_one_is_refused_untouched(tmp_path, monkeypatch):
    """docs/staging.md: a launch that finds the record reuses the archive; a changed environment gets a new
    fingerprint; the archive is linked into place, never over a file that is there without its record."""
    from sprite.launch.stage import run as stagerun

    monkeypatch.setattr(stagerun, "RECORD_WAIT", 0.2)

    Source, files = _one_module_environment(tmp_path)
    cache = str(tmp_path / "cache")
    first = stagerun.cached_archive(cache, Source(), files, "ab" * 32)
    again = stagerun.cached_archive(cache, Source(), files, "ab" * 32)
    assert first[3] is False and again == (first[0], first[1], first[2], True)
    assert Path(first[0]).name == f"sprite-env-{'ab' * 16}.tar"
    stray = Path(cache) / f"sprite-env-{'cd' * 16}.tar"
    stray.write_bytes(b"not sprite's")
    with pytest.raises(stagerun.StageFailed, match="without its record"):
        stagerun.cached_archive(cache, Source(), files, "cd" * 32)
    assert stray.read_bytes() == b"not sprite's" and sorted(os.listdir(cache)) == sorted(
        [Path(first[0]).name, Path(first[0]).name + ".json", stray.name])


def test_the_stage_cache_is_shared_safely_between_launches_and_taken_only_from_this_user(tmp_path, monkeypatch):
    """Two launches packing one environment at once: the second to link reuses the first's archive and record
    (it was refused, and told to remove an archive other nodes may be reading). A file named as another launch's
    temporary one is never removed. A cache others may write to, or an archive that is a symlink, is refused
    (exit 2): the ranks would run what it holds."""
    from sprite.launch.stage import run as stagerun

    Source, files = _one_module_environment(tmp_path)
    cache = tmp_path / "cache"
    archive = cache / f"sprite-env-{'ab' * 16}.tar"
    cache.mkdir(mode=0o700)
    theirs = cache / f"{archive.name}.partial-{os.getpid()}"
    theirs.write_bytes(b"another launch's half-packed archive")
    real_pack = stagerun.archmod.pack

    def pack_while_another_launch_finishes(files, manifest, fd):
        found = real_pack(files, manifest, fd)
        archive.write_bytes(b"the other launch's archive")
        (cache / f"{archive.name}.json").write_text(json.dumps({"sha256": "e" * 64, "bytes": 26}))
        return found

    monkeypatch.setattr(stagerun.archmod, "pack", pack_while_another_launch_finishes)
    got = stagerun.cached_archive(str(cache), Source(), files, "ab" * 32)
    assert got == (str(archive), "e" * 64, 26, True)
    assert theirs.read_bytes() == b"another launch's half-packed archive"
    assert sorted(os.listdir(cache)) == sorted([archive.name, archive.name + ".json", theirs.name])

    # a record seen half-written (an older sprite wrote it in place) is waited for, not called damaged
    import threading

    monkeypatch.setattr(stagerun, "RECORD_WAIT", 10.0)
    late = cache / f"sprite-env-{'ef' * 16}.tar"
    late.write_bytes(b"another launch's archive")
    (cache / f"{late.name}.json").write_text("")
    filled = threading.Timer(0.3, lambda: (cache / f"{late.name}.json").write_text(
        json.dumps({"sha256": "d" * 64, "bytes": 24})))
    filled.start()
    assert stagerun.cached_archive(str(cache), Source(), files, "ef" * 32) == (str(late), "d" * 64, 24, True)
    filled.join()
    monkeypatch.setattr(stagerun.archmod, "pack", real_pack)  # this launch packs its own: no temporary name stays
    mine = stagerun.cached_archive(str(cache), Source(), files, "12" * 32)
    assert mine[3] is False and not [name for name in os.listdir(cache) if "partial" in name and name != theirs.name]
    os.chmod(cache, 0o770)
    with pytest.raises(UsageError, match="not this user's alone"):
        stagerun.cached_archive(str(cache), Source(), files, "ab" * 32)
    os.chmod(cache, 0o700)
    elsewhere = tmp_path / "planted.tar"
    elsewhere.write_bytes(b"planted")
    other = cache / f"sprite-env-{'cd' * 16}.tar"
    other.symlink_to(elsewhere)
    (cache / f"{other.name}.json").write_text(json.dumps({"sha256": "f" * 64, "bytes": 7}))
    with pytest.raises(UsageError, match="symlink"):
        stagerun.cached_archive(str(cache), Source(), files, "cd" * 32)
    os.unlink(other)
    with pytest.raises(stagerun.StageFailed, match="record .* without its archive"):
        stagerun.cached_archive(str(cache), Source(), files, "cd" * 32)


def test_the_fingerprint_follows_size_mtime_mode_and_link_target_but_not_a_folders_mtime(tmp_path):
    """docs/staging.md: the cache key covers every entry's name, size, mtime in nanoseconds, mode and link
    target; a folder's mtime is left out (its changes show in its files)."""
    from sprite.launch.stage import source

    root = tmp_path / "lib"
    (root / "pkg").mkdir(parents=True)
    module = root / "pkg" / "m.py"
    module.write_text("x = 1\n")
    (root / "pkg" / "link").symlink_to("m.py")
    env = source.Source("venv", "3.11", (("env/lib", str(root)),))

    def key() -> str:
        return source.fingerprint(env, source.walk(env))

    first = key()
    os.utime(root / "pkg", ns=(1, 1))
    assert key() == first  # a folder's mtime alone: the same archive
    changes = [lambda: os.utime(module, ns=(5, 5)), lambda: module.write_text("x = 22\n"),
               lambda: module.chmod(0o600), lambda: ((root / "pkg" / "link").unlink(),
                                                     (root / "pkg" / "link").symlink_to("other.py"))]
    seen = {first}
    for change in changes:
        change()
        now = key()
        assert now not in seen  # each change gives a new key
        seen.add(now)


@pytest.mark.parametrize("flavour, wanted", [
    ("pals", ["mpiexec", "-n", "3", "--ppn", "1", "--hosts", "a,b,c", "--envall"]),
    ("hydra", ["mpiexec", "-n", "3", "-ppn", "1", "-hosts", "a,b,c"]),
    ("openmpi", ["mpirun", "-n", "3", "--map-by", "ppr:1:node", "--host", "a:1,b:1,c:1", "-x", "PATH", "-x",
                 "PYTHONSAFEPATH"]),
    ("srun", ["srun", "--nodes", "3", "--ntasks", "3", "--ntasks-per-node", "1", "--nodelist", "a,b,c",
              "--kill-on-bad-exit=1", "--export=ALL"]),
])
def test_the_node_tool_runs_once_a_node_through_each_launcher(flavour, wanted):
    """docs/staging.md: one process per node, through the job's own launcher (PALS's and Open MPI's forms are
    read from their documentation, not run here); no scheduler: here, once."""
    from types import SimpleNamespace

    from sprite.launch.stage.plan import per_node

    world = SimpleNamespace(flavour=flavour, alloc=SimpleNamespace(scheduler="pbs"))
    assert list(per_node(world, ("a", "b", "c"), "/py", False)) == [*wanted, "/py", "-m", "sprite.launch.stage.node"]
    here = SimpleNamespace(flavour="local", alloc=SimpleNamespace(scheduler="none"))
    assert list(per_node(here, ("vm",), "/py", False)) == ["/py", "-m", "sprite.launch.stage.node"]
    in_a_job = SimpleNamespace(flavour="local", alloc=SimpleNamespace(scheduler="pbs"))  # --launcher local in a job
    assert list(per_node(in_a_job, ("vm",), "/py", False)) == ["/py", "-m", "sprite.launch.stage.node"]


def test_the_local_launcher_inside_a_batch_job_stages_on_its_own_machine(tmp_path):
    """--launcher local inside a PBS job (one node) stages here, as without a scheduler; it was refused with
    torchrun's message."""
    from sprite.launch.plan import plan_run

    nodefile = tmp_path / "nodes"
    nodefile.write_text("127.0.0.1\n")
    (tmp_path / "t.py").write_text("print(1)\n")
    env = _env({"PBS_JOBID": "9.sim", "PBS_NODEFILE": str(nodefile)})
    plan = plan_run({"script": str(tmp_path / "t.py"), "stage": "/dev/shm/x", "launcher": "local",
                     "accelerator": "cpu", "devices": "1"}, env)
    assert plan.stage.broadcast == "local" and plan.stage.per_node[1:] == ("-m", "sprite.launch.stage.node")


def test_the_archive_cache_is_where_docs_staging_says(tmp_path):
    """$SPRITE_STAGE_CACHE, else $XDG_CACHE_HOME/sprite/stage, else ~/.cache/sprite/stage."""
    from sprite.launch.stage.plan import cache_dir

    assert cache_dir({"SPRITE_STAGE_CACHE": "/lus/x", "XDG_CACHE_HOME": "/y", "HOME": "/h"}) == "/lus/x"
    assert cache_dir({"XDG_CACHE_HOME": "/y", "HOME": "/h"}) == "/y/sprite/stage"
    assert cache_dir({"HOME": "/h"}) == "/h/.cache/sprite/stage"


def test_the_node_tool_makes_its_folder_for_this_user_alone(tmp_path, monkeypatch):
    """docs/staging.md: the node tool makes the folder itself, mode 0700, whatever the umask."""
    import stat

    old = os.umask(0)
    try:
        assert node.claim(str(tmp_path / "stage"), "tok") is True
    finally:
        os.umask(old)
    assert stat.S_IMODE(os.lstat(tmp_path / "stage").st_mode) == 0o700


def test_a_stage_folder_is_marked_for_one_invocation_alone(tmp_path):
    """Every attempt of one sprite run shares its stage folder's token; another invocation given the same
    --run-dir in the same job gets another, so a folder a run before kept (--keep-stage) is refused, not adopted
    unchecked and then removed."""
    from sprite import contract
    from sprite.launch.stage.plan import token_of

    run_env = {contract.RUN_DIR: str(tmp_path / "run")}
    mine = token_of(run_env, "77")
    assert token_of(dict(run_env), "77") == mine and re.fullmatch(r"[0-9a-f]{16}", mine)
    code = f"from sprite.launch.stage.plan import token_of; print(token_of({run_env!r}, '77'))"
    other = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, env=_env({}),
                           check=True).stdout.strip()
    assert re.fullmatch(r"[0-9a-f]{16}", other) and other != mine


def test_the_node_tool_exits_2_for_a_folder_that_is_not_its_own(tmp_path):
    """The per-node tool (python -m sprite.launch.stage.node) refuses a folder it did not make with exit 2 (a
    symlink to one here: a real folder of this user without a marker is waited for first, 10 s)."""
    theirs = tmp_path / "theirs"
    theirs.mkdir()
    (theirs / "keep.txt").write_text("mine")
    (tmp_path / "stage").symlink_to(theirs)
    done = subprocess.run([sys.executable, "-m", "sprite.launch.stage.node", "claim", "--dir",
                           str(tmp_path / "stage"), "--token", "t0"], capture_output=True, text=True, timeout=60,
                          env=_env({}))
    assert done.returncode == 2 and done.stderr.count("\n") == 1, done.stderr
    assert sorted(os.listdir(theirs)) == ["keep.txt"] and (theirs / "keep.txt").read_text() == "mine"


def test_processes_sharing_a_folder_stop_waiting_when_its_unpacker_fails(tmp_path, monkeypatch):
    """Of the processes of one run that share a stage folder (a shared file system, or simulated nodes), one
    unpacks and the others wait for its ready mark; when the unpack fails (here the archive does not hash as
    recorded), the others stop at once with its reason instead of waiting WAIT_SECONDS, since mpiexec would not
    end them."""
    import time

    monkeypatch.setattr(node, "WAIT_SECONDS", 20.0)
    archive = tmp_path / "env.tar"
    archive.write_bytes(_tar(_member("env/x.py")))
    folder = str(tmp_path / "stage")
    with pytest.raises(archmod.UnsafeArchive):
        node.unpack(folder, "tok", str(archive), "0" * 64)  # the first process: it unpacks, and fails
    start = time.monotonic()
    with pytest.raises(OSError, match="unpacked the shared folder on .* failed .*UnsafeArchive"):
        node.unpack(folder, "tok", str(archive), "0" * 64)  # a second process of the run, sharing the folder
    assert time.monotonic() - start < 5
    assert not os.path.exists(os.path.join(folder, node.READY)) and not os.path.exists(os.path.join(folder, "env"))
    assert node.remove(folder, "tok") == "removed"


def test_remove_leaves_a_folder_that_is_not_this_runs_alone(tmp_path):
    theirs = tmp_path / "theirs"
    theirs.mkdir()
    (theirs / "data").write_text("keep")
    assert "left" in node.remove(str(theirs), "token")
    assert (theirs / "data").read_text() == "keep"
    assert node.claim(str(tmp_path / "mine"), "token") is True
    assert node.claim(str(tmp_path / "mine"), "token") is False
    with pytest.raises(Exception, match="another sprite run"):
        node.claim(str(tmp_path / "mine"), "other")
    assert node.remove(str(tmp_path / "mine"), "token") == "removed"


def test_a_claim_that_meets_a_folder_this_run_is_making_waits_for_its_marker(tmp_path, monkeypatch):
    """Two slurmd nodes sharing one folder: one made it and had not yet written its marker when the other's claim
    found it, which refused it as not sprite's (a fresh-clone CI run of 6d374e6)."""
    import json
    import threading

    folder = tmp_path / "shared"
    folder.mkdir(mode=0o700)  # the other node's mkdir, its marker still to come
    later = threading.Timer(0.3, lambda: (folder / node.MARKER).write_text(json.dumps({"token": "token"})))
    later.start()
    try:
        assert node.claim(str(folder), "token") is False  # held by this run: waited, then found its marker
    finally:
        later.cancel()
    monkeypatch.setattr(node, "CLAIM_GRACE_SECONDS", 0.3)
    (tmp_path / "theirs").mkdir()
    with pytest.raises(Exception, match="exists and was not made by sprite"):
        node.claim(str(tmp_path / "theirs"), "token")  # no marker ever comes: refused after the grace
    assert os.listdir(tmp_path / "theirs") == []


# ---- bad input -----------------------------------------------------------------------------------------------
@pytest.mark.parametrize("flags, says", [
    (["--stage", "relative/dir"], "not an absolute folder path"),
    (["--stage", "/"], "not an absolute folder path"),
    (["--keep-stage"], "nothing is staged"),
    (["--stage", "auto", "--launcher", "torchrun"], "does not work with torchrun"),
])
def test_bad_stage_input_is_one_line_and_exit_2(sprite_cmd, tmp_path, flags, says):
    script = tmp_path / "t.py"
    script.write_text("print(1)\n")
    done = subprocess.run([*sprite_cmd, "run", "--dry-run", *flags, str(script)], capture_output=True, text=True,
                          env=_env({}), cwd=tmp_path)
    assert done.returncode == 2, done.stderr
    assert says in done.stderr and done.stderr.count("\n") == 1 and "Traceback" not in done.stderr


def test_dry_run_shows_the_stage_and_the_ranks_run_its_python(sprite_cmd, tmp_path):
    script = tmp_path / "t.py"
    script.write_text("print(1)\n")
    done = subprocess.run([*sprite_cmd, "run", "--dry-run", "--json", "--devices", "2", "--stage", "/dev/shm/x",
                           str(script)], capture_output=True, text=True, env=_env({}), cwd=tmp_path, check=True)
    plan = json.loads(done.stdout)
    assert plan["stage"]["dir"] == "/dev/shm/x" and plan["stage"]["broadcast"] == "local"
    assert plan["stage"]["python"] in plan["argv"]
    assert not os.path.exists("/dev/shm/x")


@pytest.mark.parametrize("written, staged", [("true", True), ("TRUE", True), ("auto", True), ("false", False),
                                               ("off", False)])
def test_a_specs_stage_key_takes_the_words_docs_staging_names(written, staged, tmp_path):
    """docs/staging.md: `stage: auto` (or `true`, `off`/`false`, or an absolute folder) in a spec."""
    from sprite.launch.plan import plan_run

    (tmp_path / "t.py").write_text("print(1)\n")
    spec = tmp_path / "s.job.yaml"
    spec.write_text(f"site: local\nscript: t.py\ndevices: 1\naccelerator: cpu\nstage: {written}\n")
    assert (plan_run({}, _env({}), str(spec)).stage is not None) is staged


def test_keep_stage_leaves_the_copies_on_the_nodes(tmp_path, monkeypatch):
    """docs/staging.md: --keep-stage (spec: keep_stage: true) keeps the folder; without it the end of the run removes
    it on every node (FAKE node steps record what would run)."""
    from sprite.launch.plan import plan_run
    from sprite.launch.stage import run as stagerun

    (tmp_path / "t.py").write_text("print(1)\n")
    steps = []
    monkeypatch.setattr(stagerun, "_step", lambda argv, what, seconds=None: steps.append(what) or "")
    for keep, wanted in ((True, []), (None, ["remove the stage folders"])):
        steps.clear()
        plan = plan_run({"script": str(tmp_path / "t.py"), "stage": "/dev/shm/x", "keep_stage": keep}, _env({}))
        assert plan.stage.keep is bool(keep)
        stagerun.unstage(plan.stage)
        assert steps == wanted


def test_a_stage_step_that_hangs_is_stopped_with_everything_it_started(monkeypatch, capfd):
    """A node that hangs must not hang the run: a stage step still running after its time (docs/staging.md: 30
    minutes, removing the copies 5) is stopped, the processes it started too (here a shell and a child of it), and
    staging fails in one line; removing the copies says so and goes on."""
    import time

    from sprite.launch.stage import run as stagerun

    assert (stagerun.STEP_SECONDS, stagerun.REMOVE_SECONDS) == (1800.0, 300.0)
    monkeypatch.setattr(stagerun, "STEP_SECONDS", 1.0)  # the default a step gets
    start = time.monotonic()
    with pytest.raises(stagerun.StageFailed, match="still running after 1 s"):
        stagerun._step(["sh", "-c", "sleep 31.7 & sleep 31.7"], "unpack")
    assert time.monotonic() - start < 10
    left = subprocess.run(["pgrep", "-f", "sleep 31.7"], capture_output=True, text=True)
    assert left.stdout == "", left.stdout
    monkeypatch.setattr(stagerun, "STEP_SECONDS", 60.0)
    monkeypatch.setattr(stagerun, "REMOVE_SECONDS", 1.0)  # removing the copies has a limit of its own
    hung = stagerun.StagePlan("/x", "t", "/py", ("a",), ("sh", "-c", "sleep 31.8 & sleep 31.8", "--"), "local", "/c")
    start = time.monotonic()
    stagerun.unstage(hung)
    assert time.monotonic() - start < 10 and "still running after 1 s" in capfd.readouterr().err
    assert subprocess.run(["pgrep", "-f", "sleep 31.8"], capture_output=True, text=True).stdout == ""


@pytest.mark.parametrize("sig", ["SIGTERM", "SIGHUP"])
def test_a_sigterm_to_sprite_while_a_stage_step_runs_ends_the_step_too(sig):
    """The step runs in a session of its own (so a hung one can be stopped whole): a SIGTERM or SIGHUP that ends
    sprite stops the step and what it started first, then ends sprite as the signal does."""
    import signal
    import time

    sig = getattr(signal, sig)
    code = ("from sprite.launch.stage import run\n"
            "pause = 'sleep 43.' + '9'  # so that this command line does not match pgrep's pattern\n"
            "run._step(['sh', '-c', f'{pause} & {pause}'], 'unpack')\n")
    proc = subprocess.Popen([sys.executable, "-c", code], env=_env({}), stderr=subprocess.PIPE)
    deadline = time.monotonic() + 30
    while subprocess.run(["pgrep", "-f", "sleep 43.9"], capture_output=True).returncode != 0:
        assert time.monotonic() < deadline and proc.poll() is None, "the step never started"
        time.sleep(0.1)
    proc.send_signal(sig)
    assert proc.wait(timeout=30) == -sig
    time.sleep(0.5)
    assert subprocess.run(["pgrep", "-f", "sleep 43.9"], capture_output=True, text=True).stdout == ""


def test_copies_kept_for_after_the_run_are_removed_when_the_preflight_stopped_it(tmp_path, monkeypatch):
    """--keep-stage keeps the copies for a look after the run; a run the preflight stopped ran no attempt, so its
    copies are removed (a kept folder is never reused: a later run refuses a folder that is not its own). Staging
    and the preflight are FAKES here: this checks run_all's decision."""
    from sprite.launch.stage import run as stagerun
    from sprite.recovery import entry

    script = tmp_path / "t.py"
    script.write_text("print(1)\n")
    flags = {"script": str(script), "stage": str(tmp_path / "stage"), "keep_stage": True, "accelerator": "cpu",
             "devices": "1"}
    run, plan = entry.prepare(flags, None, str(tmp_path / "run"), _env({}))
    removed = []
    monkeypatch.setattr(stagerun, "stage", lambda p: {"dir": p.dir, "hosts": 1, "bytes": 1, "cached": True,
                                                      "pack_seconds": 0.0, "broadcast_seconds": 0.0})
    monkeypatch.setattr(stagerun, "unstage", lambda p: removed.append(p.keep))

    class Stops:  # a preflight that finds no room to leave its failed nodes out
        def check(self, run, plan):
            return lambda: None

    assert entry.run_all(run, plan, preflight=Stops()) == 1
    assert removed == [False]
    assert json.loads((tmp_path / "run" / "run.json").read_text())["status"] == "preflight failed"

    class Raises:  # the rendezvous port was taken between the check and the preflight's launch
        def check(self, run, plan):
            def go():
                raise UsageError("The rendezvous port 29500 on vm is already in use.", "", "")
            return go

    from sprite.errors import UsageError

    removed.clear()
    run, plan = entry.prepare(flags, None, str(tmp_path / "run2"), _env({}))
    with pytest.raises(UsageError):
        entry.run_all(run, plan, preflight=Raises())
    said = json.loads((tmp_path / "run2" / "run.json").read_text())
    assert said["status"] == "preflight failed" and "29500" in said["error"] and removed == [False]


def test_when_staging_fails_the_preflight_finds_the_node_unstaged_and_staging_goes_on_without_it(tmp_path,
                                                                                                 monkeypatch):
    """Staging comes before the preflight, so a node that is down fails the staging first: the preflight then runs
    from the installed environment, as it did before staging came first, and staging is tried again on the nodes
    it keeps; the attempts run on those. Three simulated PBS nodes; staging, the preflight and the attempts are
    FAKES here (the real ones have tests of their own): this checks run_all's decisions."""
    from sprite.launch.stage import run as stagerun
    from sprite.recovery import entry

    nodefile = tmp_path / "nodes"
    nodefile.write_text("127.0.0.1\n127.0.0.2\n127.0.0.3\n")
    env = _env({"PBS_JOBID": "77.sim", "PBS_NODEFILE": str(nodefile), "HYDRA_LAUNCHER": "fork"})
    script = tmp_path / "t.py"
    script.write_text("print(1)\n")
    flags = {"script": str(script), "stage": str(tmp_path / "stage"), "accelerator": "cpu", "devices": "1",
             "nodes": "2", "launcher": "mpiexec", "mpi": "hydra", "preflight": True}
    run, plan = entry.prepare(flags, None, str(tmp_path / "run"), env)
    staged, removed, preflighted, attempted = [], [], [], []

    def stage(p):
        staged.append(p.hosts)
        if "127.0.0.2" in p.hosts:
            raise stagerun.StageFailed("--stage: could not unpack (exit 1).", "127.0.0.2 is down.", "Fix it.")
        return {"dir": p.dir, "hosts": len(p.hosts), "bytes": 1, "cached": True, "pack_seconds": 0.0,
                "broadcast_seconds": 0.0}

    class Preflight:
        def check(self, run, plan):
            preflighted.append(plan.stage)
            return lambda: run.plan(1, {**run.flags, "exclude": ["127.0.0.2"]})

    monkeypatch.setattr(stagerun, "stage", stage)
    monkeypatch.setattr(stagerun, "unstage", lambda p: removed.append(p.hosts))
    monkeypatch.setattr(entry, "_checked_attempts", lambda run, plan, base, checked: attempted.append(checked()))
    entry.run_all(run, plan, preflight=Preflight())
    every, kept = ("127.0.0.1", "127.0.0.2", "127.0.0.3"), ("127.0.0.1", "127.0.0.3")
    assert staged == [every, kept]
    assert preflighted[0] is not None and preflighted[1] is None  # checked on the copy first, then run unstaged
    assert attempted[0].world.hosts == kept and attempted[0].stage.hosts == kept
    assert removed == [every, kept]  # the failed staging's folders, then the copies the attempts used
    records = [json.loads(line)["kind"] for line in (tmp_path / "run" / "audit.jsonl").read_text().splitlines()]
    assert records == ["stage", "stage"]
    assert json.loads((tmp_path / "run" / "run.json").read_text())["status"] == "running"  # not "stage failed"

    # Under srun the first staging writes to every node of the job with sbcast; staged again without the failed
    # node, the kept nodes read the archive instead (sbcast would write to that node too).
    staged.clear(), removed.clear(), preflighted.clear()
    slurm_env = _env({"SLURM_JOB_ID": "78", "SLURM_JOB_NODELIST": "127.0.0.[1-3]", "SLURM_NTASKS_PER_NODE": "1"})
    flags = {**flags, "launcher": "srun", "mpi": None}
    run, plan = entry.prepare(flags, None, str(tmp_path / "run2"), slurm_env)
    broadcasts = []
    monkeypatch.setattr(stagerun, "stage", lambda p: broadcasts.append(p.broadcast) or stage(p))
    entry.run_all(run, plan, preflight=Preflight())
    assert staged == [every, kept] and broadcasts == ["sbcast", "read"]
    assert attempted[-1].stage.per_node[:9] == ("srun", "--nodes", "2", "--ntasks", "2", "--ntasks-per-node", "1",
                                               "--nodelist", "127.0.0.1,127.0.0.3")

    # A folder that is not sprite's is no node's fault: that refusal stands at once (no preflight run for nothing),
    # and --keep-stage keeps nothing, no attempt having run.
    preflighted.clear(), removed.clear()
    run, plan = entry.prepare({**flags, "keep_stage": True}, None, str(tmp_path / "run3"), slurm_env)
    monkeypatch.setattr(stagerun, "stage", lambda p: (_ for _ in ()).throw(UsageError("not sprite's folder")))
    monkeypatch.setattr(stagerun, "unstage", lambda p: removed.append(p.keep))
    with pytest.raises(UsageError):
        entry.run_all(run, plan, preflight=Preflight())
    assert len(preflighted) == 1 and removed == [False]


def test_a_bad_preflight_input_is_refused_before_anything_is_staged(sprite_cmd, tmp_path):
    """docs/preflight.md: the preflight's inputs are checked before the staging: a fault naming a host outside
    the allocation ends the run at once (exit 2), nothing packed or broadcast, run.json saying why."""
    script = tmp_path / "t.py"
    script.write_text("print(1)\n")
    cache = tmp_path / "cache"
    done = subprocess.run([*sprite_cmd, "run", "--run-dir", str(tmp_path / "run"), "--stage", "auto",
                           "--accelerator", "cpu", "--devices", "1", "--preflight", "--preflight-fault",
                           "n9:hang", str(script)], capture_output=True, text=True, cwd=tmp_path, timeout=120,
                          env=_env({"SPRITE_STAGE_CACHE": str(cache), "TMPDIR": str(tmp_path)}))
    assert done.returncode == 2, done.stderr[-2000:]
    assert done.stderr.count("\n") == 1 and done.stderr.startswith("sprite: error: --preflight-fault 'n9:hang'")
    assert "staged" not in done.stderr
    assert not cache.exists() and not list(tmp_path.glob("sprite-stage-*"))
    summary = json.loads((tmp_path / "run" / "run.json").read_text())
    assert summary["status"] == "preflight refused" and "n9" in summary["error"]


def test_a_stage_folder_that_is_not_sprites_is_refused_and_left_as_it_was(sprite_cmd, tmp_path, stage_cache):
    theirs = tmp_path / "theirs"
    theirs.mkdir()
    (theirs / "notes.txt").write_text("mine")
    script = tmp_path / "t.py"
    script.write_text("print(1)\n")
    done = subprocess.run([*sprite_cmd, "run", "--run-dir", str(tmp_path / "run"), "--stage", str(theirs),
                           str(script)], capture_output=True, text=True, cwd=tmp_path,
                          env=_env({"SPRITE_STAGE_CACHE": str(tmp_path / "cache")}))
    assert done.returncode == 2, done.stderr
    assert "was not made by sprite" in done.stderr
    assert sorted(os.listdir(theirs)) == ["notes.txt"] and (theirs / "notes.txt").read_text() == "mine"
    # The failed staging is in the run's record: its audit trail (sprite runs lists and verifies it) and run.json.
    record = _stage_record(tmp_path / "run")
    assert record["ok"] is False and "was not made by sprite" in record["error"] and record["dir"] == str(theirs)
    assert json.loads((tmp_path / "run" / "run.json").read_text())["status"] == "stage failed"
    verified = subprocess.run([*sprite_cmd, "runs", "verify", str(tmp_path / "run")], capture_output=True, text=True,
                              env=_env({}))
    assert verified.returncode == 0, verified.stderr
    assert not (tmp_path / "cache").exists()  # refused before anything was packed


# ---- real launches -------------------------------------------------------------------------------------------
@pytest.mark.slow
def test_stage_under_slurm_broadcasts_with_sbcast_and_every_rank_imports_the_copy(
        slurm, small_venv, stage_cache, node_local, tmp_path):
    fit = tmp_path / "fit.py"
    fit.write_text(FIT)
    stage_dir = str(node_local / "stage")
    env = _env({"SLURM_CONF": slurm.env["SLURM_CONF"], "SPRITE_STAGE_CACHE": str(stage_cache)})
    cmd = ["salloc", "-N", "1", "--ntasks-per-node=2", "--quiet", small_venv, "-m", "sprite", "run", "--run-dir",
           str(tmp_path / "run"), "--launcher", "srun", "--devices", "2", "--stage", stage_dir, str(fit),
           str(tmp_path)]
    done = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=tmp_path, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    _check_ranks(tmp_path, 2, stage_dir)
    record = _stage_record(tmp_path / "run")
    assert record["broadcast"] == "sbcast" and record["shared_folder"] is False and record["dir"] == stage_dir
    assert len(record["sha256"]) == 64 and record["bytes"] > 0 and record["files"] > 0
    assert record["pack_seconds"] >= 0 and record["broadcast_seconds"] > 0
    said = re.search(r"sprite: staged (\d+) MB \((packed|cached archive) in [\d.]+ s, on 1 node\(s\) in [\d.]+ s\)"
                     rf" to {re.escape(stage_dir)}\n", done.stderr)
    assert said and int(said.group(1)) == round(record["bytes"] / 1e6), done.stderr[-3000:]
    import sprite

    if "site-packages" not in sprite.__file__:  # an editable install's source folders stay shared, and are named
        assert any("/sprite" in path or path.endswith("/parity") for path in record["shared"])
    assert not os.path.exists(stage_dir)
    assert len(list(stage_cache.glob("*.tar"))) == 1 and not list(stage_cache.glob("*.partial-*"))


@pytest.mark.slow
def test_stage_then_preflight_the_copy_on_three_simulated_hydra_nodes_reusing_the_cached_archive(
        small_venv, stage_cache, node_local, tmp_path):
    """docs/staging.md and docs/preflight.md: with --preflight the environment is staged first, on every usable
    node, and the preflight's ranks run the copy; a node it fails is left out, and its copy is removed too. A
    relaunch (--retries) runs the same copy: staged once, for every attempt."""
    fit = tmp_path / "fit.py"
    fit.write_text(FIT)
    nodefile = tmp_path / "nodefile"
    nodefile.write_text("127.0.0.1\n127.0.0.2\n127.0.0.3\n")
    env = _env({"PBS_JOBID": "4343.sim", "PBS_NODEFILE": str(nodefile), "HYDRA_LAUNCHER": "fork",
                "SPRITE_STAGE_CACHE": str(stage_cache), "TMPDIR": str(node_local)})
    first_archives = sorted(stage_cache.glob("*.tar"))
    cmd = [small_venv, "-m", "sprite", "run", "--run-dir", str(tmp_path / "run"), "--launcher", "mpiexec", "--mpi",
           "hydra", "--nodes", "2", "--devices", "1", "--stage", "auto", "--preflight", "--retries", "1",
           "--preflight-fault", "127.0.0.2:wrong-result", str(fit), str(tmp_path), "--fail-first"]
    # About 20 s here; under mpiexec the first attempt's rank 0 ends only because its failing peer tells it to.
    done = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=tmp_path, timeout=240)
    assert done.returncode == 0, done.stderr[-3000:]
    record = _stage_record(tmp_path / "run")
    assert record["broadcast"] == "read" and record["hosts"] == 3
    assert record["dir"].startswith(str(node_local) + "/sprite-stage-")
    _check_ranks(tmp_path, 2, record["dir"], attempt="2")  # the relaunch's ranks wrote last, from the copy
    preflight_ranks = sorted((tmp_path / "run" / "preflight" / "ranks").glob("rank*.compute.json"))
    assert len(preflight_ranks) == 3, done.stderr[-3000:]
    for path in preflight_ranks:  # the preflight's ranks imported torch from the copy too
        found = json.loads(path.read_text()).get("torch_from", "")
        assert found.startswith(record["dir"] + "/"), (path.name, found)
    audit = [json.loads(line) for line in (tmp_path / "run" / "audit.jsonl").read_text().splitlines()]
    kinds = [entry["kind"] for entry in audit]
    assert kinds.index("stage") < kinds.index("preflight") < kinds.index("launch")
    assert next(entry for entry in audit if entry["kind"] == "preflight")["left_out"] == ["127.0.0.2"]
    assert next(entry for entry in audit if entry["kind"] == "launch")["hosts"] == ["127.0.0.1", "127.0.0.3"]
    assert kinds.count("stage") == 1 and kinds.count("attempt_start") == 2, kinds
    # All three "nodes" ran the node tool: one unpacked, the others found this run's copy on the shared ramdisk.
    assert done.stderr.count("unpacked") == 3, done.stderr[-3000:]
    # ... and all three are asked to remove it, the node left out too (node_local fails the test if it stays).
    # The three nodes' tools print at once, so their lines may run together (seen in CI): count the words alone.
    # ": removed" also counts "removed by another process of this run".
    assert done.stderr.count(": removed") + done.stderr.count(": nothing to remove") == 3, done.stderr[-3000:]
    if first_archives:  # the Slurm test ran first in this session: this launch packed nothing
        assert record["cached"] is True and sorted(stage_cache.glob("*.tar")) == first_archives


@pytest.fixture(scope="module")
def two_slurmd(tmp_path_factory):
    """Two slurmd (n1, n2) on this machine: two Slurm nodes that share its file system and /dev/shm."""
    import slurm_cluster

    yield from slurm_cluster.start_nodes(tmp_path_factory.mktemp("stage-nodes"), ["n1", "n2"])


def _two_slurmd_run(cluster, python: str, cache: Path, out: Path, *flags: str) -> subprocess.CompletedProcess:
    """``sprite run --launcher srun --devices 1 FLAGS fit.py OUT`` inside ``salloc -N 2`` of the two slurmd."""
    fit = out / "fit.py"
    fit.write_text(FIT)
    env = _env({"SLURM_CONF": cluster.env["SLURM_CONF"], "SPRITE_STAGE_CACHE": str(cache),
                "MASTER_ADDR": "127.0.0.1"})
    cmd = ["salloc", "-N", "2", "--ntasks-per-node=1", "--quiet", python, "-m", "sprite", "run", "--run-dir",
           str(out / "run"), "--launcher", "srun", "--devices", "1", *flags, str(fit), str(out)]
    return subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=out, timeout=600)


@pytest.mark.slow
def test_stage_on_two_slurmd_nodes_sharing_one_folder_unpacks_once_and_every_rank_imports_the_copy(
        two_slurmd, small_venv, stage_cache, node_local, tmp_path):
    stage_dir = str(node_local / "stage")
    done = _two_slurmd_run(two_slurmd, small_venv, stage_cache, tmp_path, "--nodes", "2", "--stage", stage_dir)
    assert done.returncode == 0, done.stderr[-3000:]
    _check_ranks(tmp_path, 2, stage_dir)
    record = _stage_record(tmp_path / "run")
    # Both slurmd see one /dev/shm: the second claim finds this run's folder, so the nodes read the cached archive
    # (sbcast would write one path twice); one unpacks, the other waits for it.
    assert record["shared_folder"] is True and record["broadcast"] == "read", record
    assert record["hosts"] == 2 and record["dir"] == stage_dir
    assert "sbcast: error" not in done.stderr and "unpacked" in done.stderr and "already unpacked" in done.stderr
    assert not os.path.exists(stage_dir), done.stderr[-3000:]


@pytest.mark.slow
def test_stage_under_srun_leaves_an_excluded_node_out_and_the_kept_node_reads_the_archive(
        two_slurmd, small_venv, stage_cache, node_local, tmp_path):
    """docs/staging.md: sbcast writes to every node of the job, so with a node left out (--exclude here; the
    preflight's failed nodes alike) the kept nodes read the cached archive through srun --nodelist."""
    stage_dir = str(node_local / "stage-x")
    done = _two_slurmd_run(two_slurmd, small_venv, stage_cache, tmp_path, "--nodes", "1", "--exclude", "n2",
                           "--stage", stage_dir)
    assert done.returncode == 0, done.stderr[-3000:]
    _check_ranks(tmp_path, 1, stage_dir)
    record = _stage_record(tmp_path / "run")
    assert record["broadcast"] == "read" and record["shared_folder"] is False and record["hosts"] == 1, record
    assert "sbcast" not in done.stderr and not os.path.exists(stage_dir), done.stderr[-3000:]


def test_a_site_profiles_job_block_can_stage_by_default_into_its_stage_root(tmp_path):
    """docs/staging.md: a site profile gives `stage: auto` under `job:` as a default, and `stage_root` for where
    `auto` makes its folder (else $TMPDIR, else /tmp); a flag still turns it off."""
    from sprite.launch.plan import plan_run

    site = tmp_path / "site.yaml"
    ssd = tmp_path / "local-ssd"
    ssd.mkdir()
    site.write_text(f"name: ssd\nscheduler: none\njob:\n  stage: auto\n  accelerator: cpu\nstage_root: {ssd}\n")
    (tmp_path / "t.py").write_text("print(1)\n")
    env = _env({"TMPDIR": str(tmp_path / "tmp")})
    (tmp_path / "tmp").mkdir()
    plan = plan_run({"script": str(tmp_path / "t.py"), "site": str(site), "devices": "1"}, env)
    assert re.fullmatch(re.escape(str(ssd)) + r"/sprite-stage-[0-9a-f]{16}", plan.stage.dir), plan.stage.dir
    assert plan.stage.python in plan.argv  # the ranks run the staged interpreter
    site.write_text("name: plain\nscheduler: none\njob:\n  stage: auto\n  accelerator: cpu\n")
    plan = plan_run({"script": str(tmp_path / "t.py"), "site": str(site), "devices": "1"}, env)
    assert plan.stage.dir.startswith(str(tmp_path / "tmp") + "/sprite-stage-")
    off = plan_run({"script": str(tmp_path / "t.py"), "site": str(site), "devices": "1", "stage": "off"}, env)
    assert off.stage is None
    # staging here: a folder whose parent is gone is refused before anything is packed
    for where, says in ((tmp_path / "gone" / "stage", "cannot be made: .*gone is gone"),
                        ("/proc/sprite-stage", "is under /proc, a kernel file system"),
                        ("/dev/sprite-stage", "is under /dev, a kernel file system")):
        with pytest.raises(UsageError, match=says):
            plan_run({"script": str(tmp_path / "t.py"), "site": str(site), "devices": "1", "stage": str(where)},
                     env)
    # inside a batch job the folder is on the compute node: a plan made for a job script on a login node
    # (sprite qsub, --launcher local) must not look for it here
    nodefile = tmp_path / "nodes"
    nodefile.write_text("127.0.0.1\n")
    in_job = {**env, "PBS_JOBID": "9.sim", "PBS_NODEFILE": str(nodefile)}
    job = plan_run({"script": str(tmp_path / "t.py"), "devices": "1", "launcher": "local", "accelerator": "cpu",
                    "stage": "/local_ssd_on_the_node/stage"}, in_job)
    assert job.stage.dir == "/local_ssd_on_the_node/stage"
    ramdisk = plan_run({"script": str(tmp_path / "t.py"), "devices": "1", "stage": "/dev/shm/sprite-x"}, env)
    assert ramdisk.stage.dir == "/dev/shm/sprite-x"  # /dev/shm is a ramdisk, the place docs/staging.md suggests
    with pytest.raises(UsageError, match="too long a path"):
        plan_run({"script": str(tmp_path / "t.py"), "devices": "1", "stage": "/tmp/" + "a" * 300}, env)


def test_the_copper_route_starts_copper_reads_through_its_view_and_stops_it(tmp_path, monkeypatch):
    """docs/staging.md, ALCF Copper (not available here: the steps are FAKES that record their argv): with the site
    profile's `copper: .../launch_copper.sh`, sprite runs it, every node unpacks the archive read through Copper's
    view (/tmp/$USER/copper/<archive path>), and at the end the copies go and `stop_copper.sh` runs."""
    from sprite.launch.plan import plan_run
    from sprite.launch.stage import run as stagerun

    nodefile = tmp_path / "nodes"
    nodefile.write_text("x1\nx2\n")
    site = tmp_path / "aurora-like.yaml"
    site.write_text("name: copperish\nscheduler: pbs\nmpi: pals\ncopper: /soft/copper/launch_copper.sh\n"
                    "job:\n  accelerator: cpu\n")
    (tmp_path / "t.py").write_text("print(1)\n")
    env = _env({"PBS_JOBID": "5.sim", "PBS_NODEFILE": str(nodefile), "USER": "alice"})
    plan = plan_run({"script": str(tmp_path / "t.py"), "site": str(site), "devices": "1", "nodes": "2",
                     "stage": "/local/stage"}, env).stage
    assert plan.broadcast == "copper" and plan.copper == ("/soft/copper/launch_copper.sh",
                                                          "/soft/copper/stop_copper.sh")
    ran = []
    monkeypatch.setenv("USER", "alice")
    monkeypatch.setattr(stagerun, "cached_archive", lambda *a: ("/home/alice/.cache/env.tar", "e" * 64, 9, True))
    monkeypatch.setattr(stagerun.source, "walk", lambda src: [])
    monkeypatch.setattr(stagerun.source, "fingerprint", lambda src, files: "f" * 64)
    monkeypatch.setattr(stagerun, "_step", lambda argv, what, seconds=None: ran.append(list(argv)) or "")
    assert stagerun.stage(plan)["broadcast"] == "copper"
    assert ran[0] == ["/soft/copper/launch_copper.sh"]
    assert ran[1][:len(plan.per_node)] == list(plan.per_node) and ran[1][len(plan.per_node):] == [
        "unpack", "--dir", "/local/stage", "--token", plan.token, "--archive",
        "/tmp/alice/copper/home/alice/.cache/env.tar", "--sha256", "e" * 64]
    ran.clear()
    stagerun.unstage(plan)
    assert ran[0][len(plan.per_node):len(plan.per_node) + 1] == ["remove"]
    assert ran[1] == ["/soft/copper/stop_copper.sh"]


@pytest.mark.parametrize("system_site", [False, True])
def test_what_is_staged_of_a_venv_a_conda_environment_and_a_system_python(tmp_path, monkeypatch, system_site):
    """docs/staging.md, "What is staged": a venv's lib (and lib64), the base's stdlib and include, without the
    stdlib's own tests and build folders (test, idlelib, tkinter, turtledemo, ensurepip, lib2to3, config-*) and,
    unless include-system-site-packages, without the base's site-packages; a conda environment whole but for its
    package cache and metadata; any other Python (a system /usr) is refused."""
    from sprite.launch.stage import source

    version = f"{sys.version_info[0]}.{sys.version_info[1]}"
    venv, base, conda = tmp_path / "venv", tmp_path / "base", tmp_path / "conda"
    lib = base / "lib" / f"python{version}"
    for name in (*source.SKIP_STDLIB, "site-packages", f"config-{version}-x86_64-linux-gnu", "json"):
        (lib / name).mkdir(parents=True)
    (base / "include").mkdir()
    (venv / "lib").mkdir(parents=True)
    (venv / "pyvenv.cfg").write_text(f"include-system-site-packages = {str(system_site).lower()}\n")
    monkeypatch.setattr(sys, "prefix", str(venv))
    monkeypatch.setattr(sys, "base_prefix", str(base))
    found = source.current()
    assert found.kind == "venv" and dict(found.roots) == {
        "env/lib": str(venv / "lib"), f"base/lib/python{version}": str(lib), "base/include": str(base / "include")}
    skipped = {os.path.basename(path) for path in found.skip}
    assert skipped == {*source.SKIP_STDLIB, f"config-{version}-x86_64-linux-gnu",
                       *(() if system_site else ("site-packages",))}
    assert found.system_site is system_site
    (conda / "conda-meta").mkdir(parents=True)
    monkeypatch.setattr(sys, "prefix", str(conda))
    monkeypatch.setattr(sys, "base_prefix", str(conda))
    found = source.current()
    assert found.kind == "conda" and dict(found.roots) == {"base": str(conda)}
    assert {"pkgs", "conda-meta", "share", "man", "doc"} <= {os.path.basename(path) for path in found.skip}
    monkeypatch.setattr(sys, "prefix", str(base))
    monkeypatch.setattr(sys, "base_prefix", str(base))
    with pytest.raises(UsageError, match="neither a virtual nor a conda environment"):
        source.current()
