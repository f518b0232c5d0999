"""A warm server: one process that has imported torch and Lightning forks CPU ranks for every launch on this
machine, so that repeated launches (a test suite, a CI job, a laptop) stop paying the import in every rank.

    python -m sprite.launch.warmserver --socket DIR/warm.sock &
    export SPRITE_WARM_SERVER=DIR/warm.sock

Every ``python -m sprite.runtime`` that sees ``SPRITE_WARM_SERVER`` hands its rank to this server
(sprite.contract.warm) and stays as the launcher's process for it, whatever the launcher: the local supervisor
(which then imports nothing itself), MPICH Hydra, ``srun``, torchrun. The server forks a rank only where a fork
computes what a fresh interpreter computes: the same Python, sprite and ``PYTHON*`` variables as the server's, and
ranks on CPU (the rule of sprite.launch.warmstart); otherwise it refuses and the rank starts as it always did.
The forked rank is set up as sprite.launch.warmstart sets up its own, and also takes the requester's working
directory, umask, resource limits, CPU affinity, ignored signals, ``sys.path`` and inherited descriptors, and
OpenMP threads from its ``OMP_NUM_THREADS``. Differences that remain: the rank's ``/proc/PID/cmdline`` and
``environ`` are the server's, and the rank is not in its launcher's process tree or cgroup (the requester is).

The socket is made owner-only, and a connection from another user is refused. An existing path is never
replaced. SIGTERM or SIGINT stops the server and removes its socket; the ranks it forked die with it.
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import os
import resource
import selectors
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from sprite.contract import warm
from sprite.launch import warmstart
from sprite.launch.procgroup import die_with_parent

READY_SECONDS = 180.0  # a private server's imports; past this its launches start their ranks fresh


class Stop(Exception):
    """SIGTERM or SIGINT reached the server."""


def refusal(req: dict, mine: dict) -> str | None:
    """Why this server must not fork the rank ``req`` describes; None: it may."""
    theirs = req.get("fingerprint") or {}
    for key in mine:
        if theirs.get(key) != mine[key]:
            return f"its {key} differs from the server's"
    cmd = [sys.executable, "-m", "sprite.runtime"]
    if not warmstart.wanted(cmd, req.get("env") or {}):
        return "its ranks are not on CPU (SPRITE_ACCELERATOR), or SPRITE_FORK_RANKS=0"
    return None


def _become(req: dict, fds: list[int], threads: int) -> warmstart.Rank:
    """In the forked child, once the server's own sockets, pipes and files are closed: take over the requester's
    descriptors (at their numbers) and process settings, then the rank's."""
    targets = [int(fd) for fd in req["fds"]]
    floor = max([*targets, *fds, 2]) + 1
    high = [fcntl.fcntl(fd, fcntl.F_DUPFD, floor) for fd in fds]  # out of the way of every target number
    for fd in {*fds, 0, 1, 2}:  # the received copies, and the server's own standard streams
        os.close(fd)
    for src, dst in zip(high, targets):
        os.dup2(src, dst)  # dup2 leaves the copy inheritable, as the requester's was
    for fd in high:
        os.close(fd)
    os.chdir(req["cwd"])
    os.umask(int(req["umask"]))
    for name, (soft, hard) in req["rlimits"].items():
        which = getattr(resource, name, None)
        if which is not None and resource.getrlimit(which) != (soft, hard):
            try:
                resource.setrlimit(which, (soft, hard))
            except (ValueError, OSError):
                pass  # a limit only a privileged process may raise: the server's stays
    try:
        os.sched_setaffinity(0, req["affinity"])
    except (OSError, ValueError):
        pass
    warmstart.become_rank(req["env"])
    for sig in req["ignored"]:
        signal.signal(sig, signal.SIG_IGN)
    sys.path[:] = req["sys_path"]
    import torch

    wanted = req["env"].get("OMP_NUM_THREADS", "")
    torch.set_num_threads(int(wanted) if wanted.isdigit() and int(wanted) > 0 else threads)
    warm.SERVED = True
    return warmstart.Rank(argv=list(req["argv"]))


class Server:
    """The accept, fork and reap loop. ``serve`` returns only in a forked child: the rank it is to run."""

    def __init__(self, listener: socket.socket, log, threads: int):
        self.listener = listener
        self.log = log
        self.threads = threads
        self.mine = warm.fingerprint(os.environ)
        self.ranks: dict[int, socket.socket] = {}  # forked pid -> the requester's connection
        self.selector = selectors.DefaultSelector()
        self.wake_r, self.wake_w = os.pipe()
        os.set_blocking(self.wake_r, False)
        os.set_blocking(self.wake_w, False)
        signal.set_wakeup_fd(self.wake_w, warn_on_full_buffer=False)
        signal.signal(signal.SIGCHLD, lambda signum, frame: None)
        self.selector.register(listener, selectors.EVENT_READ, "accept")
        self.selector.register(self.wake_r, selectors.EVENT_READ, "wake")

    def note(self, line: str) -> None:
        self.log.write(f"{time.strftime('%H:%M:%S')} {line}\n")
        self.log.flush()

    def serve(self) -> warmstart.Rank:
        while True:
            for key, _ in self.selector.select(timeout=1.0):
                if key.data == "accept":
                    child = self.accept()
                    if child is not None:
                        return child
                elif key.data == "wake":
                    try:
                        while os.read(self.wake_r, 512):
                            pass
                    except BlockingIOError:
                        pass
                else:  # a requester's connection: it closed (it died) while its rank runs
                    self.requester_gone(key.data, key.fileobj)
            self.reap()

    def accept(self) -> warmstart.Rank | None:
        conn, _ = self.listener.accept()
        fds: list[int] = []
        try:
            conn.settimeout(10.0)
            if warm.peer_uid(conn) != os.getuid():
                self.note("refused a connection from another user")
                conn.close()
                return None
            req, fds = warm.receive(conn, warm.MAX_FDS)
            if req is None or len(fds) != len(req.get("fds", ())):
                raise ValueError("an incomplete request")
            why = refusal(req, self.mine)
            if why:
                self.note(f"refused {req.get('argv', [])[:1]}: {why}")
                warm.send(conn, {"refused": why})
                conn.close()
                for fd in fds:
                    os.close(fd)
                return None
        except (OSError, ValueError, KeyError, TypeError) as err:
            self.note(f"dropped a request: {err}")
            conn.close()
            for fd in fds:
                os.close(fd)
            return None
        sys.stdout.flush()
        sys.stderr.flush()
        self.log.flush()
        pid = os.fork()
        if pid == 0:
            self.close_all(conn)
            return _become(req, fds, self.threads)
        for fd in fds:
            os.close(fd)
        self.ranks[pid] = conn
        self.note(f"forked rank pid {pid}: {' '.join(req['argv'])[:200]}")
        try:
            warm.send(conn, {"pid": pid})
            conn.settimeout(None)
            self.selector.register(conn, selectors.EVENT_READ, pid)
        except OSError:
            self.requester_gone(pid, conn)
        return None

    def close_all(self, conn: socket.socket) -> None:
        """In a forked child: close every socket, pipe and file of the server, so none lingers in the rank (and
        no object of the server's closes a descriptor number the rank has reused)."""
        for other in [conn, *self.ranks.values()]:
            other.close()
        self.selector.close()
        self.listener.close()
        signal.set_wakeup_fd(-1)
        os.close(self.wake_r)
        os.close(self.wake_w)
        if self.log not in (sys.stdout, sys.stderr):
            self.log.close()

    def requester_gone(self, pid: int, conn: socket.socket) -> None:
        """The requester died or closed: its rank must not outlive it (its launcher counts it gone)."""
        try:
            os.killpg(pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        self.forget(pid)

    def forget(self, pid: int) -> None:
        conn = self.ranks.pop(pid, None)
        if conn is not None:
            try:
                self.selector.unregister(conn)
            except (KeyError, ValueError):
                pass
            conn.close()

    def reap(self) -> None:
        while True:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            code = os.waitstatus_to_exitcode(status)
            conn = self.ranks.get(pid)
            if conn is not None:
                try:
                    warm.send(conn, {"exit": code})
                except OSError:
                    pass
            self.note(f"rank pid {pid} ended: {code}")
            try:
                os.killpg(pid, signal.SIGKILL)  # what the rank left in its group (a loader worker)
            except (ProcessLookupError, PermissionError):
                pass
            self.forget(pid)


def listen(path: Path) -> socket.socket:
    """A new owner-only socket at ``path``; refuses a path that exists (never replaced)."""
    if os.path.lexists(path):
        raise FileExistsError(f"{path} exists")
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    mask = os.umask(0o177)
    try:
        sock.bind(str(path))
    finally:
        os.umask(mask)
    sock.listen(64)
    return sock


def command(sock, log, modules: tuple[str, ...] = ()) -> list[str]:
    """The command line of a warm server listening at ``sock``, logging to the new file ``log``, that imports
    ``modules`` too."""
    cmd = [sys.executable, "-m", "sprite.launch.warmserver", "--socket", os.fspath(sock), "--log", os.fspath(log)]
    for name in modules:
        cmd += ["--import", name]
    return cmd


def environment(base) -> dict:
    """A server's environment: ``base`` with the PYTHONSAFEPATH that sprite's plans give every rank (a server
    refuses ranks whose PYTHON* settings differ from its own; :func:`main` started without it starts again with
    it)."""
    return {**base, "PYTHONSAFEPATH": "1"}


@contextlib.contextmanager
def private(modules: tuple[str, ...] = (), say=lambda line: None, meanwhile=lambda: None):
    """A warm server of this process's own for the launches it makes inside the block (SPRITE_WARM_SERVER set
    for them), stopped and removed after; without effect when one is set already. When it does not start, the
    launches start their ranks fresh, as without it. ``meanwhile()`` runs while the server imports (the caller's
    own preparation, on another core), or at once when there is no server to wait for."""
    if os.environ.get(warm.SERVER):
        meanwhile()
        yield
        return
    folder = tempfile.mkdtemp(prefix="sprite-warm-")  # 0700, and a short path: a socket path has ~100 bytes
    sock = os.path.join(folder, "s.sock")
    say("starting a warm server for the CPU launches (sprite.launch.warmserver)")
    server = subprocess.Popen(command(sock, os.path.join(folder, "log"), modules), env=environment(os.environ),
                              stdin=subprocess.DEVNULL,
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, cwd=folder,
                              preexec_fn=die_with_parent)  # a killed caller leaves no server behind
    deadline = time.monotonic() + READY_SECONDS
    try:
        meanwhile()
    except BaseException:
        server.kill()
        server.wait()
        shutil.rmtree(folder, ignore_errors=True)
        raise
    while not os.path.exists(sock) and server.poll() is None and time.monotonic() < deadline:
        time.sleep(0.02)
    if not os.path.exists(sock):
        say("the warm server did not start; the ranks start as fresh interpreters")
    os.environ[warm.SERVER] = sock
    try:
        yield
    finally:
        del os.environ[warm.SERVER]
        server.terminate()
        try:
            server.wait(timeout=10)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait()
        shutil.rmtree(folder, ignore_errors=True)


@contextlib.contextmanager
def withheld():
    """No warm server for the launches made inside the block (all of them start their ranks the same way)."""
    saved = os.environ.pop(warm.SERVER, None)
    try:
        yield
    finally:
        if saved is not None:
            os.environ[warm.SERVER] = saved


def main(argv: list[str] | None = None):
    parser = argparse.ArgumentParser(prog="python -m sprite.launch.warmserver",
                                     description=__doc__.split("\n\n")[0],
                                     epilog="example: python -m sprite.launch.warmserver --socket "
                                            "/tmp/$USER-sprite/warm.sock & export SPRITE_WARM_SERVER=...")
    parser.add_argument("--socket", type=Path, required=True, help="the Unix socket to create (a new path; its "
                        "folder must exist)")
    parser.add_argument("--log", type=Path, help="write one line per request to this new file (default: stderr)")
    parser.add_argument("--import", dest="modules", action="append", default=[], metavar="MODULE",
                        help="also import MODULE before serving (repeatable), for scripts that all import it")
    args = parser.parse_args(argv)
    if not sys.platform.startswith("linux"):
        parser.error("the warm server needs Linux (SO_PEERCRED, /proc, CPU affinity); ranks start fresh elsewhere")
    if os.path.lexists(args.socket):
        parser.error(f"{args.socket} exists; sprite never replaces a path: remove it or choose another")
    if args.log and os.path.lexists(args.log):
        parser.error(f"{args.log} exists; sprite never writes into a file it did not create: choose a new --log")
    if not args.socket.parent.is_dir():
        parser.error(f"{args.socket.parent} is not a folder; make it first")
    if len(os.fsencode(args.socket)) > 100:
        parser.error(f"{args.socket} is longer than a Unix socket path may be (about 100 bytes); choose a shorter")
    import importlib.util

    for name in args.modules:
        try:
            found = importlib.util.find_spec(name) is not None
        except (ImportError, ValueError):
            found = False
        if not found:
            parser.error(f"--import {name}: no such module in this Python; install it or drop the option")
    if argv is None and os.environ.get("PYTHONSAFEPATH") != "1":
        # started by hand (python -m ..., as docs/run.md shows): become the server sprite's ranks can use, whose
        # PYTHON* settings are theirs, and whose import path, like theirs, leaves out the folder it started in
        os.execve(sys.executable, [sys.executable, "-m", __spec__.name, *sys.argv[1:]], environment(os.environ))
    os.environ.pop("OMP_NUM_THREADS", None)  # OpenMP reads it once, at load: each rank sets its own threads
    if not warmstart.warm_up(None, tuple(args.modules)):
        return 1
    import torch

    threads = torch.get_num_threads()
    log = sys.stderr
    if args.log:  # a new file, 0600, never through a symlink
        fd = os.open(args.log, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
        log = os.fdopen(fd, "w", encoding="utf-8")
    server_pid = os.getpid()

    def stop(signum, frame):
        raise Stop

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    listener = listen(args.socket)
    made = os.stat(args.socket)
    print(f"sprite: warm server ready at {args.socket} (pid {server_pid})", file=sys.stderr, flush=True)
    try:
        return Server(listener, log, threads).serve()
    except Stop:
        return 0
    finally:
        if os.getpid() == server_pid:  # a forked rank leaves through here too: the socket is not its own
            try:
                now = os.stat(args.socket)
                if (now.st_dev, now.st_ino) == (made.st_dev, made.st_ino):
                    os.unlink(args.socket)
            except OSError:
                pass


if __name__ == "__main__":
    outcome = main()
    if isinstance(outcome, warmstart.Rank):
        warmstart.run(outcome)
    else:
        sys.exit(outcome)
