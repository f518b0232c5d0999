"""This rank's stacks on disk when it stops advancing: ``faulthandler``'s timed dump, re-armed as the heartbeat moves.

A thread of its own wakes every heartbeat interval; when the heartbeat's count or phase moved since its last look
it re-arms ``faulthandler.dump_traceback_later`` (the limit in force for the rank's phase, from
``SPRITE_STACKS_AFTER``), so a training step costs nothing more than it did. A rank that stops advancing dumps by
itself: faulthandler's own C thread writes every Python thread's stack even while a C call holds the GIL. A little
before that, this thread writes the flight recorder's summary (recorder.py). A dump followed by progress was no
hang: the file is cut back to its header. Nothing here stops training: a file that cannot be written is reported
once.
"""

from __future__ import annotations

import faulthandler
import json
import os
import site
import socket
import sys
import sysconfig
import threading
import time
from pathlib import Path

from sprite.contract import heartbeat, stacks
from sprite.contract.stacks import After
from sprite.errors import one_line
from sprite.runtime.hang import recorder


class Dumper:
    """Keeps this rank's stack file armed; ``tick`` is one look at the heartbeat (the thread calls it)."""

    def __init__(self, heart, where: Path, rank: int, after: After, interval: float) -> None:
        self.heart, self.where, self.rank, self.after, self.interval = heart, where, rank, after, interval
        self.fd = _open_new(where / stacks.stacks_name(rank))
        header = (stacks.HEADER + json.dumps(_facts(rank)) + "\n").encode()
        os.write(self.fd, header)
        self.header = len(header)
        self._seen: tuple | None = None
        self._recorder_due: float | None = None
        self._collectives_written = False

    def start(self) -> Dumper:
        threading.Thread(target=self._loop, name="sprite-stacks", daemon=True).start()
        return self

    def timeout(self, beat) -> float:
        """The watchdog's limit for this rank's state, less the margin the launcher gave (SPRITE_STACKS_AFTER).
        From this rank's first training step on it is the stall timeout's: the watchdog applies the stall timeout
        as soon as any rank is past its first step, and this rank may hang inside its own first step (after the
        first all-reduce) while the others finished theirs; a long first step only costs a dump that its end
        removes."""
        if beat.phase == heartbeat.SAVE:
            return self.after.save
        return self.after.stall if beat.first_step >= 0 else self.after.first_step

    def tick(self, now: float) -> None:
        """Re-arm the dump when the heartbeat moved; write the recorder's summary once it is due."""
        beat = self.heart.beat
        if (beat.count, beat.phase) != self._seen:
            timeout = self.timeout(beat)  # armed first: a failing clean-up below must not leave the rank unarmed
            faulthandler.dump_traceback_later(timeout, repeat=False, file=self.fd, exit=False)
            self._recorder_due = now + max(timeout - self.interval, 0.0)
            if os.fstat(self.fd).st_size > self.header:  # dumped, then advanced: a slow step, no hang
                os.ftruncate(self.fd, self.header)
            if self._collectives_written:  # written a little before the dump, which progress may have prevented
                _remove(self.where / stacks.collectives_name(self.rank))
                self._collectives_written = False
            self._seen = (beat.count, beat.phase)  # only once cleaned up: a failed clean-up is tried again
        elif self._recorder_due is not None and now >= self._recorder_due:
            self._recorder_due = None
            self.write_collectives()

    def write_collectives(self) -> None:
        """Write the recorder's summary under a temporary name, then rename it; the temporary file is removed when
        a write fails. Raises OSError."""
        text = json.dumps(recorder.summary())
        final = self.where / stacks.collectives_name(self.rank)
        temporary = self.where / f".{final.name}.{os.getpid()}.tmp"
        fd = _open_new(temporary)
        try:
            with os.fdopen(fd, "w") as out:
                out.write(text)
            os.replace(temporary, final)
            self._collectives_written = True
        except BaseException:
            _remove(temporary)
            raise

    def _loop(self, sleep=time.sleep) -> None:
        """Tick every interval for the rank's life. A failing tick is said once on stderr and the thread goes on,
        so the dump is still re-armed when the heartbeat moves."""
        warned = False
        while True:
            try:
                self.tick(time.monotonic())
            except Exception as err:  # noqa: BLE001 (this thread must outlive any fault: it is the rank's dump)
                if not warned:
                    warned = True
                    why = err.strerror if isinstance(err, OSError) and err.strerror else \
                        f"{type(err).__name__}: {one_line(str(err), 200)}"
                    print(f"sprite: warning: cannot write this rank's stacks in {self.where} ({why}); a stall "
                          "may not show where it was.", file=sys.stderr, flush=True)
            sleep(self.interval)


def start(heart, env, rank: int, interval: float) -> Dumper | None:
    """Arm this rank's stack dump when the launch asked for one (``SPRITE_STACKS_AFTER`` and the run folder set);
    None otherwise, or when the stack file cannot be made (said once on stderr)."""
    found = stacks.from_env(env)
    if found is None:
        return None
    where, after = found
    try:
        return Dumper(heart, where, rank, after, interval).start()
    except OSError as err:
        print(f"sprite: warning: cannot make this rank's stack file in {where} ({err.strerror}); a stall will not "
              "show where it was. Put the run folder (--run-dir) on a file system every node sees.",
              file=sys.stderr, flush=True)
        return None


def _open_new(path: Path) -> int:
    """A new file sprite makes itself: never over an existing name, never through a symlink."""
    return os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_APPEND | os.O_CLOEXEC, 0o600)


def _remove(path: Path) -> None:
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass


def _facts(rank: int) -> dict:
    """What the launcher needs to read the stacks: who wrote them, and which folders hold library code (every
    other frame is the user's)."""
    paths = sysconfig.get_paths()
    library = {paths.get(k, "") for k in ("stdlib", "platstdlib", "purelib", "platlib")}
    library |= set(getattr(site, "getsitepackages", list)())
    library.add(str(Path(__file__).resolve().parents[2]))  # sprite's own package
    return {"rank": rank, "host": socket.gethostname(), "pid": os.getpid(), "python": sys.version.split()[0],
            "library": sorted(p for p in library if p),
            "main_thread": f"0x{threading.main_thread().ident:016x}"}  # as faulthandler prints a thread's ident
