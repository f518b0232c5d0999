"""The warm server (sprite.launch.warmserver) and its client in every rank (sprite.contract.warm): a served rank is
a fork that has what a fresh interpreter would have had, ends as the rank ends, takes the launcher's signals, dies
with its stand-in, and a rank the server must not fork runs as it always did."""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from sprite.contract import warm

from conftest import OUTSIDE_CHECKOUT, WARM_SERVER, start_warm_server, stop_warm_server

FRESH_RANKS = True  # this module's own server, whose log it reads (conftest.py)
PROBE = str(Path(__file__).resolve().parent / "scripts" / "warm_served.py")
PLAIN = str(Path(__file__).resolve().parent / "scripts" / "any_plain.py")


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    """Started as docs/run.md shows, without the PYTHONSAFEPATH=1 sprite gives every rank: the server starts
    again with it (warmserver.main), so the ranks below are served, not refused for PYTHON* settings."""
    folder = tmp_path_factory.mktemp("server")
    proc, sock = start_warm_server(folder, {k: v for k, v in os.environ.items() if k != "PYTHONSAFEPATH"},
                                   as_typed=True)
    deadline = time.monotonic() + 180
    while not sock.exists():
        assert proc.poll() is None, (folder / "server.err").read_text()
        assert time.monotonic() < deadline, "the warm server did not start in 180 s"
        time.sleep(0.2)
    yield sock, folder / "warm.log"
    stop_warm_server(proc)
    assert not sock.exists()  # removed when the server stops


def start(sock: Path, out: Path, mode: str = "", env: dict | None = None, **popen) -> subprocess.Popen:
    full = {**{k: v for k, v in os.environ.items() if k != WARM_SERVER}, WARM_SERVER: str(sock),
            "SPRITE_ACCELERATOR": "cpu", "PYTHONSAFEPATH": "1", "OMP_NUM_THREADS": "1", **(env or {})}
    return subprocess.Popen([sys.executable, "-m", "sprite.runtime", PROBE, str(out), *([mode] if mode else [])],
                            cwd=out, env=full, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, **popen)


def record(out: Path, timeout: float = 120) -> dict:
    deadline = time.monotonic() + timeout
    while not (out / "probe.json").exists():
        assert time.monotonic() < deadline, "the rank wrote no record"
        time.sleep(0.05)
    return json.loads((out / "probe.json").read_text())


def test_a_served_rank_takes_the_requesters_process_settings(server, tmp_path):
    sock, log = server
    read, write = os.pipe()
    os.write(write, b"from the launcher")
    os.close(write)

    def as_a_launcher_left_it():
        os.umask(0o027)
        import resource

        resource.setrlimit(resource.RLIMIT_NOFILE, (512, resource.getrlimit(resource.RLIMIT_NOFILE)[1]))
        os.sched_setaffinity(0, {0})
        signal.signal(signal.SIGHUP, signal.SIG_IGN)

    proc = start(sock, tmp_path, env={"PROBE_FD": str(read)}, pass_fds=(read,), preexec_fn=as_a_launcher_left_it)
    os.close(read)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err[-3000:]
    seen = record(tmp_path)
    assert seen["pid"] != proc.pid and f"forked rank pid {seen['pid']}" in log.read_text()  # a fork of the server
    assert seen["lightning_before"]  # imported by the server, not by this rank
    assert (seen["cwd"], seen["umask"], seen["nofile"], seen["affinity"]) == (str(tmp_path), 0o027, 512, [0])
    assert seen["threads"] == 1 and seen["hup_ignored"] and seen["fd_text"] == "from the launcher"
    assert seen["argv"] == [str(tmp_path)]


def test_the_rank_ends_its_stand_in_with_its_exit_code_or_its_signal(server, tmp_path):
    sock, _ = server
    for mode, wanted in (("exit3", 3), ("kill", -signal.SIGKILL), ("", 0)):
        out = tmp_path / (mode or "done")
        out.mkdir()
        proc = start(sock, out, mode)
        proc.communicate(timeout=120)
        assert record(out)["pid"] != proc.pid and proc.returncode == wanted, (mode, proc.returncode)


def test_the_stand_in_passes_on_the_signals_docs_run_md_names():
    names = [signal.Signals(sig).name.removeprefix("SIG") for sig in warm.PASSED_ON]
    assert names == ["TERM", "INT", "HUP", "QUIT", "USR1", "USR2", "ALRM"]


@pytest.mark.parametrize("sig", warm.PASSED_ON, ids=lambda sig: signal.Signals(sig).name)
def test_signals_to_the_stand_in_reach_the_rank(server, tmp_path, sig):
    sock, _ = server
    proc = start(sock, tmp_path, "signals")
    assert record(tmp_path)["pid"] != proc.pid
    proc.send_signal(sig)
    proc.communicate(timeout=60)
    assert proc.returncode == 0 and (tmp_path / f"got-{int(sig)}").exists()
    assert sorted(p.name for p in tmp_path.glob("got-*")) == [f"got-{int(sig)}"]


def test_a_killed_stand_in_takes_its_rank_with_it(server, tmp_path):
    sock, _ = server
    proc = start(sock, tmp_path, "sleep")
    pid = record(tmp_path)["pid"]
    assert pid != proc.pid and Path(f"/proc/{pid}").exists()
    proc.kill()
    proc.communicate(timeout=30)
    deadline = time.monotonic() + 20
    while Path(f"/proc/{pid}").exists():
        assert time.monotonic() < deadline, f"rank {pid} outlived its stand-in"
        time.sleep(0.1)


@pytest.mark.parametrize("env", [{"PYTHONHASHSEED": "7"}, {"SPRITE_ACCELERATOR": "cuda"}])
def test_a_rank_the_server_must_not_fork_runs_as_it_always_did(server, tmp_path, env):
    sock, log = server
    proc = start(sock, tmp_path, env=env)
    out, err = proc.communicate(timeout=180)
    assert proc.returncode == 0, err[-3000:]
    seen = record(tmp_path)
    assert seen["pid"] == proc.pid and not seen["lightning_before"]  # a fresh interpreter, as without a server
    reason = "env differs" if "PYTHONHASHSEED" in env else "not on CPU"
    assert reason in log.read_text()


def test_no_server_at_the_path_runs_the_rank_here(tmp_path):
    proc = start(tmp_path / "none.sock", tmp_path)
    proc.communicate(timeout=180)
    assert proc.returncode == 0 and record(tmp_path)["pid"] == proc.pid


def test_the_server_never_replaces_a_path_and_says_what_to_do(tmp_path):
    taken = tmp_path / "taken"
    taken.write_text("the user's")
    for path, log, said in ((taken, [], "exists"), (tmp_path / "s.sock", ["--log", str(taken)], "choose a new --log"),
                            (tmp_path / "no" / "s.sock", [], "is not a folder"),
                            (tmp_path / ("x" * 120), [], "longer than"),
                            (tmp_path / "s.sock", ["--import", "no_such_module_here"], "no such module")):
        done = subprocess.run([sys.executable, "-m", "sprite.launch.warmserver", "--socket", str(path), *log],
                              cwd=OUTSIDE_CHECKOUT, capture_output=True, text=True, timeout=60)
        assert done.returncode == 2 and said in done.stderr, done.stderr
    assert taken.read_text() == "the user's" and not (tmp_path / "s.sock").exists()


def test_a_message_carries_its_descriptors_and_a_closed_peer_reads_as_none():
    left, right = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    read, write = os.pipe()
    warm.send(left, {"argv": ["x"] * 5000}, [read])
    message, fds = warm.receive(right, warm.MAX_FDS)
    assert message == {"argv": ["x"] * 5000} and len(fds) == 1
    os.write(write, b"!")
    assert os.read(fds[0], 1) == b"!"
    left.close()
    assert warm.receive(right) == (None, [])
    for fd in (read, write, fds[0]):
        os.close(fd)
    right.close()


@pytest.mark.parametrize("setting, served", [("0", False), ("1", True)])
def test_the_suite_starts_its_server_unless_told_not_to(tmp_path, setting, served):
    probe = tmp_path / "test_probe.py"
    probe.write_text("import os\n\ndef test_server():\n"
                     f"    assert ('SPRITE_WARM_SERVER' in os.environ) is {served}\n")
    env = {**{k: v for k, v in os.environ.items() if k != WARM_SERVER}, "SPRITE_TEST_WARM": setting,
           "PYTHONPATH": str(Path(__file__).resolve().parent)}
    done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "conftest", "-p", "no:cacheprovider",
                           str(probe)], cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to listen as another user")
def test_a_socket_of_another_user_gets_neither_the_environment_nor_the_descriptors(tmp_path):
    folder = Path(tempfile.mkdtemp(prefix="sprite-other-user-"))  # pytest's own folders are root's only
    folder.chmod(0o777)
    sock, caught = folder / "s.sock", folder / "caught"
    listener = ("import os, socket, sys\n"
                "s = socket.socket(socket.AF_UNIX); s.bind(sys.argv[1]); os.chmod(sys.argv[1], 0o777); s.listen(1)\n"
                "conn, _ = s.accept(); conn.settimeout(20)\n"
                "data = conn.recv(65536)\n"
                "open(sys.argv[2], 'w').write(str(len(data)))\n")
    python = shutil.which("python3", path="/usr/bin:/bin")  # one that user may run (the venv's may be private)
    if python is None:
        pytest.skip("no system python3 for the other user")
    other = subprocess.Popen([python, "-c", listener, str(sock), str(caught)], cwd="/",
                             preexec_fn=lambda: os.setuid(65534))
    deadline = time.monotonic() + 60
    while not sock.exists():
        assert other.poll() is None and time.monotonic() < deadline, "the other user's listener did not start"
        time.sleep(0.05)
    out = tmp_path / "out"
    out.mkdir()
    proc = start(sock, out, env={"MY_TOKEN": "not for them"})
    proc.communicate(timeout=180)
    other.wait(timeout=60)
    assert proc.returncode == 0 and record(out)["pid"] == proc.pid  # ran here, as without a server
    said = caught.read_text()
    shutil.rmtree(folder)
    assert said == "0"  # the connection closed with nothing sent


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to connect as another user")
def test_the_socket_is_the_owners_only_and_a_connection_from_another_user_is_refused(server):
    """docs/run.md: the socket is made 0600; and a client of another user that gets to it all the same (here
    past a loosened mode, through a folder descriptor handed to it) is refused before the server reads a word:
    the server runs what a request asks, as its owner."""
    sock, log = server
    info = os.stat(sock)
    assert info.st_mode & 0o777 == 0o600 and info.st_uid == os.getuid()
    python = shutil.which("python3", path="/usr/bin:/bin")  # one that user may run (the venv's may be private)
    if python is None:
        pytest.skip("no system python3 for the other user")
    client = ("import socket, sys\n"
              "c = socket.socket(socket.AF_UNIX); c.settimeout(30); c.connect(sys.argv[1])\n"
              "data = b''\n"
              "try:\n"
              "    c.sendall(b'{\"argv\": [\"python\"]}' * 100)\n"
              "    while True:\n"
              "        got = c.recv(65536)\n"
              "        if not got: break\n"
              "        data += got\n"
              "except (BrokenPipeError, ConnectionResetError):\n"
              "    pass  # closed by the server\n"
              "print(len(data))\n")
    forked = log.read_text().count("forked rank pid")
    folder, mode = sock.parent, sock.parent.stat().st_mode & 0o777
    fd = os.open(folder, os.O_PATH)
    try:
        folder.chmod(0o711)
        sock.chmod(0o777)
        done = subprocess.run([python, "-c", client, f"/proc/self/fd/{fd}/{sock.name}"], pass_fds=(fd,), cwd="/",
                              preexec_fn=lambda: os.setuid(65534), capture_output=True, text=True, timeout=60)
    finally:
        sock.chmod(0o600)
        folder.chmod(mode)
        os.close(fd)
    assert done.returncode == 0 and done.stdout.strip() == "0", done.stderr[-2000:]  # closed, nothing said
    deadline = time.monotonic() + 30
    while "refused a connection from another user" not in log.read_text():
        assert time.monotonic() < deadline, log.read_text()[-2000:]
        time.sleep(0.05)
    assert log.read_text().count("forked rank pid") == forked


@pytest.mark.parametrize("launcher", [["--launcher", "mpiexec", "--mpi", "hydra"], ["--launcher", "torchrun"]],
                         ids=["mpich-hydra", "torchrun"])
def test_ranks_under_other_launchers_are_served_too(server, tmp_path, sprite_cmd, launcher):
    sock, log = server
    env = {**{k: v for k, v in os.environ.items() if k not in ("MASTER_ADDR", "MASTER_PORT", "RANK", "WORLD_SIZE")},
           WARM_SERVER: str(sock), "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"}
    done = subprocess.run([*sprite_cmd, "run", "--devices", "2", "--accelerator", "cpu", *launcher, "--run-dir",
                           str(tmp_path / "run"), PLAIN, str(tmp_path)], cwd=tmp_path, env=env, capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    seen = [json.loads((tmp_path / f"plain{rank}.json").read_text()) for rank in (0, 1)]
    assert [(s["sum"], s["warm_served"]) for s in seen] == [(3.0, True), (3.0, True)]


def _our_folders() -> set:
    return set(Path(tempfile.gettempdir()).glob("sprite-warm-*"))


def test_a_private_server_runs_the_callers_preparation_while_it_starts(monkeypatch):
    """sprite bench imports its plot while its server imports torch; a server that cannot start (here: an
    --import of a module that is not installed) leaves the launches to start fresh, its folder removed."""
    from sprite.launch import warmserver

    monkeypatch.delenv(warm.SERVER, raising=False)
    before, seen, said = _our_folders(), [], []
    with warmserver.private(("sprite_no_such_module",), said.append,
                            meanwhile=lambda: seen.append((os.environ.get(warm.SERVER), _our_folders() - before))):
        assert os.environ[warm.SERVER]
    assert len(seen) == 1 and seen[0][0] is None and len(seen[0][1]) == 1  # before the wait, its folder made
    assert said[-1] == "the warm server did not start; the ranks start as fresh interpreters"
    assert _our_folders() == before and warm.SERVER not in os.environ


def test_a_failed_preparation_stops_the_private_server_and_removes_its_folder(monkeypatch):
    from sprite.launch import warmserver

    monkeypatch.delenv(warm.SERVER, raising=False)
    before = _our_folders()

    def fail():
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        with warmserver.private((), meanwhile=fail):
            pass
    assert _our_folders() == before


def test_with_a_server_already_set_the_preparation_runs_at_once(monkeypatch):
    from sprite.launch import warmserver

    monkeypatch.setenv(warm.SERVER, "/nonexistent/theirs.sock")
    before, seen = _our_folders(), []
    with warmserver.private(("transformers",), meanwhile=lambda: seen.append(_our_folders())):
        assert os.environ[warm.SERVER] == "/nonexistent/theirs.sock"
    assert seen == [before]  # no server of its own started


@pytest.mark.parametrize("key", ["executable", "version", "prefix", "sprite", "env"])
def test_a_rank_of_another_python_or_sprite_install_is_not_forked(key):
    """The server forks only ranks that would have started as it did: the same interpreter, Python, prefix,
    sprite install (the folder sprite is imported from) and PYTHON* settings."""
    from sprite.launch import warmserver

    mine = warm.fingerprint({"PYTHONUNBUFFERED": "1"})
    cpu = {"SPRITE_ACCELERATOR": "cpu"}
    assert warmserver.refusal({"fingerprint": dict(mine), "env": cpu}, mine) is None
    theirs = {**mine, key: {"PYTHONOPTIMIZE": "1"} if key == "env" else "/elsewhere/" + key}
    assert warmserver.refusal({"fingerprint": theirs, "env": cpu}, mine) == f"its {key} differs from the server's"


@pytest.mark.slow
def test_sigterm_stops_the_server_removes_its_socket_and_its_ranks_die_with_it(tmp_path):
    """docs/run.md: SIGTERM stops the server and removes its socket; ranks still running die with it."""
    folder = tmp_path / "own"
    folder.mkdir()
    proc, sock = start_warm_server(folder)
    deadline = time.monotonic() + 180
    while not sock.exists():
        assert proc.poll() is None and time.monotonic() < deadline, (folder / "server.err").read_text()
        time.sleep(0.2)
    out = tmp_path / "rank"
    out.mkdir()
    rank = start(sock, out, "sleep")
    pid = record(out)["pid"]
    assert pid != rank.pid and Path(f"/proc/{pid}").exists()
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=30) is not None and not sock.exists()
    deadline = time.monotonic() + 20
    while _running(pid):
        assert time.monotonic() < deadline, f"rank {pid} outlived the server"
        time.sleep(0.1)
    rank.communicate(timeout=30)
    assert rank.returncode != 0  # its stand-in reports the rank's end


def _running(pid: int) -> bool:
    """Whether ``pid`` exists and is not a zombie waiting for its parent."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except (FileNotFoundError, ProcessLookupError):
        return False
