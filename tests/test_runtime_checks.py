"""The fit-start checks without processes: batch arithmetic, padding, digests, messages, strategy refusal, plumbing.

The real 2-rank fits are in test_runtime_checks_launch.py.
"""

from __future__ import annotations

import io
import json
import subprocess

import lightning as L
import pytest
import torch
from lightning.pytorch import Trainer
from lightning.pytorch.callbacks import Callback
from lightning.pytorch.strategies import DDPStrategy, FSDPStrategy
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

from sprite.jobs import script as jobscript
from sprite.launch import plan
from sprite.spec import sites
from sprite.spec import job as spec
from sprite.spec import yamldoc
from sprite.errors import UsageError
from sprite.runtime import config, trainer_wrap
from sprite.runtime.checks import batch_digest
from sprite.runtime.checks import findings
from sprite.runtime.checks import loaders
from sprite.runtime.checks import world_block
from sprite.runtime.checks.batch_math import BatchFacts, batch_lines, repeated_samples
from sprite.runtime.checks.fit import FitChecks
from sprite.runtime.fsdp2 import FSDP2Strategy

LAUNCH = {"SPRITE_ACCELERATOR": "cpu", "SPRITE_STRATEGY": "auto", "SPRITE_PRECISION": "auto", "SPRITE_NUM_NODES": "1",
          "SPRITE_DEVICES": "2", "SPRITE_WORLD_SIZE": "2", "SPRITE_LAUNCHER": "local"}


def cfg(**changes):
    return config.from_env({**LAUNCH, **{f"SPRITE_{k.upper()}": v for k, v in changes.items()}})


@pytest.fixture
def rank0(monkeypatch):
    """This test process poses as rank 0 of a 2-rank local launch (monkeypatch restores the variables)."""
    for name, value in {**LAUNCH, "RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "2", "MASTER_PORT": "29999"}.items():
        monkeypatch.setenv(name, value)


# --- global batch arithmetic -------------------------------------------------------------------------------------

def test_full_windows_give_local_times_world_times_accumulation():
    facts = BatchFacts(local=8, replicas=4, accumulation=2, batches=6, samples=48)
    assert facts.global_batch == 64 and facts.final_step == 64
    assert batch_lines(facts, 4) == ["batch      8 per rank x 4 ranks x 2 accumulated = 64 samples per optimizer step"]


@pytest.mark.parametrize("facts, final, note", [
    (BatchFacts(8, 2, 1, batches=3, samples=18), 4, "a last batch of 2 samples per rank"),
    (BatchFacts(8, 2, 4, batches=6, samples=48), 32, "a last window of 2 of 4 batches (Lightning still divides"),
    (BatchFacts(8, 2, 2, batches=3, samples=18), 4, "a last batch of 2 samples per rank and a last window of 1 of 2"),
])
def test_a_short_epoch_end_changes_the_last_step(facts, final, note):
    assert facts.final_step == final
    batch, epoch = batch_lines(facts, 2)
    assert f"the last step sees {final} samples, not {facts.global_batch}: " in epoch and note in epoch


def test_drop_last_and_unknown_sizes():
    assert BatchFacts(8, 2, 1, batches=2, samples=18, drop_last=True).final_step == 16
    assert BatchFacts(8, 2, 1).final_step is None and len(batch_lines(BatchFacts(8, 2, 1), 2)) == 1
    (line,) = batch_lines(BatchFacts(None, 2, 3), 2)
    assert line.startswith("batch      unknown per rank") and "x 2 ranks x 3 accumulated" in line
    assert "x 2 data-parallel groups x" in batch_lines(BatchFacts(8, 2, 1), 4)[0]


def sharded_loader(length: int, world: int, batch_size: int = 2) -> DataLoader:
    data = TensorDataset(torch.zeros(length, 1))
    return DataLoader(data, batch_size=batch_size, sampler=DistributedSampler(data, world, rank=0, shuffle=False))


@pytest.mark.parametrize("length, world, extra", [(5, 2, 1), (4, 2, 0), (7, 4, 1), (1, 12, 11), (24, 12, 0)])
def test_padding_count_matches_distributed_sampler(length, world, extra):
    assert repeated_samples(length, world) == extra
    assert DistributedSampler(range(length), world, rank=0).total_size - length == extra
    assert loaders.repeated(sharded_loader(length, world)) == (length, extra)


def test_padded_sets_skip_loops_that_stop_before_the_repeats():
    five, four = sharded_loader(5, 2), sharded_loader(4, 2)  # 3 and 2 samples per rank: 2 and 1 batches
    assert loaders.padded_sets([five, four], [2, 1]) == [(5, 1)]
    assert loaders.padded_sets({"a": five}, [1]) == []  # limit_val_batches=1: the repeated sample is never run
    assert loaders.padded_sets(DataLoader(TensorDataset(torch.zeros(5, 1))), [5]) == []  # no DistributedSampler
    assert loaders.padded_sets(None, []) == []


def test_world_block_lines():
    facts = world_block.WorldFacts(2, 12, "pals", "xpu", "xccl", "FSDP2Strategy", "bf16-mixed",
                                   BatchFacts(4, 24, 1, batches=10, samples=40, repeated=3))
    lines = world_block.render(facts)
    assert lines[:3] == ["sprite: world      2 nodes x 12 ranks per node = 24 ranks (launcher pals)",
                         "sprite: device     xpu, backend xccl",
                         "sprite: strategy   FSDP2Strategy, precision bf16-mixed"]
    assert lines[3] == "sprite: batch      4 per rank x 24 ranks x 1 accumulated = 96 samples per optimizer step"
    assert lines[4] == "sprite: epoch      10 batch(es) per rank; the sampler repeats 3 sample(s) to even the ranks"


# --- batch digests -----------------------------------------------------------------------------------------------

def test_digest_tells_sharded_rows_apart_and_ignores_key_order():
    x = torch.arange(32.0).reshape(8, 4)
    assert batch_digest.digest([x[:4], x[:4, :1]]) == batch_digest.digest([x[:4].clone(), x[:4, :1].clone()])
    assert batch_digest.digest([x[:4]]) != batch_digest.digest([x[4:]])
    assert batch_digest.digest({"a": x, "b": "text"}) == batch_digest.digest({"b": "text", "a": x})
    assert batch_digest.digest(x.bfloat16()) != batch_digest.digest(x)  # dtype counts; bf16 hashes at all
    assert batch_digest.digest({"ids": [1, 2], "mask": x > 3}) != batch_digest.digest({"ids": [1, 3], "mask": x > 3})


@pytest.mark.parametrize("digests, dp_ranks, groups", [
    ([7, 7], [0, 1], [[0, 1]]),
    ([7, 8, 7, 9], [0, 1, 2, 3], [[0, 2]]),
    ([7, 8, 9, 10], [0, 1, 2, 3], []),
    ([7, 7, 8, 8], [0, 0, 1, 1], []),  # tensor parallel pairs share their batch on purpose
    ([7, 7, 7, 7], [0, 0, 1, 1], [[0, 1, 2, 3]]),
])
def test_shared_groups(digests, dp_ranks, groups):
    assert batch_digest.shared_groups(digests, dp_ranks) == groups


# --- messages ----------------------------------------------------------------------------------------------------

def test_messages_name_the_numbers_and_the_fix():
    every = findings.shared_batches([[0, 1, 2, 3]], 4).line()
    assert every.startswith("Every rank (4 of 4) got the same first training batch") and "map-style" in every
    assert findings.shared_batches([[0, 2]], 4).line().startswith("Ranks 0, 2 got the same first training batch")
    pad = findings.padded_evaluation("test", 5, 2, 1).line()
    assert "test set has 5 samples on 2 ranks" in pad and "repeats 1 of them so every rank gets 3" in pad
    assert "Trainer(devices=1)" in pad and "use_distributed_sampler=False" in pad
    cuda = findings.nccl_timeout("600", "cuda").line()
    assert "not a process-group timeout" in cuda and "DDPStrategy(timeout=" in cuda and "--stall-timeout" in cuda
    xpu = findings.nccl_timeout("x" * 500, "xpu").line()
    assert "On XPU no process-group timeout is enforced" in xpu and "DDPStrategy(timeout=" not in xpu
    assert "x" * 40 + "..." in xpu and "x" * 41 not in xpu and "--stall-timeout" in xpu  # the value is cut


def test_report_warns_on_rank_zero_only_and_raises_everywhere_under_strict():
    finding = findings.padded_evaluation("validation", 5, 2, 1)
    out0, out1 = io.StringIO(), io.StringIO()
    findings.report(finding, "on", True, out0)
    findings.report(finding, "on", False, out1)
    assert out0.getvalue() == "sprite: warning: " + finding.line() + "\n" and out1.getvalue() == ""
    for rank_zero in (True, False):
        with pytest.raises(UsageError, match="an error because of --strict") as err:
            findings.report(finding, "strict", rank_zero, io.StringIO())
        assert err.value.exit_code == 2


# --- strategies sprite does not launch ---------------------------------------------------------------------------

@pytest.mark.parametrize("given, words", [
    ("ddp_spawn", ["DDPStrategy (strategy='ddp_spawn')", "'spawn'", "second world inside each rank"]),
    ("ddp_fork", ["start method 'fork'", "second world"]),
    ("deepspeed_stage_2", ["DeepSpeedStrategy (strategy='deepspeed_stage_2')", "DDP and FSDP2 only"]),
    ("fsdp", ["FSDPStrategy (strategy='fsdp')", "DDP and FSDP2 only"]),
])
def test_strategies_sprite_does_not_launch_are_refused(rank0, given, words):
    with pytest.raises(UsageError) as err:
        trainer_wrap.launched_trainer_kwargs(cfg(), {"strategy": given})
    assert err.value.exit_code == 2 and all(w in str(err.value) for w in words), str(err.value)


def test_instances_are_refused_before_a_launch_conflict_names_them(rank0):
    with pytest.raises(UsageError, match="builds Lightning's FSDPStrategy in a sprite launch of 2 ranks"):
        trainer_wrap.launched_trainer_kwargs(cfg(strategy="ddp"), {"strategy": FSDPStrategy()})
    with pytest.raises(UsageError, match="start method 'spawn'"):
        trainer_wrap.launched_trainer_kwargs(cfg(strategy="ddp"), {"strategy": DDPStrategy(start_method="spawn")})


def test_what_passes(rank0):
    assert isinstance(trainer_wrap.launched_trainer_kwargs(cfg(strategy="fsdp"), {"strategy": "fsdp"})["strategy"],
                      FSDP2Strategy)  # "fsdp" under --strategy fsdp is sprite's FSDP2
    kept = FSDPStrategy()
    assert trainer_wrap.launched_trainer_kwargs(cfg(checks="off"), {"strategy": kept})["strategy"] is kept
    with pytest.raises(UsageError, match="second world"):  # spawning contradicts the launched world: always
        trainer_wrap.launched_trainer_kwargs(cfg(checks="off"), {"strategy": "ddp_spawn"})
    one = trainer_wrap.launched_trainer_kwargs(cfg(devices="1", world_size="1"), {"strategy": "ddp_spawn"})
    assert one["strategy"] == "ddp_spawn"


def test_the_checks_are_one_callback_added_to_the_scripts_own(rank0):
    mine = Callback()
    got = trainer_wrap.launched_trainer_kwargs(cfg(), {"callbacks": mine})["callbacks"]
    assert got[0] is mine and [type(c) for c in got[1:]] == [FitChecks]
    assert [type(c) for c in trainer_wrap.launched_trainer_kwargs(cfg(checks="strict"), {})["callbacks"]] == [FitChecks]
    assert "callbacks" not in trainer_wrap.launched_trainer_kwargs(cfg(checks="off"), {})


# --- a fit of one process ----------------------------------------------------------------------------------------

class Tiny(L.LightningModule):
    def __init__(self):
        super().__init__()
        self.net = torch.nn.Linear(2, 1)

    def training_step(self, batch, batch_idx):
        return self.net(batch[0]).pow(2).mean()

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)


def test_one_process_fit_prints_the_block_and_warns_on_nccl_timeout(capsys, monkeypatch):
    monkeypatch.setenv("NCCL_TIMEOUT", "600")
    trainer = Trainer(accelerator="cpu", devices=1, max_epochs=1, logger=False, enable_checkpointing=False,
                      enable_progress_bar=False, enable_model_summary=False,
                      callbacks=[FitChecks(cfg(devices="1", world_size="1"))])
    trainer.fit(Tiny(), DataLoader(TensorDataset(torch.zeros(10, 2)), batch_size=4))
    err = capsys.readouterr().err.splitlines()
    sprite_lines = [line for line in err if line.startswith("sprite: ")]
    assert sprite_lines[:2] == ["sprite: world      1 node x 1 rank per node = 1 rank (launcher local)",
                                "sprite: device     cpu, backend none (one process)"]
    assert "sprite: batch      4 per rank x 1 rank x 1 accumulated = 4 samples per optimizer step" in sprite_lines
    assert "the last step sees 2 samples, not 4" in sprite_lines[4]
    assert [line for line in err if line.startswith("sprite: warning: NCCL_TIMEOUT='600'")]


# --- the launcher half carries the mode to the ranks -------------------------------------------------------------

def test_contract_variable_parsing():
    assert cfg().checks == "on" and cfg(checks="strict").checks == "strict" and cfg(checks="off").checks == "off"
    with pytest.raises(UsageError, match="SPRITE_CHECKS='loud' is not allowed"):
        cfg(checks="loud")


@pytest.mark.parametrize("text, mode", [("checks: off\n", "off"), ("checks: on\n", "on"),
                                        ("checks: strict\n", "strict"), ("", "on")])
def test_spec_key(tmp_path, clean_env, example_script, text, mode):
    path = tmp_path / "job.yaml"
    path.write_text(f"script: {example_script}\n{text}")
    layer = spec.from_document(yamldoc.load(str(path)))
    launched = plan.plan_run({"site": "local"}, clean_env, spec_file=str(path))
    assert launched.env["SPRITE_CHECKS"] == mode and layer.get("checks", "on") == mode
    argv = jobscript.run_argv("python", sites.load("local"), layer, spec.merge(layer))
    assert {"off": ["--no-checks"], "strict": ["--strict"], "on": []}[mode] == [a for a in argv if a in
                                                                                ("--no-checks", "--strict")]


def test_spec_key_rejects_other_values(tmp_path, example_script):
    path = tmp_path / "job.yaml"
    path.write_text(f"script: {example_script}\nchecks: loud\n")
    with pytest.raises(UsageError, match=r"job.yaml:2: key 'checks'.*Allowed: on, off, strict"):
        spec.from_document(yamldoc.load(str(path)))


@pytest.mark.parametrize("flags, mode", [([], "on"), (["--no-checks"], "off"), (["--strict"], "strict")])
def test_cli_flags(sprite_cmd, clean_env, example_script, flags, mode):
    proc = subprocess.run([*sprite_cmd, "run", "--dry-run", "--json", *flags, example_script], env=clean_env,
                          capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["env"]["SPRITE_CHECKS"] == mode


def test_cli_refuses_both_flags(sprite_cmd, clean_env, example_script):
    proc = subprocess.run([*sprite_cmd, "run", "--no-checks", "--strict", "--dry-run", example_script],
                          env=clean_env, capture_output=True, text=True)
    assert proc.returncode == 2 and "--no-checks and --strict contradict each other" in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1
