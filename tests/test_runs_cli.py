"""`sprite runs` and `sprite runs verify` on audit trails written through sprite.integrity.audit (no training needed)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from sprite.integrity import audit
from sprite.cli import runs as cli_runs
from sprite.recovery import rundir
from sprite.errors import UsageError
from sprite.integrity import IntegrityError
from sprite.recovery import summary

from conftest import OUTSIDE_CHECKOUT


def make_run(parent: Path, name: str, causes: list[str], finished: bool = True, resumes: int = 0) -> Path:
    run = rundir.create(parent / name)
    trail = run / rundir.AUDIT
    audit.append(trail, "launch", run_dir=str(run), script="train.py", world_size=4)
    for number, cause in enumerate(causes, 1):
        audit.append(trail, "attempt_start", attempt=number, hosts=["a", "b"], world_size=4)
        if number > 1 and resumes:
            audit.append(trail, "resume", path=f"ckpt/step-{number}")  # as the runtime records a resume
        audit.append(trail, "attempt_end", attempt=number, exit_code=0 if cause == "success" else 137, cause=cause,
                     reason="", hosts=["a", "b"], world_size=4, seconds=1800.0, node_hours=1.0, device_hours=2.0)
    if finished:
        done = audit.append(trail, "completion", status=summary.status_of(causes[-1]), exit_code=0,
                            attempts=len(causes))
        rundir.write_summary(run, {"audit_tail": done["self_sha256"]})
    return run


def test_summary_counts_attempts_resumes_and_hours(tmp_path):
    run = make_run(tmp_path, "r1", ["node fault", "success"], resumes=1)
    result = summary.summarize(audit.read(run / rundir.AUDIT))
    assert (result["status"], result["attempts"], result["resumes"]) == ("succeeded", 2, 1)
    assert (result["node_hours"], result["device_hours"]) == (2.0, 4.0)
    assert [a["cause"] for a in result["per_attempt"]] == ["node fault", "success"]
    assert summary.status_of("stall") == "stalled" and summary.status_of("application fault") == "failed"


def test_listing_names_each_runs_status(tmp_path):
    make_run(tmp_path, "a-done", ["success"])
    make_run(tmp_path, "b-stalled", ["stall"])
    make_run(tmp_path, "c-cut", ["node fault"], finished=False)
    (tmp_path / "not-a-run").mkdir()
    rows = cli_runs.list_runs(tmp_path)
    assert [(Path(r["run_dir"]).name, r["status"], r["attempts"]) for r in rows] == [
        ("a-done", "succeeded", 1), ("b-stalled", "stalled", 1), ("c-cut", "incomplete", 1)]
    table = cli_runs._table(rows)
    assert table.splitlines()[0].split() == ["run", "status", "attempts", "resumes", "device-hours", "started"]
    assert "b-stalled  stalled" in table and "2.0000" in table
    with pytest.raises(UsageError):
        cli_runs.list_runs(tmp_path / "missing")


def test_verify_passes_an_intact_trail_and_names_an_edited_or_cut_line(tmp_path):
    run = make_run(tmp_path, "run", ["node fault", "success"])
    assert cli_runs.verify(run) == "6 records"
    trail = run / rundir.AUDIT
    lines = trail.read_bytes().splitlines(keepends=True)

    edited = make_run(tmp_path, "edited", ["node fault", "success"])
    (edited / rundir.AUDIT).write_bytes(b"".join(lines[:2] + [lines[2].replace(b'"cause":"node fault"',
                                                                                b'"cause":"success"')] + lines[3:]))
    with pytest.raises(IntegrityError, match="line 3"):
        cli_runs.verify(edited)
    cut = make_run(tmp_path, "cut", ["node fault", "success"])
    (cut / rundir.AUDIT).write_bytes(b"".join(lines[:-1]))  # the completion record removed from the end
    with pytest.raises(IntegrityError, match="lines were removed from the end"):
        cli_runs.verify(cut)
    torn = make_run(tmp_path, "torn", ["node fault", "success"])
    (torn / rundir.AUDIT).write_bytes(b"".join(lines)[:-20])
    with pytest.raises(IntegrityError, match="incomplete"):
        cli_runs.verify(torn)
    with pytest.raises(UsageError):
        cli_runs.verify(tmp_path / "nothing-here")
    # the last line removed and run.json, which names it, damaged or removed too: not taken for intact
    for damage in (lambda path: path.write_text("{"), os.unlink):
        hidden = make_run(tmp_path, f"hidden-{len(os.listdir(tmp_path))}", ["node fault", "success"])
        (hidden / rundir.AUDIT).write_bytes(b"".join(lines[:-1]))
        damage(hidden / rundir.SUMMARY)
        with pytest.raises(IntegrityError, match="run.json is missing or unreadable"):
            cli_runs.verify(hidden)
    running = make_run(tmp_path, "running", ["node fault"], finished=False)
    rundir.write_summary(running, {"status": "running"})
    assert cli_runs.verify(running).startswith("3 records (no completion record yet")
    empty = rundir.create(tmp_path / "empty")
    (empty / rundir.AUDIT).write_bytes(b"")
    rundir.write_summary(empty, {"status": "running"})
    with pytest.raises(IntegrityError, match="holds no record"):
        cli_runs.verify(empty)
    stray = tmp_path / "afile"
    stray.write_bytes(b"")
    with pytest.raises(UsageError, match="holds no audit trail"):
        cli_runs.verify(stray)


def test_the_commands_exit_codes_and_import_no_torch(tmp_path):
    run = make_run(tmp_path, "run", ["success"])
    edited = make_run(tmp_path, "edited", ["success"])
    text = (edited / rundir.AUDIT).read_text().replace('"world_size":4', '"world_size":8', 1)
    (edited / rundir.AUDIT).write_text(text)
    probe = f"""
import json, sys
from sprite.cli import app as cli
codes = []
for argv in (["runs", {str(tmp_path)!r}, "--json"], ["runs", "verify", {str(run)!r}],
             ["runs", "verify", {str(edited)!r}], ["runs", "verify"], ["runs", "show", {str(run)!r}]):
    try:
        cli.main(argv)
    except SystemExit as exit:
        codes.append(exit.code)
heavy = sorted({{m.split('.')[0] for m in sys.modules}} & {{'torch', 'lightning'}})
print("RESULT", json.dumps([codes, heavy]))
"""
    result = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=60,
                            cwd=OUTSIDE_CHECKOUT)
    codes, heavy = json.loads(result.stdout.split("RESULT ", 1)[1])
    assert codes == [0, 0, 1, 2, 0] and heavy == [], result.stderr  # runs show too (docs/hangs.md: without torch)
    assert "line 1: its content does not match its own SHA-256" in result.stderr
    listed, _ = json.JSONDecoder().raw_decode(result.stdout)
    assert [(Path(r["run_dir"]).name, r["status"]) for r in listed] == [("edited", "damaged"), ("run", "succeeded")]
