"""Where the ranks' output goes: a label on every line, one log file per rank (``--log-dir``) and the console
filter (``--ranks``), per launcher flavour. Pure: a table of each launcher's own options and the rules.

Each launcher labels lines with its own option (checked against its documentation, cited in ``LABELS``).
``--log-dir DIR`` writes ``DIR/rank<N>.log``: with the launcher's own per-rank output option where it has one
(srun, MPICH Hydra); those send the ranks' output to the files instead of the console, so sprite's follower
(``python -m sprite.launch.ranklog``) prints the console ranks' files as they grow, as torchrun's agent tails its log
files. Elsewhere (PALS, Open MPI, torchrun) each rank tees its own output (``sprite.runtime.output``), and the
local supervisor writes the files itself. Without ``--log-dir`` the console filter runs inside each rank.
"""

from __future__ import annotations

from sprite import contract
from sprite.contract.console import console_ranks, members, shows_all

# The launcher's own option that labels each output line with its rank.
LABELS = {
    # MPICH Hydra `mpiexec -prepend-rank -help`: "Prepend process rank to stdout and stderr" (prefix "[%r] ",
    # pmodels/mpich src/pm/hydra mpiexec options; MPICH 5.0.2 here, seen 2026-11-29).
    "hydra": ["-prepend-rank"],
    # HPE PALS mpiexec: ALCF's Aurora guides launch with `mpiexec -l --line-buffer` (docs/aurora/data-science/
    # profiling_dl.md, argonne-lcf/user-guides 7d04a3f, read 2026-11-29); --label is -l's long form, used
    # as `mpiexec --label --line-buffer` in public PALS job scripts. --line-buffer keeps labelled lines whole.
    "pals": ["--label", "--line-buffer"],
    # Slurm srun(1), https://slurm.schedmd.com/srun.html: "-l, --label  Prepend task number to lines of
    # stdout/err" (seen prefixing "0: " with Slurm 22.05 here).
    "srun": ["--label"],
    # Open MPI mpirun(1), docs.open-mpi.org v5.0.x: "--tag-output: Tag each line of output to stdout, stderr,
    # and stddiag with [jobid, MCW_rank]<stdxxx>".
    "openmpi": ["--tag-output"],
}


def pattern_problem(flavour: str, log_dir: str) -> str | None:
    """Why ``log_dir`` cannot reach ``flavour``'s per-rank file pattern as written; None when it can.

    MPICH Hydra fills in every ``%`` of ``-outfile-pattern`` (``%r`` rank, ``%h`` host, ``%g``, ``%p``, ``%t``;
    `mpiexec -outfile-pattern -help`, MPICH 5.0.2) and has no escape: ``-outfile-pattern 'M%r/rank%r.log'``
    wrote into ``M0/rank0.log`` over the bytes already there (seen here, 2026-12-01). srun's ``%%`` is a plain
    ``%`` (``escape_pattern``), but a backslash anywhere turns every pattern off (srun(1), "filename pattern":
    "\\ Do not process any of the replacement symbols"), so ``rank%t`` would become one file for all ranks.
    """
    if flavour == "hydra" and "%" in log_dir:
        return ("holds %, which Hydra's mpiexec -outfile-pattern fills in (%r becomes the rank) with no escape, so "
                "the ranks would write into other folders")
    if flavour == "srun" and "\\" in log_dir:
        return ("holds a backslash, which turns off srun --output's patterns, so every rank would write one file")
    return None


def escape_pattern(flavour: str, log_dir: str) -> str:
    """``log_dir`` as text for ``flavour``'s file pattern: srun(1) reads ``%%`` as one ``%``."""
    return log_dir.replace("%", "%%") if flavour == "srun" else log_dir


def log_file_options(flavour: str, log_dir: str) -> list[str]:
    """The launcher's own options that write rank N's output to ``log_dir/rank<N>.log``; [] when it has none.
    ``log_dir`` passed ``pattern_problem``."""
    pattern = f"{escape_pattern(flavour, log_dir)}/rank%{'t' if flavour == 'srun' else 'r'}.log"
    if flavour == "srun":
        # srun(1) IO redirection: "%t task identifier (rank) relative to current job. This will create a
        # separate IO file per task"; stderr follows --output unless --error is given (seen with Slurm 22.05).
        return [f"--output={pattern}"]
    if flavour == "hydra":
        # `mpiexec -outfile-pattern -help`: "%r: Process rank"; Hydra needs DIR to exist and writes an existing
        # file from its start without truncating it ("keep\n" then "hi\n" left "hi\np\n"; MPICH 5.0.2 here,
        # 2026-12-01), so ranklog.check refuses a folder that holds rank logs.
        return ["-outfile-pattern", pattern, "-errfile-pattern", pattern]
    return []


def _native_files(flavour: str, log_dir: str | None) -> bool:
    return bool(log_dir and log_file_options(flavour, log_dir))


def rank_env(flavour: str, size: int, log_dir: str | None, ranks: str | None) -> dict[str, str]:
    """What the runtime in each rank must do itself (``SPRITE_LOG_DIR``, ``SPRITE_CONSOLE_RANKS``), if anything."""
    console = console_ranks(ranks, size)
    if flavour == "local" or _native_files(flavour, log_dir):
        return {}  # the supervisor, or the launcher and sprite's follower, handle both
    env = {contract.LOG_DIR: log_dir} if log_dir else {}
    if not shows_all(console, size):
        env[contract.CONSOLE_RANKS] = console
    return env


def launch_argv(flavour: str, argv: list[str], size: int, log_dir: str | None, ranks: str | None,
                python: str) -> list[str]:
    """``argv`` with the launcher's label and per-rank file options, wrapped in the follower when it needs one."""
    console = console_ranks(ranks, size)
    if flavour == "local":
        extras = ([] if shows_all(console, size) else ["--ranks", console]) + (["--log-dir", log_dir] if log_dir else [])
        at = argv.index("--")
        return argv[:at] + extras + argv[at:]
    own = (LABELS.get(flavour, []) if size > 1 else []) + (log_file_options(flavour, log_dir) if log_dir else [])
    argv = argv[:1] + own + argv[1:]
    if _native_files(flavour, log_dir):
        return [python, "-m", "sprite.launch.ranklog", "--dir", str(log_dir), "--ranks", console, "--size", str(size),
                "--", *argv]
    return argv


def notes(size: int, log_dir: str | None, ranks: str | None) -> list[str]:
    """What the user should know before the ranks start: who is on the console, where the files go."""
    console = console_ranks(ranks, size)
    out = []
    if not shows_all(console, size):
        shown = members(console, size)
        shown = f"rank {shown[0]}" if len(shown) == 1 else f"ranks {console}"
        keep = "" if log_dir else "; --log-dir DIR keeps every rank's output"
        out.append(f"the console shows {shown} of {size} ranks (--ranks all shows every rank{keep}).")
    if log_dir:
        out.append(f"every rank's output goes to {log_dir}/rank<N>.log.")
    return out
