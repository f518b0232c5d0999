"""The environment contract between sprite's launcher half and its runtime half.

The launcher exports these variables to every rank; ``python -m sprite.runtime`` reads them. Both halves
import this module, so it must import nothing heavy (no torch, no lightning, no yaml).
"""

from __future__ import annotations

ACCELERATOR = "SPRITE_ACCELERATOR"  # one of ACCELERATORS
STRATEGY = "SPRITE_STRATEGY"  # one of STRATEGIES
PRECISION = "SPRITE_PRECISION"  # a Lightning precision string, or "auto" (keep the script's own)
NUM_NODES = "SPRITE_NUM_NODES"  # nodes in the launched world
DEVICES = "SPRITE_DEVICES"  # ranks per node
WORLD_SIZE = "SPRITE_WORLD_SIZE"  # NUM_NODES * DEVICES, also exported as WORLD_SIZE
LAUNCHER = "SPRITE_LAUNCHER"  # one of LAUNCHER_FLAVOURS
HOSTS = "SPRITE_HOSTS"  # comma-separated hosts in node-rank order (node rank = index of this host)
JOB_ID = "SPRITE_JOB_ID"  # scheduler job id, empty for local runs
SITE = "SPRITE_SITE"  # name of the site profile the plan was built from
CHECKS = "SPRITE_CHECKS"  # one of CHECK_MODES: the fit-start contract checks warn, are off, or are errors
LOG_DIR = "SPRITE_LOG_DIR"  # set when each rank writes its own output to LOG_DIR/rank<N>.log
CONSOLE_RANKS = "SPRITE_CONSOLE_RANKS"  # set when only these ranks may print to the console ("0", "0,3-5")

# Per-run options the runtime reads whether or not the world variables above are set.
RESUME = "SPRITE_RESUME"  # never | auto | a checkpoint path (Trainer.fit's ckpt_path)
RUN_DIR = "SPRITE_RUN_DIR"  # the run folder (audit.jsonl, heartbeat/, run.json), on a file system every node sees;
# unset: no audit records and no heartbeat from the ranks
RESUME_MODES = ("never", "auto")  # or a path
ATTEMPT = "SPRITE_ATTEMPT"  # 1 for the first launch of a run, 2 for its first relaunch, ...
HEARTBEAT_SECONDS = "SPRITE_HEARTBEAT_SECONDS"  # the most often a rank rewrites its heartbeat within one phase
STACKS_AFTER = "SPRITE_STACKS_AFTER"  # "T,S,V": seconds without progress after which a rank dumps its stacks in a
# training step, before its first step, in a checkpoint save (contract/stacks.py); unset: no dump
PREEMPT_SIGNAL = "SPRITE_PREEMPT_SIGNAL"  # USR1 | USR2 | none: the signal on which ranks checkpoint and stop (exit 75)
CHECKPOINT_EVERY = "SPRITE_CHECKPOINT_EVERY"  # seconds between sprite's own saves, or "auto" (Young/Daly from MTBF)
MTBF = "SPRITE_MTBF"  # seconds: the mean time between failures --checkpoint-every auto plans for
KEEP = "SPRITE_KEEP"  # how many of sprite's own clock checkpoints a rank keeps (default 2)
CHECKPOINT_WRITER = "SPRITE_CHECKPOINT_WRITER"  # one of CHECKPOINT_WRITERS: where a sharded save is written
JOB_SCRIPT = "SPRITE_JOB_SCRIPT"  # set by a job script that may requeue: its own path, to submit it again (PBS)

ALL = (ACCELERATOR, STRATEGY, PRECISION, NUM_NODES, DEVICES, WORLD_SIZE, LAUNCHER, HOSTS, JOB_ID, SITE, CHECKS,
       LOG_DIR, CONSOLE_RANKS)

# Values both halves accept for SPRITE_ACCELERATOR and SPRITE_STRATEGY ("auto": decide inside the rank).
ACCELERATORS = ("auto", "xpu", "cuda", "cpu")
STRATEGIES = ("auto", "single", "ddp", "fsdp")
CHECK_MODES = ("on", "off", "strict")  # SPRITE_CHECKS; "on" when unset
CHECKPOINT_WRITERS = ("thread", "process")  # SPRITE_CHECKPOINT_WRITER; unset: picked per run (ckpt/dcp_write.py)
# Variables a plan sets only when the run asks for them (--checkpoint-every, --mtbf, --keep, --checkpoint-writer,
# --log-dir, --ranks, a stall timeout's stack dumps): the launch environment drops any the user's shell exported,
# so only the flags and the spec decide them.
ASKED_FOR = (CHECKPOINT_EVERY, MTBF, KEEP, CHECKPOINT_WRITER, LOG_DIR, CONSOLE_RANKS, STACKS_AFTER)
PREEMPT_SIGNALS = ("USR1", "USR2", "none")  # SPRITE_PREEMPT_SIGNAL; sprite/contract/preemption.py says why USR1 is the default

# Launcher flavours a plan can be built for; the runtime resolves ranks differently for each.
LAUNCHER_FLAVOURS = ("local", "pals", "hydra", "openmpi", "srun", "torchrun")

# Standard rendezvous variables sprite sets or reads (torch.distributed / Lightning names).
MASTER_ADDR = "MASTER_ADDR"
MASTER_PORT = "MASTER_PORT"
RANK_VARS = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "NODE_RANK", "LOCAL_WORLD_SIZE")

# Distributed backend per device type; the runtime's device table uses the same names.
BACKENDS = {"xpu": "xccl", "cuda": "nccl", "cpu": "gloo"}
