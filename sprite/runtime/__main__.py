"""``python -m sprite.runtime SCRIPT ARGS...``: run a script as one rank of the launched world.

Reads the ``SPRITE_*`` contract, exports the standard ``RANK``/``WORLD_SIZE``/... variables from the launcher's own
(standard_env.py), starts the heartbeat, then runs the script as ``__main__`` with its own argv and reports a world
smaller than the launched one (world_check.py; docs/scripts.md). When the script first imports Lightning (at once
in a rank forked from a warm supervisor), sprite registers its accelerator and strategies and makes every
``Trainer(...)`` and ``Fabric(...)`` the script builds run the launched world; a script that never imports
Lightning never pays for it. Without any ``SPRITE_*`` variable it runs the script as a single process with the
"xpu" accelerator registered."""

from __future__ import annotations

import os
import runpy
import sys
import warnings

from sprite.errors import EXIT_USAGE, SpriteError, UsageError, one_line, report

USAGE = "usage: python -m sprite.runtime SCRIPT [ARGS...]"


def run(argv: list[str]) -> None:
    """Prepare Lightning for this launch and run ``argv[0]`` as ``__main__`` with ``argv[1:]`` as its arguments.

    Raises:
        UsageError: no script, a script that does not exist, or a malformed ``SPRITE_*`` contract.
    """
    if not argv or argv[0] in ("-h", "--help"):
        raise UsageError("No script given.", USAGE, "Pass the training script and its arguments.")
    script = argv[0]
    if not os.path.isfile(script):
        raise UsageError(f"Script {script!r} does not exist.", "A relative path is read from the rank's working"
                         " directory.", f"Check the path (cwd: {os.getcwd()}).")
    from sprite.runtime import preempt_signal

    preempting = preempt_signal.install(os.environ)  # first: the signal may come during the imports below
    from sprite.runtime import beats as progress
    from sprite.runtime import config, hooks, pytorch_lightning_guard, standard_env, world_check

    cfg = config.from_env(os.environ)
    rank = 0
    if cfg is not None and cfg.launcher:
        ranks = standard_env.export(os.environ, cfg)  # before anything reads RANK: a plain script, Lightning
        standard_env.bind_device(cfg, ranks.local_rank)
        rank = ranks.global_rank
    if cfg is not None:
        progress.start(os.environ, rank)  # the stall watchdog's heartbeat (beats.py)
        world_check.install(rank)
        pytorch_lightning_guard.install(cfg)
        if cfg.launcher != "srun":
            # Lightning 2.6.6 fabric/plugins/environments/slurm.py:205 tells every rank to "prepend srun" whenever
            # srun is on PATH; sprite chose this launcher on purpose, so the hint only misleads.
            warnings.filterwarnings("ignore", message="The `srun` command is available on your system but is not used")
    # The rest wraps Lightning: done when the script first imports it (`import lightning` imports
    # lightning.pytorch too), so a plain torch script's ranks never import Lightning (about 3 s of CPU a rank here).
    # When that first import comes from one of sprite's own runtime modules (`from sprite import FSDP2Strategy` as
    # the script's first Lightning import), the wrapping waits until that module is whole: it imports it too.
    hooks.after_import("lightning.pytorch", lambda: _prepare_lightning(cfg, preempting), wait_for="sprite.runtime.")
    sys.argv = [script, *argv[1:]]
    # As `python SCRIPT` would: the script's folder first on sys.path. Under PYTHONSAFEPATH (set by sprite's
    # plans) `-m` put no cwd entry there to replace, so the folder is inserted instead.
    folder = os.path.dirname(os.path.abspath(script))
    if getattr(sys.flags, "safe_path", False):
        sys.path.insert(0, folder)
    else:
        sys.path[0] = folder
    _run_script(script, launched=cfg is not None,
                joined=lambda: world_check.check(cfg.world_size, rank, cfg.checks) if cfg is not None else None)


def _prepare_lightning(cfg, preempting: bool) -> None:
    """Register sprite's accelerator and strategies with Lightning and make its Trainer and Fabric run the launched
    world (``cfg`` None: registration only), right after the script's first import of Lightning."""
    from sprite.runtime import fabric_wrap, preempt, registry, trainer_wrap
    from sprite.runtime.ckpt import resume
    from sprite.runtime.ckpt import rng_state
    from sprite.runtime.ckpt import seal as ckpt_seal

    registry.register()
    ckpt_seal.install()
    rng_state.install()
    resume.install(resume.mode(os.environ))
    if preempting:
        preempt.install()
    if cfg is not None:
        trainer_wrap.mark_saves()  # the checkpoint-save phase in the heartbeat
        trainer_wrap.install(cfg)
        fabric_wrap.install(cfg)


SIGTERM_EXIT = 128 + 15  # what a process the signal ended reports to a shell: a launcher then says it failed


def _stopped_by_sigterm(exit: SystemExit) -> bool:
    """Whether ``exit`` is Lightning's ``SIGTERMException``: raised by its loops after a SIGTERM (a scheduler's time
    limit, ``scancel``), with no exit code, so the rank would exit 0 and a launcher that returns its ranks' codes
    (srun) would report the cut-short fit as finished. Lightning is looked up only where the script loaded it."""
    exceptions = sys.modules.get("lightning.pytorch.utilities.exceptions")
    found = getattr(exceptions, "SIGTERMException", None)
    return found is not None and isinstance(exit, found)


def _run_script(script: str, launched: bool, joined=lambda: None) -> None:
    """Run the script as ``__main__``; once it has returned (or called ``sys.exit(0)``) in a launched world, wait
    for the background checkpoint work (durable.py), say so to the watchdog, end every rank together
    (finish.py), report a world smaller than the launched one (``joined``: world_check.py), and then fail this
    rank (exit 1) if a checkpoint it saved in the background failed after the last save that could say so;
    stopped for preemption, wait for that work too and exit 75 (preempt.py); failing, leave the process group at
    once (finish.abandon) so the rank exits with its own code."""
    from sprite.runtime import finish, world_check
    from sprite.runtime.ckpt import durable
    from sprite.runtime import beats as progress

    try:
        runpy.run_path(script, run_name="__main__")
    except SystemExit as exit:
        # Only preempt.py's callback raises Preempted, and it is loaded with Lightning: a plain script's rank
        # must not import it (and Lightning with it) here.
        preempt = sys.modules.get("sprite.runtime.preempt")
        if preempt is not None and isinstance(exit, preempt.Preempted):
            durable.drain()
            raise SystemExit(preempt.exit_preempted(exit)) from None
        if _stopped_by_sigterm(exit):  # Lightning's SystemExit without a code: the fit did not finish
            if launched:
                progress.fail()
                finish.abandon()
            raise SystemExit(SIGTERM_EXIT) from None
        if launched and exit.code in (None, 0):
            durable.settle()  # checkpoints on disk and superseded ones removed, while the process group lives
            progress.finish()
            world_check.note()  # before finish destroys it: a group made by init_device_mesh bypassed the wrapper
            finish.finish()
            joined()
            durable.check()  # after the ranks ended together, so a peer is never left waiting for this one
        elif launched:
            progress.fail()
            finish.abandon()
        raise
    except BaseException:
        if launched:
            progress.fail()
            finish.abandon()
        raise
    if launched:
        durable.settle()
        progress.finish()
        world_check.note()
        finish.finish()
        joined()
        durable.check()


def main() -> int:
    from sprite.runtime import output

    split = None
    output.whole_lines()
    try:
        split = output.install(os.environ)  # --log-dir / --ranks: before anything prints
        run(sys.argv[1:])
    except SpriteError as err:
        print(report(err), file=sys.stderr, flush=True)
        if split:
            split.failed(one_line(str(err), 300))
        return err.exit_code if err.exit_code else EXIT_USAGE
    except SystemExit as exit:
        if split and exit.code not in (0, None):
            split.failed(f"the script exited with code {exit.code}")
        raise
    except BaseException as err:  # the traceback goes to the rank's own output; the console gets one line
        if split:
            split.failed(one_line(f"{type(err).__name__}: {err}", 300))
        raise
    return 0


if __name__ == "__main__":
    from sprite.contract import warm

    warm.delegate(sys.argv[1:])  # with a warm server that takes this rank, this process stands in for its fork
    try:
        code = main()
    except SystemExit as ended:
        if ended.code not in (None, 0):
            raise
        code = 0
    if code == 0:
        from sprite.runtime import finish

        finish.leave()  # ends the process here if the script asked to skip the interpreter's teardown
    sys.exit(code)
