"""Benchmark results on disk: a fresh --out folder, one folder per launch, one record per rank; every file is
created once with sprite.integrity.writeonce (never over an existing name, never through a symlink), mode 0600; folders
0700.

Layout: ``bench_settings.json``, ``runs/w<world>/<arm>-r<repeat>/rank<r>.json``, ``logs/``, then ``bench.json``
and ``bench.png``. No torch here.
"""

from __future__ import annotations

import json
import math
import pathlib

from sprite.integrity import owner_only, records
from sprite.errors import UsageError
from sprite.parity.bench.settings import SETTINGS_FILE, BenchSettings
from sprite.parity.outdir import make_out
from sprite.parity.store import ResultError, clean
from sprite.integrity.writeonce import write_new


def write_json(path: pathlib.Path, value) -> None:
    """Writes ``value`` as strict JSON (non-finite numbers become null) into a new file, mode 0600.

    Raises IntegrityError if the name exists (a file or a symlink): results are written once.
    """
    write_new(path, json.dumps(clean(value), indent=1, sort_keys=True, allow_nan=False).encode())


def make_dir(path: pathlib.Path) -> pathlib.Path:
    """Creates ``path`` and each missing parent with mode 0700 (sprite.integrity.owner_only; ranks of one launch may race
    here). Raises IntegrityError when a component exists but is not a folder."""
    owner_only.make_dirs(path)
    return path


def claim(out: pathlib.Path, settings: BenchSettings) -> None:
    """Creates ``out`` (or takes an empty folder) and writes the settings.

    Raises UsageError if ``out`` is a file, a symlink or a folder that holds anything.
    """
    if out.is_symlink() or (out.exists() and (not out.is_dir() or any(out.iterdir()))):
        raise UsageError(f"--out {out} is already used; refusing to run into it.",
                         "It holds an earlier benchmark (results are written once).",
                         f"Pass a fresh folder, or compare the old result with `sprite bench compare {out} NEW`.")
    make_out(make_dir, out)
    write_new(out / SETTINGS_FILE, settings.to_json().encode())


def load_settings(out: pathlib.Path) -> BenchSettings:
    """The settings of the run in ``out``. Raises UsageError when there is none."""
    try:
        return BenchSettings.from_dict(json.loads((out / SETTINGS_FILE).read_text()))
    except (OSError, ValueError) as err:
        raise UsageError(f"{out} holds no readable {SETTINGS_FILE} ({err.__class__.__name__}).",
                         "The folder is not the --out of a `sprite bench` run.",
                         "Pass the --out folder of a benchmark run.") from None


def arm_dir(out: pathlib.Path, world: int, arm: str, repeat: int) -> pathlib.Path:
    """The folder one launch records into."""
    return out / "runs" / f"w{world}" / f"{arm}-r{repeat}"


def log_path(out: pathlib.Path, world: int, arm: str, repeat: int) -> pathlib.Path:
    return out / "logs" / f"w{world}-{arm}-r{repeat}.log"


def write_rank(target: pathlib.Path, rank: int, record: dict) -> None:
    """Writes one rank's record. Raises IntegrityError if it exists."""
    write_json(make_dir(target) / f"rank{rank}.json", record)


def load_ranks(target: pathlib.Path, world: int) -> list[dict]:
    """Every rank's record of one launch, in rank order. Raises ResultError when one is missing or unreadable."""
    records = []
    for rank in range(world):
        path = target / f"rank{rank}.json"
        try:
            records.append(json.loads(path.read_text()))
        except (OSError, ValueError) as err:
            raise ResultError(f"{path} is missing or unreadable ({err.__class__.__name__}).",
                              "That rank failed or was killed before it finished its steps.",
                              "Read the launch's log under logs/ and run again into a fresh --out.") from None
    return records


REPORT = "bench.json"


def load_report(path: pathlib.Path) -> dict:
    """The bench report ``path`` (a bench.json, or the --out folder holding one), checked to have the shape
    ``sprite bench compare`` reads: settings, and points each with a world size and a positive sprite step time.
    The file must be a regular file of at most ``records.REPORT_MAX`` bytes (a FIFO does not block).

    Raises:
        UsageError: ``path`` holds no readable report of that shape.
    """
    target = path / REPORT if path.is_dir() else path
    try:
        report = records.read_json(target, records.REPORT_MAX, follow=True)  # the user named it: a link is fine
        problem = _report_problem(report)
    except (OSError, ValueError) as err:
        problem = getattr(err, "strerror", None) or str(err) or err.__class__.__name__
    if problem:
        raise UsageError(f"{target} is not a readable bench.json ({problem[:200]}).",
                         "The path is not a `sprite bench` --out folder or its report.",
                         "Pass two bench.json files (or the --out folders holding them).")
    return report


def _report_problem(report) -> str:
    if not isinstance(report, dict) or not isinstance(report.get("settings"), dict) or \
            not isinstance(report.get("points"), list):
        return "no settings and points"
    for point in report["points"]:
        if not isinstance(point, dict) or type(point.get("world")) is not int or not isinstance(point.get("arms"),
                                                                                                 dict):
            return "a point without its world size and arms"
        sprite = point["arms"].get("sprite")
        if sprite is None:
            continue
        median = sprite.get("step_s", {}).get("median") if isinstance(sprite, dict) and isinstance(
            sprite.get("step_s"), dict) else None
        if isinstance(median, bool) or not isinstance(median, (int, float)) or not 0 < median < math.inf:
            return f"world {point['world']}: no positive sprite step time"
    return ""
