"""A rank started on a machine with a warm server runs as a fork of it instead of importing torch and Lightning.

``SPRITE_WARM_SERVER`` names the Unix socket of ``python -m sprite.launch.warmserver`` (docs/run.md, "A warm
server for repeated CPU launches"). ``python -m sprite.runtime`` calls :func:`delegate` before it imports anything
heavy: it connects, hands over what a fresh interpreter would have had (argv, environment, working directory,
umask, resource limits, CPU affinity, ignored signals, ``sys.path`` and every inherited file descriptor, its
standard streams and a launcher's PMI socket among them) and then stays as the launcher's process for the rank:
it passes on the signals it receives (:data:`PASSED_ON`) and ends as the rank ends, with its exit code or by its
signal. A socket that another user's process holds gets nothing: the environment may hold secrets. When this process dies, even by SIGKILL, the server kills the rank's process group. When no server
answers, or it refuses the rank (another Python, other ``PYTHON*`` variables, a GPU rank), the rank runs here as
it always did. This module is the wire format's one home: the server and the client both use it.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import struct
import sys

SERVER = "SPRITE_WARM_SERVER"  # path of the warm server's Unix socket; unset: every rank imports for itself
SERVED = False  # True in a rank the server forked: it must not delegate again
PASSED_ON = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGQUIT, signal.SIGUSR1, signal.SIGUSR2,
             signal.SIGALRM)
_HEADER = struct.Struct("!I")
MAX_MESSAGE = 16 << 20  # a request is an environment and a few lists: 16 MiB is far beyond any real one
MAX_FDS = 250  # SCM_RIGHTS carries at most 253 descriptors a message on Linux
REPLY_SECONDS = 60.0  # the server forks at once; no answer in a minute: run here instead
# What shapes an interpreter before any module runs; a fork must have been started with the same.
UNCOMPARED_ENV = ("PYTHONUNBUFFERED",)  # applied to the forked rank's streams instead


def fingerprint(environ) -> dict:
    """What the interpreter that reads ``environ`` at start-up would share with this one, if it were this one."""
    return {"executable": os.path.realpath(sys.executable), "version": sys.version, "prefix": sys.prefix,
            "sprite": os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
            "env": {k: v for k, v in sorted(environ.items()) if k.startswith("PYTHON") and k not in UNCOMPARED_ENV}}


def send(sock: socket.socket, message: dict, fds: list[int] = ()) -> None:
    """One message: its length (with the descriptors, if any), then its JSON."""
    body = json.dumps(message).encode()
    if fds:
        socket.send_fds(sock, [_HEADER.pack(len(body))], list(fds))
    else:
        sock.sendall(_HEADER.pack(len(body)))
    sock.sendall(body)


def receive(sock: socket.socket, max_fds: int = 0) -> tuple[dict | None, list[int]]:
    """The next message and the descriptors that came with it; (None, []) when the peer closed the socket."""
    if max_fds:
        head, fds, _flags, _addr = socket.recv_fds(sock, _HEADER.size, max_fds)
    else:
        head, fds = sock.recv(_HEADER.size), []
    head += _exactly(sock, _HEADER.size - len(head)) if head else b""
    if len(head) < _HEADER.size:
        for fd in fds:
            os.close(fd)
        return None, []
    (size,) = _HEADER.unpack(head)
    if size > MAX_MESSAGE:
        raise ValueError(f"a warm-server message of {size} bytes (at most {MAX_MESSAGE})")
    body = _exactly(sock, size)
    if len(body) < size:
        return None, fds
    return json.loads(body), fds


def _exactly(sock: socket.socket, size: int) -> bytes:
    parts, got = [], 0
    while got < size:
        part = sock.recv(size - got)
        if not part:
            break
        parts.append(part)
        got += len(part)
    return b"".join(parts)


def peer_uid(sock: socket.socket) -> int:
    """The user id of the process at the other end of a connected Unix socket (SO_PEERCRED)."""
    creds = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    return struct.unpack("3i", creds)[1]


def inherited_fds() -> list[int]:
    """The descriptors this process inherited and would pass on to a child (open, without close-on-exec)."""
    import fcntl

    found = []
    for name in os.listdir("/proc/self/fd"):
        fd = int(name)
        try:
            if not fcntl.fcntl(fd, fcntl.F_GETFD) & fcntl.FD_CLOEXEC:
                found.append(fd)
        except OSError:  # the listing's own descriptor, closed by now
            continue
    return sorted(found)


def request(argv: list[str], fds: list[int]) -> dict:
    """Everything a fresh ``python -m sprite.runtime ARGV`` would have started with (``fds``: its inherited
    descriptors, sent beside the message)."""
    import resource

    mask = os.umask(0o077)
    os.umask(mask)
    limits = {}
    for name in dir(resource):
        if name.startswith("RLIMIT_"):
            limits[name] = list(resource.getrlimit(getattr(resource, name)))
    return {"argv": argv, "fds": fds, "env": dict(os.environ), "cwd": os.getcwd(), "umask": mask, "rlimits": limits,
            "affinity": sorted(os.sched_getaffinity(0)), "sys_path": list(sys.path),
            "ignored": [int(sig) for sig in PASSED_ON + (signal.SIGPIPE,) if signal.getsignal(sig) == signal.SIG_IGN],
            "fingerprint": fingerprint(os.environ)}


def delegate(argv: list[str], environ=os.environ) -> None:
    """Run this rank as a fork of the warm server, if one is set and takes it: then this never returns. Returns
    (and the caller runs the rank here) when there is none, it cannot be reached, or it refuses the rank."""
    path = environ.get(SERVER)
    if SERVED or not path or not sys.platform.startswith("linux"):
        return
    fds = inherited_fds()
    if len(fds) > MAX_FDS:
        return
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.settimeout(REPLY_SECONDS)
        sock.connect(path)
        if peer_uid(sock) != os.getuid():  # another user's socket: it gets neither the environment nor the fds
            sock.close()
            return
        send(sock, request(argv, fds), fds)
        received: list[int] = []
        # From here the launcher's signals are the rank's: hold them until the rank's pid is known.
        _on_passed_on(lambda sig: lambda signum, frame: received.append(signum))
        reply, _ = receive(sock)
    except (OSError, ValueError):
        sock.close()
        return
    if not reply or "pid" not in reply:
        _on_passed_on(lambda sig: signal.SIG_DFL if sig != signal.SIGINT else signal.default_int_handler)
        sock.close()
        for sig in received:  # the rank runs here after all: what came meanwhile is its own
            os.kill(os.getpid(), sig)
        return
    _stand_in(sock, int(reply["pid"]), received)


def _on_passed_on(handler_for) -> None:
    """Set ``handler_for(sig)`` as the handler of every signal of :data:`PASSED_ON` this process does not ignore
    (an ignored one stays ignored, as the launcher meant)."""
    for sig in PASSED_ON:
        if signal.getsignal(sig) != signal.SIG_IGN:
            signal.signal(sig, handler_for(sig))


def _stand_in(sock: socket.socket, pid: int, received: list[int]) -> None:
    """Be the launcher's process for the forked rank ``pid``: pass signals on, end as it ends."""

    def pass_on(signum, frame):
        try:
            os.kill(pid, signum)
        except ProcessLookupError:
            pass

    _on_passed_on(lambda sig: pass_on)
    for sig in received:
        pass_on(sig, None)
    sock.settimeout(None)
    try:
        reply, _ = receive(sock)
    except (OSError, ValueError):
        reply = None
    sys.stdout.flush()
    sys.stderr.flush()
    if not reply or "exit" not in reply:
        print(f"sprite: the warm server ({os.environ.get(SERVER)}) ended before the rank did, which it then "
              "kills; start the server again or unset SPRITE_WARM_SERVER.", file=sys.stderr, flush=True)
        os._exit(1)
    code = int(reply["exit"])
    if code < 0:  # killed by a signal: end so too, so the launcher sees what a fresh rank's death looks like
        if -code not in (signal.SIGKILL, signal.SIGSTOP):
            signal.signal(-code, signal.SIG_DFL)
        signal.pthread_sigmask(signal.SIG_UNBLOCK, [-code])
        os.kill(os.getpid(), -code)
        code = 128 - code
    os._exit(code)
