"""The ``sprite`` command line. Planning commands here never import torch or lightning."""

from __future__ import annotations

import sys
from typing import List, Optional

import typer

from sprite.cli.options import SECONDS, WHOLE, Accelerator, Launcher, MpiFlavour, Precision, Strategy, value, version
from sprite.errors import EXIT_USAGE, SpriteError, UsageError, exit_with, from_os_error, one_line

app = typer.Typer(
    add_completion=True, no_args_is_help=True, pretty_exceptions_enable=False, rich_markup_mode=None,
    help="Launch PyTorch Lightning scripts on supercomputers and prove the distributed run is right.\n\n"
         "Example: sprite run --devices 2 examples/train.py --max-steps 20",
)


@app.callback()
def _root(show_version: bool = typer.Option(False, "--version", callback=version, is_eager=True,
                                            help="Print sprite's version and exit.")) -> None:
    """Launch PyTorch Lightning scripts on supercomputers and prove the distributed run is right."""


RUN_HELP = """Start every rank of SCRIPT inside this PBS or Slurm allocation, or on this machine.

sprite's options come before SCRIPT; everything after SCRIPT goes to the script unchanged.
Each rank's lines carry its rank (the launcher's own label); --log-dir DIR keeps one file per rank;
above 16 ranks the console shows rank 0 only (--ranks all shows every rank). Without a scheduler,
--devices defaults to one rank per visible GPU, as Trainer(devices="auto"), and 1 on a CPU-only machine.

\b
Examples:
  sprite run --devices 2 examples/train.py --max-steps 20     # 2 ranks on this machine
  sprite run --nodes 2 --strategy fsdp --site aurora train.py # inside a PBS job on Aurora
  sprite run --dry-run --json --devices 2 train.py            # print the plan, run nothing
  sprite run --secret WANDB_API_KEY --devices 2 train.py      # a secret from this shell, never in argv
  sprite run --stage auto --nodes 64 train.py                 # ranks import from a node-local copy
  sprite run --retries 3 --resume auto --checkpoint-every 30min train.py  # sprite saves every 30 min
"""


@app.command(help=RUN_HELP, no_args_is_help=True,
             context_settings={"allow_interspersed_args": False, "ignore_unknown_options": True})
def run(
    script: Optional[str] = typer.Argument(None, help="training script (optional with --spec)"),
    args: Optional[List[str]] = typer.Argument(None, help="arguments passed to the script"),
    spec: Optional[str] = typer.Option(None, "--spec", help="job spec YAML; flags override it"),
    site: Optional[str] = typer.Option(None, "--site", help="site profile: aurora, polaris, perlmutter, local or a path"),
    nodes: Optional[str] = typer.Option(None, "--nodes", metavar=WHOLE,
                                        help="nodes (Lightning num_nodes); default: the whole allocation"),
    devices: Optional[str] = typer.Option(
        None, "--devices", metavar=WHOLE, help="ranks per node; default: the allocation's, else the site's, else "
        "(no scheduler) one per visible GPU as Trainer(devices=\"auto\") counts them, 1 on a CPU-only machine"),
    accelerator: Optional[Accelerator] = typer.Option(None, "--accelerator", help="device type of every rank"),
    strategy: Optional[Strategy] = typer.Option(None, "--strategy", help="auto keeps the script's own"),
    precision: Optional[Precision] = typer.Option(None, "--precision", help="auto keeps the script's own"),
    launcher: Optional[Launcher] = typer.Option(None, "--launcher", help="what starts the ranks"),
    mpi: Optional[MpiFlavour] = typer.Option(None, "--mpi", help="mpiexec flavour"),
    exclude: Optional[List[str]] = typer.Option(None, "--exclude", help="hosts to leave out (repeat or comma list; "
                                                "nid[001235,001237] stays one host list)"),
    env: Optional[List[str]] = typer.Option(
        None, "--env", help="NAME: pass this shell's NAME to every rank; NAME=VALUE: set it (repeatable). A value "
        "on the command line can be read by every user of this machine (process table, shell history): prefer NAME"),
    secret: Optional[List[str]] = typer.Option(
        None, "--secret", help="NAME: a secret from this shell's environment, printed masked (repeatable)"),
    allow_literal_secrets: bool = typer.Option(
        False, "--allow-literal-secrets", help="accept a literal value for a secret (spec, site profile or --env)"),
    master_port: Optional[str] = typer.Option(None, "--master-port", metavar=WHOLE,
                                              help="rendezvous port; default: from the job id"),
    run_dir: Optional[str] = typer.Option(None, "--run-dir", help="new folder for this run's audit, heartbeats and "
                                          "logs; default: a new one under ./sprite-runs/"),
    stall_timeout: Optional[str] = typer.Option(None, "--stall-timeout", metavar=SECONDS, help="stop the run "
                                                "(exit 124) when no rank advances for SECONDS"),
    first_step_timeout: Optional[str] = typer.Option(None, "--first-step-timeout", metavar=SECONDS, help="allowance "
                                                     "from launch to the end of the first step, and for leaving once "
                                                     "every rank is done; default 10x --stall-timeout, at least 300"),
    save_timeout: Optional[str] = typer.Option(None, "--save-timeout", metavar=SECONDS, help="allowance for a "
                                               "checkpoint save; default 2x --stall-timeout"),
    retries: Optional[str] = typer.Option(None, "--retries", metavar=WHOLE,
                                          help="relaunch up to N times after a failure"),
    spare_nodes: Optional[str] = typer.Option(None, "--spare-nodes", metavar=WHOLE, help="keep K allocated nodes "
                                              "out of the first launch, to replace a failed node"),
    resume: Optional[str] = typer.Option(None, "--resume", help="never (default), auto (the newest checkpoint whose"
                                         " manifest verifies) or a checkpoint PATH, passed to Trainer.fit"),
    checkpoint_every: Optional[str] = typer.Option(
        None, "--checkpoint-every", metavar="DURATION|auto", help="sprite saves a sealed checkpoint at a step "
        "boundary after every DURATION (30s, 10min, 1h), even without the script's own; auto: Young/Daly "
        "from the first save's stall and --mtbf"),
    mtbf: Optional[str] = typer.Option(None, "--mtbf", metavar="DURATION", help="mean time between failures for "
                                       "--checkpoint-every auto (e.g. 24h); default: the site profile's"),
    keep: Optional[str] = typer.Option(None, "--keep", metavar=WHOLE, help="how many of sprite's own "
                                       "--checkpoint-every checkpoints to keep (default 2)"),
    checkpoint_writer: Optional[str] = typer.Option(
        None, "--checkpoint-writer", metavar="thread|process", help="where a sharded (FSDP) save is written while "
        "training goes on: a thread of each rank or a process of torch's, off the rank's GIL, with host buffers in "
        "shared memory (/dev/shm) the size of the rank's state; default: the process on CUDA where /dev/shm has room "
        "for the node's ranks, else the thread; process without that room falls back to the thread, saying why"),
    preempt_signal: Optional[str] = typer.Option(None, "--preempt-signal", help="USR1 (default), USR2 or none: on "
                                                 "it the ranks checkpoint at the next step and exit 75"),
    requeue: Optional[bool] = typer.Option(None, "--requeue/--no-requeue", help="after the ranks stopped for "
                                           "preemption, ask the batch system to run this job again (job scripts "
                                           "pass it); --no-requeue overrides a spec's or site's requeue: true"),
    preflight: Optional[bool] = typer.Option(None, "--preflight/--no-preflight", help="first check every node "
                                             "(sprite preflight); failed nodes are left out when the allocation has "
                                             "room, else exit 1; --no-preflight overrides a spec's or site's true"),
    preflight_fault: Optional[List[str]] = typer.Option(None, "--preflight-fault", metavar="HOST:KIND",
                                                        help="a negative control for --preflight (tests)"),
    no_checks: bool = typer.Option(False, "--no-checks", help="skip the fit-start checks (world block, warnings)"),
    strict: bool = typer.Option(False, "--strict", help="make every fit-start warning, and a script that never "
                                "joins the launched world, an error (exit 2)"),
    cpu_bind: Optional[str] = typer.Option(None, "--cpu-bind", help="the launcher's --cpu-bind value (mpiexec, srun); "
                                           "default: the site profile's"),
    log_dir: Optional[str] = typer.Option(None, "--log-dir", help="write every rank's output to DIR/rank<N>.log "
                                          "(a fresh folder)"),
    ranks: Optional[str] = typer.Option(None, "--ranks", help="ranks shown on the console: 0, all or a list such as "
                                        "0,3-5; default: all up to 16 ranks, else 0"),
    stage: Optional[str] = typer.Option(None, "--stage", metavar="auto|DIR", help="before the ranks start, copy "
                                        "the Python environment once to every node (auto: a fresh folder in "
                                        "$TMPDIR; DIR: an absolute node-local folder that does not exist yet) and "
                                        "run the ranks from it; the archive is cached in $SPRITE_STAGE_CACHE or "
                                        "~/.cache/sprite/stage"),
    keep_stage: Optional[bool] = typer.Option(None, "--keep-stage/--no-keep-stage", help="leave the staged copy on "
                                              "the nodes at the end; --no-keep-stage overrides a spec's or site's "
                                              "true"),
    dry_run: bool = typer.Option(False, "--dry-run", help="print the launch plan instead of running it"),
    json_out: bool = typer.Option(False, "--json", help="with --dry-run: print {argv, env} as JSON"),
) -> int:
    from sprite.recovery import entry

    if script and script.startswith("-"):  # unknown options land here (sprite's options end at SCRIPT)
        raise UsageError(f"sprite run has no option {script}.", "sprite's options come before SCRIPT.",
                         "See 'sprite run --help' for the options.")
    if json_out and not dry_run:
        raise UsageError("--json only changes what --dry-run prints.", "", "Add --dry-run, or drop --json.")
    if no_checks and strict:
        raise UsageError("--no-checks and --strict contradict each other.", "--strict turns the checks' warnings"
                         " into errors; --no-checks turns the checks off.", "Give one of them.")
    flags = {
        "script": script, "args": list(args) if args else None, "nodes": nodes, "devices": devices,
        "accelerator": value(accelerator), "strategy": value(strategy), "precision": value(precision),
        "launcher": value(launcher), "mpi": value(mpi), "site": site, "exclude": list(exclude) if exclude else None,
        "env": _env_pairs(env), "master_port": master_port, "pass_env": _env_names(env),
        "secrets": list(secret) if secret else None, "resume": resume,
        "checks": "off" if no_checks else ("strict" if strict else None), "cpu_bind": cpu_bind,
        "log_dir": log_dir, "ranks": ranks, "stage": stage, "keep_stage": keep_stage,
        "stall_timeout": stall_timeout, "first_step_timeout": first_step_timeout, "save_timeout": save_timeout,
        "retries": retries, "spare_nodes": spare_nodes,
        "preempt_signal": preempt_signal, "requeue": requeue,
        "checkpoint_every": checkpoint_every, "mtbf": mtbf, "keep": keep,
        "checkpoint_writer": checkpoint_writer,
    }
    flags["preflight"] = preflight
    run_state, launch = entry.prepare(flags, spec, run_dir, allow_literal_secrets=allow_literal_secrets)
    from sprite.cli import preflight as cli_preflight

    checked_first = cli_preflight.hook_for(run_state, preflight_fault)
    for note in launch.notes:
        print(f"sprite: {one_line(note)}", file=sys.stderr)
    if dry_run:
        ahead = checked_first.describe(launch) if checked_first is not None else None  # its faults checked too
        typer.echo(launch.to_json() if json_out else launch.describe() + (f"\n{ahead}" if ahead else ""))
        return 0
    return entry.run_all(run_state, launch, preflight=checked_first)


@app.command("env", help="Show what sprite detects here: scheduler, hosts, ranks per node, devices, backend.\n\n"
                         "Example: sprite env --json")
def env_command(
    site: Optional[str] = typer.Option(None, "--site", help="site profile to apply"),
    json_out: bool = typer.Option(False, "--json", help="print JSON"),
) -> None:
    from sprite.cli import envinfo

    info = envinfo.detect(site)
    typer.echo(envinfo.to_json(info) if json_out else envinfo.describe(info))


def _env_pairs(values: Optional[List[str]]) -> Optional[dict]:
    """The ``--env NAME=VALUE`` options as a mapping (``--env NAME`` ones are ``_env_names``)."""
    pairs = {}
    for pair in values or ():
        name, sep, val = pair.partition("=")
        if sep and not name:
            raise UsageError("An --env option has a value but no NAME.", "",
                             "Write it as --env NAME or --env NAME=VALUE.")
        if sep:
            pairs[name] = val
    return pairs or None


def _env_names(values: Optional[List[str]]) -> Optional[list]:
    names = [pair for pair in values or () if "=" not in pair]
    return names or None


def _mount_subcommands() -> None:
    """Mount command groups that live in their own modules (each stays torch-free at import)."""
    from sprite.cli import preflight as cli_preflight
    from sprite.cli import runs as cli_runs
    from sprite.cli.ckpt import app as ckpt_app
    from sprite.cli.submit import register
    from sprite.parity.bench.cli import app as bench_app
    from sprite.parity.ckpt.cli import app as ckpt_check_app
    from sprite.parity.check.cli import app as parity_app

    register(app)
    app.add_typer(parity_app, name="parity")
    app.add_typer(ckpt_check_app, name="ckpt-check")
    app.add_typer(ckpt_app, name="ckpt")
    cli_runs.register(app)
    cli_preflight.register(app)
    app.add_typer(bench_app, name="bench")


_mount_subcommands()


def main(argv: Optional[List[str]] = None) -> None:
    """Console entry point: one line and exit 2 for bad input, never a traceback for a SpriteError."""
    try:
        result = app(args=argv, standalone_mode=False)
    except SpriteError as err:
        exit_with(err)
    except typer.Exit as err:
        sys.exit(err.exit_code)
    except typer.Abort:
        print("sprite: aborted", file=sys.stderr)
        sys.exit(130)
    except typer.TyperException as err:  # typer's own parsing errors: unknown command, missing argument
        _parse_error(err, sys.argv[1:] if argv is None else argv)
    except OSError as err:  # a path no command checked first (an unreadable folder, a missing parent): one line
        exit_with(from_os_error(err))
    sys.exit(result if isinstance(result, int) else 0)


def _parse_error(err: typer.TyperException, argv: List[str]) -> None:
    """Print a typer parsing error as one line (or the help, when no arguments were given) and exit 2."""
    message = err.format_message()
    if "\n" in message:  # a command given no arguments answers with its help text
        print(message, file=sys.stderr)
    else:
        command = err.ctx.command_path if getattr(err, "ctx", None) else "sprite"
        names = typer.main.get_command(app).commands if command == "sprite" else {}
        if argv and argv[0] in names:  # an option of a command missing its value: typer names no command
            command = f"sprite {argv[0]}"
        print(f"sprite: error: {one_line(message.rstrip('.'))}. See '{command} --help' for usage.", file=sys.stderr)
    sys.exit(EXIT_USAGE)
