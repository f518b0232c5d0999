"""`sprite preflight`, and `sprite run --preflight`'s hook: every node checked in parallel before a long run.

The harness lives in sprite.parity.preflight and is imported inside the command bodies only, so `sprite --help`
and planning never import torch. Exit codes: 0 every node healthy, 1 some node failed or the preflight was
inconclusive (its launch failed as a whole), 2 bad usage.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Callable, List, Optional

import typer

from sprite.cli.options import SECONDS, WHOLE, Accelerator, Launcher, MpiFlavour, value
from sprite.errors import EXIT_CHECK_FAILED, EXIT_OK, UsageError, one_line

HELP = """Check every node of this allocation (or this machine) in parallel before a long run.

Each rank runs a fixed reference computation (matmuls and one training step in the job's precisions) and
compares it bit for bit with the known answer and with the ranks of its device kind, times it, counts its
devices against the site profile, and takes part in an all-reduce within its node and one over all ranks.
A table per node says ok or which check failed. Exit 0: all healthy; 1: some node failed, or the launch
failed as a whole (inconclusive); 2: bad usage.

\b
Examples:
  sprite preflight                                  # inside a PBS or Slurm job: every node
  sprite preflight --site aurora --json             # machine-readable verdict
  sprite preflight --devices 2 --fault 127.0.0.1:slow   # a negative control: must fail, naming the host
"""
FAULT_HELP = "negative control HOST:KIND, KIND one of wrong-result, slow, no-device, hang (repeatable)"


DAY = 86400.0  # seconds: the longest a preflight, or one of its collectives, may be given


def _positive(text: Optional[str], option: str, default: float, least: float = 0.0, most: float = DAY) -> float:
    if text is None:
        return default
    try:
        number = float(text)
    except ValueError:
        number = float("nan")
    if not least < number <= most:
        raise UsageError(f"{option} {one_line(text, 40)!r} is not a number above {least:g} and at most {most:g}.",
                         "", f"Pass e.g. {option} {default:g}.")
    return number


def _whole(text: Optional[str], option: str, default: int, least: int, most: int) -> int:
    from sprite.values.grammar import whole

    if text is None:
        return default
    return whole(least, most)(text, lambda what, allowed: UsageError(f"{option} {what}", "",
                                                                     f"Pass {allowed}, e.g. {option} {default}."))


def options_from(deadline, collective_timeout, slow_factor, size, grace=None):
    from sprite.parity.preflight.runner import Options

    base = Options()
    found = Options(deadline=_positive(deadline, "--deadline", base.deadline),
                    collective_timeout=_positive(collective_timeout, "--collective-timeout", base.collective_timeout),
                    slow_factor=_positive(slow_factor, "--slow-factor", base.slow_factor, least=1.0, most=1000.0),
                    size=_whole(size, "--size", base.size, least=2, most=16384),
                    grace=_positive(grace, "--grace", base.grace))
    if found.collective_timeout >= found.deadline:
        raise UsageError(f"--collective-timeout {found.collective_timeout:g} is not shorter than --deadline "
                         f"{found.deadline:g}.", "Ranks must give up on a collective before the launch is stopped, "
                         "or a hang leaves no record.", "Pass a --collective-timeout below --deadline.")
    return found


def default_out() -> Path:
    from sprite.recovery.rundir import default_path

    path = default_path()
    return path.parent / "preflight" / path.name


def preflight(
    nodes: Optional[str] = typer.Option(None, "--nodes", metavar=WHOLE, help="nodes; default: the whole allocation"),
    devices: Optional[str] = typer.Option(None, "--devices", metavar=WHOLE, help="ranks per node, as sprite run"),
    accelerator: Optional[Accelerator] = typer.Option(None, "--accelerator", help="device type of every rank"),
    launcher: Optional[Launcher] = typer.Option(None, "--launcher", help="what starts the ranks"),
    mpi: Optional[MpiFlavour] = typer.Option(None, "--mpi", help="mpiexec flavour"),
    site: Optional[str] = typer.Option(None, "--site", help="site profile: aurora, polaris, perlmutter, local or "
                                       "a path"),
    exclude: Optional[List[str]] = typer.Option(None, "--exclude", help="hosts to leave out (repeatable)"),
    fault: Optional[List[str]] = typer.Option(None, "--fault", metavar="HOST:KIND", help=FAULT_HELP),
    out: Optional[Path] = typer.Option(None, "--out", help="a fresh folder for the records; default: a new one "
                                       "under ./sprite-runs/preflight/"),
    deadline: Optional[str] = typer.Option(None, "--deadline", metavar=SECONDS, help="stop the launch after "
                                           "SECONDS (default 600); ranks that never reported are named"),
    collective_timeout: Optional[str] = typer.Option(None, "--collective-timeout", metavar=SECONDS, help="seconds "
                                                     "an all-reduce may take (default 60)"),
    slow_factor: Optional[str] = typer.Option(None, "--slow-factor", metavar="FLOAT", help="a rank slower than "
                                              "the median of the others by more than this fails (default 2)"),
    size: Optional[str] = typer.Option(None, "--size", metavar=WHOLE, help="reference matmul size (default 512)"),
    grace: Optional[str] = typer.Option(None, "--grace", metavar=SECONDS, help="once a rank has reported, seconds "
                                        "without a further report before the silent ranks are named (default 5)"),
    json_out: bool = typer.Option(False, "--json", help="print the report as JSON"),
) -> int:
    from rich.console import Console

    from sprite.parity.preflight import report, runner

    options = options_from(deadline, collective_timeout, slow_factor, size, grace)
    base = {"nodes": nodes, "devices": devices, "accelerator": value(accelerator), "launcher": value(launcher),
            "mpi": value(mpi), "site": site, "exclude": list(exclude) if exclude else None}
    result = runner.preflight((out or default_out()).absolute(), base, fault, options)
    if json_out:
        typer.echo(__import__("json").dumps(result, indent=1, sort_keys=True))
    else:
        report.show(result, Console())
        print(f"report: {result['out']}/{report.REPORT}", file=sys.stderr)
    return EXIT_OK if result["ok"] else EXIT_CHECK_FAILED


def register(app: typer.Typer) -> None:
    app.command("preflight", help=HELP)(preflight)


# --- sprite run --preflight: the preflight before the first attempt, inside the run folder ---

def hook_for(run, faults: Optional[List[str]]):
    """The preflight ``entry.run_all`` runs before the first launch when the job asks for one (``--preflight``,
    ``preflight: true`` in the spec or the site profile): ``check(run, plan)`` checks its inputs before anything is
    staged and returns the step that runs it (``before_launch``); None without a preflight. Raises UsageError for
    ``--preflight-fault`` without a preflight."""
    from sprite.launch.plan import assemble

    job, _ = assemble(run.flags, run.spec_file, run.environ, run.allow_literal_secrets)
    if not job.preflight:
        if faults:
            raise UsageError("--preflight-fault needs --preflight.", "A negative control is injected into the "
                             "preflight, which this run does not do.", "Add --preflight, or drop --preflight-fault.")
        return None
    return Preflight(list(faults or []), job)


class Preflight:
    """``sprite run --preflight``: checked before the staging, run on the staged copy after it."""

    def __init__(self, faults: List[str], job) -> None:
        self.faults, self.job = faults, job

    def check(self, run, plan) -> Callable:
        """Plan the preflight of ``plan``'s nodes and check its inputs (faults, output folder, launcher, port);
        returns ``go()``, which runs it and returns the first attempt's plan or None (``before_launch``). Raises
        UsageError, before anything is staged."""
        from sprite.parity.preflight import runner

        out, base, staged = _launch_of(run, plan, self.job)
        launch_plan, settings = runner.checked(out, base, self.faults, runner.Options(), run.environ, run.spec_file,
                                               "--preflight-fault", staged, run.allow_literal_secrets)
        return lambda: before_launch(run, plan, self.job, (launch_plan, settings))


    def describe(self, plan) -> str:
        """``--dry-run``'s line for the preflight, after checking its faults as the run would (UsageError)."""
        from sprite.parity.preflight.settings import parse_faults

        hosts = _hosts_of(plan, self.job)
        parse_faults(self.faults, hosts, "--preflight-fault")
        faults = f"; negative controls: {', '.join(self.faults)}" if self.faults else ""
        return f"preflight: first, on {len(hosts)} node(s) ({', '.join(hosts[:8])}{' ...' if len(hosts) > 8 else ''})" \
               f"{faults}"


def _hosts_of(plan, job) -> tuple:
    """Every node the run may use: the allocation less --exclude (this machine alone for the local launcher)."""
    from sprite.schedulers import allocation

    if plan.world.launcher == "local":
        return tuple(plan.world.hosts)
    alloc = plan.world.alloc
    if job.exclude:
        alloc = allocation.exclude(alloc, job.exclude, job.origins.get("exclude", "--exclude"))
    return tuple(alloc.hosts)


def _launch_of(run, plan, job):
    """(output folder, flags, staged folder) of the preflight of ``plan``: every node the run may use (the
    allocation less --exclude), on the copy ``entry.run_all`` stages first under --stage."""
    nodes = str(len(_hosts_of(plan, job))) if plan.world.launcher != "local" else None
    staged = plan.stage.dir if plan.stage is not None else None
    return run.path / "preflight", {**run.flags, "nodes": nodes}, staged


def _say(text: str) -> None:
    print(f"sprite: {one_line(text, 1000)}", file=sys.stderr, flush=True)


def before_launch(run, plan, job, prepared):
    """Run the preflight ``Preflight.check`` planned (``prepared``: its launch plan and settings) on every node the
    run may use (the allocation less --exclude), into ``RUN/preflight``; record the result in the audit. Returns the
    plan of the first attempt: unchanged when every node is healthy, without the failed nodes when the allocation
    has room for the same world (as --spare-nodes allows), or None (exit 1) when it has not. Raises UsageError for
    a rendezvous port taken since the check, SpriteError (exit 1) when the preflight is inconclusive: its launch
    failed as a whole or named no node, so none is left out and the run stops."""
    from rich.console import Console

    from sprite.errors import SpriteError
    from sprite.parity.preflight import report, runner

    out, base, _ = _launch_of(run, plan, job)
    _say(f"preflight of {base['nodes'] or 1} node(s) before the launch; records in {out}")
    result = runner.run_checked(out, *prepared, runner.Options())
    report.show(result, Console(stderr=True))
    bad = result["failed_hosts"]
    fields = {"ok": result["ok"], "seconds": result["launch"]["seconds"], "report": f"{result['out']}/{report.REPORT}",
              "nodes": [{"host": n["host"], "ok": n["ok"], "failed": n["failed"]} for n in result["nodes"]]}
    unsure = result.get("inconclusive")
    if unsure:
        run.record("preflight", **fields, inconclusive=unsure, left_out=[], decision="stop: inconclusive")
        raise SpriteError(f"The preflight before the launch judged no node: {one_line(unsure, 600)}.",
                          "Its launch failed as a whole (the launcher, the environment), or no rank got past the "
                          "rendezvous (a rank that died in it unseen, a host the others cannot reach, a start-up "
                          "longer than the deadline), so no node could be named or left out; one may still be bad.",
                          f"Read {out}/{runner.LAUNCH_LOG} and {out}/logs/, fix the launch (or run sprite preflight "
                          "with a longer --deadline to find the node), then run again.")
    if not bad:
        run.record("preflight", **fields, left_out=[], decision="launch")
        return plan
    narrowed = {**run.flags, "exclude": [*job.exclude, *bad], "nodes": str(plan.world.nodes),
                "spare_nodes": max(0, job.spare_nodes - len(bad))}
    named = ", ".join(f"{n['host']} ({', '.join(n['failed'])})" for n in result["nodes"] if not n["ok"])
    try:
        narrowed_plan = run.plan(1, narrowed)
    except SpriteError as err:
        run.record("preflight", **fields, left_out=[], decision=f"stop: {err.what}")
        _say(f"preflight failed on {named}, and the allocation has no room to leave them out ({err.what.rstrip('.')})."
             f" Fix or exclude those nodes, or ask for more nodes; the report is {fields['report']}.")
        return None
    run.flags = narrowed
    run.record("preflight", **fields, left_out=bad, decision=f"launch without {', '.join(bad)}")
    _say(f"preflight failed on {named}; launching on {', '.join(narrowed_plan.world.hosts)} without them.")
    return narrowed_plan
