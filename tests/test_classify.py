"""The attempt classifier and the relaunch policy, on attempt logs recorded from real failures on this machine.

Each file in tests/data/attempt-logs/ is the ``attempt-N.log`` sprite wrote for a run it launched (rank output
and sprite's own lines), recorded with the exit code sprite saw; how each was provoked is in its README.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from sprite.recovery import classify, policy
from sprite.recovery.classify import (APP_FAULT, CHECK_FAILED, INTERRUPTED, NODE_FAULT, PREEMPTION, STALL, SUCCESS,
                                      USAGE, Verdict)

LOGS = Path(__file__).parent / "data" / "attempt-logs"
RANK_HOSTS = ("nid001", "nid002")  # the host of rank 0 and of rank 1, for logs that name ranks only

# file, exit code sprite saw, expected cause, expected blamed hosts, a phrase the reason must hold
RECORDED = [
    ("local-rank-killed.log", 137, NODE_FAULT, ("nid002",), "rank 1 on nid002 was killed by SIGKILL"),
    ("hydra-rank-killed.log", 9, NODE_FAULT, ("vm",), "on vm was killed by SIGKILL"),
    ("torchrun-rank-killed.log", 1, NODE_FAULT, ("localhost",), "rank 1 on localhost was killed by SIGKILL"),
    ("local-value-error.log", 1, APP_FAULT, (), "rank 1: ValueError: rank 1 raises on purpose at step 3"),
    ("hydra-value-error.log", 1, APP_FAULT, (), "ValueError: rank 1 raises on purpose at step 3"),
    ("local-cpu-out-of-memory.log", 1, APP_FAULT, (), "out of memory (can't allocate memory)"),
    ("local-trainer-contradicts-launch.log", 2, USAGE, (), "Trainer(devices=4) contradicts the launch"),
    ("local-store-unreachable.log", 1, NODE_FAULT, (), "a rank lost its peers (failed to connect)"),
    ("srun-rank-killed.log", 143, NODE_FAULT, ("vm",), "rank 1 on vm was killed by SIGKILL"),
    ("srun-node-failure.log", 0, NODE_FAULT, ("vm",), "node failure (Node failure on vm)"),
    ("srun-time-limit.log", 137, PREEMPTION, (), "sprite received SIGTERM"),
    ("hydra-sleeping-rank-stall.log", 124, STALL, (), "ranks 0-1 on vm in training step at step 3"),
    ("local-fsdp2-guarded-save-stall.log", 124, STALL, (), "rank 0 on vm in checkpoint save at step 4"),
    ("hydra-rank-failed-peer-busy.log", 1, APP_FAULT, (), "rank 1: RuntimeError: rank 1 fails at step 2 on purpose"),
]


@pytest.mark.parametrize("name,code,cause,hosts,phrase", RECORDED, ids=[r[0] for r in RECORDED])
def test_recorded_logs(name, code, cause, hosts, phrase):
    verdict = classify.classify(code, (LOGS / name).read_text(), RANK_HOSTS)
    assert (verdict.cause, verdict.hosts) == (cause, hosts), verdict
    assert phrase in verdict.reason


def test_every_recorded_log_is_tested():
    assert sorted(p.name for p in LOGS.glob("*.log")) == sorted(r[0] for r in RECORDED)


def test_sprites_own_lines_and_exit_codes():
    assert classify.classify(0, "anything") == Verdict(SUCCESS, "every rank finished")
    forwarded = "sprite: received SIGTERM; passing it to the launcher.\nsprite: rank 0 exited with code -15"
    assert classify.classify(143, forwarded).cause == PREEMPTION
    assert classify.classify(130, "sprite: received SIGINT; passing it to the launcher.").cause == INTERRUPTED
    refused = "[rank 0] sprite: error: No valid checkpoint to resume from in ckpts/."
    assert classify.classify(1, refused) == Verdict(CHECK_FAILED, "No valid checkpoint to resume from in ckpts/.")
    stall = ("sprite: error: Stopped the run: no rank advanced for 31 s (stall timeout 30 s): ranks 0-11 on a in "
             "training step at step 37; ranks 12-23 on b in training step at step 36. The ranks on some hosts fell "
             "behind the others in a training step: a node fault is likely (suspect hosts: b). Look at ...")
    assert classify.classify(124, stall).hosts == ("b",)
    assert classify.classify(124, stall, suspects=("c", "d")).hosts == ("c", "d")  # the watchdog's own Stall
    assert classify.classify(124, stall, suspects=()).hosts == ()
    cut = stall.replace("(suspect hosts: b)", "(suspect hosts: b,c and 40 more)")
    assert classify.classify(124, cut).hosts == ()  # a list cut short names no host
    # the line as the watchdog writes it now (cause and fix before the summary): the attempt's reason keeps what
    # stopped and where the ranks were, not a 300-character cut through the advice
    where = "ranks 0-11 on a in training step at step 37; ranks 12-23 on b in training step at step 36"
    line = ("sprite: error: Stopped the run: no rank advanced for 31 s (stall timeout 30 s). The ranks on some hosts "
            "fell behind the others in a training step: a node fault is likely (suspect hosts: b). Look at what the "
            "named ranks were doing; raise --stall-timeout if a step really takes this long. Where the ranks were: "
            f"{where}.")
    reason = classify.classify(124, line).reason
    assert reason == f"Stopped the run: no rank advanced for 31 s (stall timeout 30 s); {where}.", reason
    long = line.replace(where, "; ".join([where] * 10))
    assert len(classify.classify(124, long).reason) == 300 and classify.classify(124, long).reason.endswith("…")
    assert classify.classify(137, "").cause == NODE_FAULT  # killed, and nothing else said
    assert classify.classify(3, "no clue").reason == "exit code 3 with no recognised cause in the log"
    said = "[rank 0] sprite: resume: from ckpts/step=4.ckpt (step 4, epoch 0)\n[rank 1] ValueError: boom"
    assert classify.classify(1, said).cause == APP_FAULT  # sprite's notes are not refusals


@pytest.mark.parametrize("label, rank", [("[rank 1] ", "1"), ("[1] [rank1]: ", "1"), ("1: ", "1"), (" 12: ", "12"),
                                         ("[1,3]<stderr>:", "3"), ("[prterun-vm-42@1,5]<stderr>: ", "5"), ("", "")])
def test_a_ranks_exception_is_found_under_every_launchers_label(label, rank):
    """sprite.launch.rank_output.LABELS: the local supervisor, Hydra (with torch's own prefix), srun and PALS, and
    Open MPI label each line their way; a peer's lost connection after it is not the cause."""
    log = (f"{label}Traceback (most recent call last):\n{label}RuntimeError: rank 1 fails on purpose\n"
           "[0] [rank0]: RuntimeError: [pair.cc:553] Connection closed by peer [127.0.0.1]:65155.\n")
    verdict = classify.classify(1, log)
    assert verdict.cause == APP_FAULT, verdict
    assert verdict.reason == (f"rank {rank}: " if rank else "") + "RuntimeError: rank 1 fails on purpose"


def test_a_ranks_echo_of_a_vanished_peer_is_not_sprites_refusal():
    """A background save's outcome on rank 0 after rank 1 died echoes the lost connection as sprite's error line;
    rank 1's own failure is the cause (an application fault, relaunched past the first step), not a failed check."""
    log = ("[1] [rank1]: ValueError: boom at step 7\n"
           "[0] sprite: error: RuntimeError: [pair.cc:553] Connection closed by peer [127.0.0.1]:41.\n")
    assert classify.classify(1, log) == Verdict(APP_FAULT, "rank 1: ValueError: boom at step 7")


@pytest.mark.parametrize("label", ["[rank 0] ", "[0] ", "0: ", "[1,0]<stderr>:"])
def test_sprites_own_error_line_is_found_under_every_launchers_label(label):
    """docs/long-runs.md: exit 2 or 1 with sprite's own error line is bad usage or a failed check, never relaunched,
    whichever launcher labelled the rank's line."""
    said = f"{label}sprite: error: No valid checkpoint to resume from in ckpts/. Fix it.\n"
    assert classify.classify(1, said) == Verdict(CHECK_FAILED, "No valid checkpoint to resume from in ckpts/. Fix it.")
    assert classify.classify(2, said).cause == USAGE


@pytest.mark.parametrize("code, log, cause", [
    (134, "[rank 1] terminate called after throwing an instance of 'c10::Error'", APP_FAULT),
    (134, "sprite: rank 1 exited with code -6; stopping the other ranks.", APP_FAULT),
    (139, "sprite: rank 1 exited with code -11; stopping the other ranks.", APP_FAULT),
    (1, "/bin/sh: line 1: 4242 Segmentation fault (core dumped) python train.py", APP_FAULT),
    (135, "sprite: rank 1 exited with code -7; stopping the other ranks.", NODE_FAULT),
    (1, "srun: error: nid001: task 1: Bus error", NODE_FAULT),
    (2, "train.py: error: unrecognized arguments: --lr", APP_FAULT),  # a 2 not sprite's own
])
def test_an_abort_is_the_applications_and_a_sigbus_the_nodes(code, log, cause):
    """docs/long-runs.md's table: an abort (C++ terminate, SIGABRT, SIGSEGV) is an application fault, relaunched
    only past the first step; SIGBUS or a Bus error line is a node fault; an exit 2 without sprite's own error line
    is not bad usage."""
    assert classify.classify(code, log).cause == cause


def test_lines_from_slurm_batch_outputs():
    # Recorded here in the batch jobs' own output (not the attempt log): `scontrol update state=down` of the node,
    # and a job past its --time. The attempt logs of those jobs are in RECORDED above.
    down = ("slurmstepd-vm: error: *** JOB 2 ON vm CANCELLED AT 2026-11-29T20:24:44 DUE TO NODE FAILURE, SEE "
            "SLURMCTLD LOG FOR DETAILS ***")
    verdict = classify.classify(143, down)
    assert (verdict.cause, verdict.hosts) == (NODE_FAULT, ("vm",))
    late = "slurmstepd-vm: error: *** JOB 3 ON vm CANCELLED AT 2026-11-29T20:26:35 DUE TO TIME LIMIT ***"
    assert classify.classify(143, late).cause == PREEMPTION
    # Slurm's memory-limit message in the format it prints (no cgroup memory limit could be provoked here).
    assert classify.classify(137, "slurmstepd: error: Detected 1 oom_kill event in StepId=12.0.").cause == APP_FAULT


@pytest.mark.parametrize("verdict,attempt,progressed,relaunch,exclude", [
    (Verdict(SUCCESS, ""), 1, True, False, ()),
    (Verdict(USAGE, ""), 1, True, False, ()),
    (Verdict(CHECK_FAILED, ""), 1, True, False, ()),
    (Verdict(PREEMPTION, ""), 1, True, False, ()),
    (Verdict(INTERRUPTED, ""), 1, True, False, ()),
    (Verdict(STALL, ""), 1, True, False, ()),  # every rank at one step: the script's own hang
    (Verdict(STALL, "", ("b",)), 1, True, True, ("b",)),
    (Verdict(NODE_FAULT, "", ("b",)), 1, False, True, ("b",)),
    (Verdict(NODE_FAULT, ""), 1, False, True, ()),
    (Verdict(APP_FAULT, ""), 1, True, True, ()),
    (Verdict(APP_FAULT, ""), 1, False, False, ()),  # failed before its first step: would fail again
    (Verdict(NODE_FAULT, "", ("b",)), 3, True, False, ()),  # --retries 2 used up
])
def test_policy(verdict, attempt, progressed, relaunch, exclude):
    decision = policy.decide(verdict, attempt, retries=2, progressed=progressed)
    assert (decision.relaunch, decision.exclude) == (relaunch, exclude), decision.why


def test_cost_is_nodes_and_ranks_times_hours():
    assert policy.hours(1800, nodes=2, ranks=24) == {"seconds": 1800, "node_hours": 1.0, "device_hours": 12.0}
