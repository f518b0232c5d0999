"""The runtime's heartbeat: what a fit reports, when it reaches the disk, and that a failing disk never stops it."""

from __future__ import annotations

import time

import lightning as L
import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from sprite.contract import heartbeat
from sprite.runtime import beats as progress
from sprite.runtime import trainer_wrap


class Tiny(L.LightningModule):
    def __init__(self):
        super().__init__()
        self.net = nn.Linear(4, 1)

    def training_step(self, batch, batch_idx):
        return nn.functional.mse_loss(self.net(batch[0]), batch[1])

    def validation_step(self, batch, batch_idx):
        self.log("val", nn.functional.mse_loss(self.net(batch[0]), batch[1]))

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)


def data():
    x = torch.randn(16, 4, generator=torch.Generator().manual_seed(0))
    return DataLoader(TensorDataset(x, x.sum(1, keepdim=True)), batch_size=4)


@pytest.fixture
def written(monkeypatch, tmp_path):
    """Every Beat the heart writes, in order (the real write still happens)."""
    beats = []
    real = heartbeat.write
    monkeypatch.setattr(heartbeat, "write", lambda where, beat: (beats.append(beat), real(where, beat)))
    monkeypatch.setattr(progress, "_current", None)
    return beats


def test_a_fit_reports_each_phase_and_the_save_inside_it(written, tmp_path):
    heart = progress.start({"SPRITE_RUN_DIR": str(tmp_path), "SPRITE_ATTEMPT": "1",
                            "SPRITE_HEARTBEAT_SECONDS": "60"}, rank=0)
    trainer_wrap.mark_saves()  # as the runtime does once the script has imported Lightning
    (tmp_path / "heartbeat" / "attempt-1").mkdir(parents=True, exist_ok=True)
    heart.where = tmp_path / "heartbeat" / "attempt-1"
    trainer = L.Trainer(max_steps=6, val_check_interval=3, logger=False, enable_progress_bar=False,
                        enable_model_summary=False, default_root_dir=str(tmp_path), callbacks=trainer_wrap.progress_callbacks(),
                        num_sanity_val_steps=0)
    trainer.fit(Tiny(), data(), data())
    progress.finish(trainer.global_step)
    phases = [b.phase for b in written]
    compressed = [p for i, p in enumerate(phases) if i == 0 or p != phases[i - 1]]
    assert compressed[:3] == ["start", "training step", "validation"]
    assert compressed[-1] == "done" and "checkpoint save" in compressed  # ModelCheckpoint's own save
    saves = [b for b in written if b.phase == heartbeat.SAVE]
    assert saves and all(b.step in (3, 6) for b in saves)
    last = heartbeat.read_all(heart.where)[0]
    assert (last.phase, last.step, last.first_step) == ("done", 6, 0)


def test_steps_within_a_phase_reach_the_disk_within_the_interval(written, tmp_path):
    heart = progress.Heart(tmp_path, rank=3, interval=0.2)
    heart.update(heartbeat.TRAINING, 0)
    assert written[-1].phase == heartbeat.TRAINING  # a phase change is written at once
    count = len(written)
    for step in range(1, 50):
        heart.update(step=step)
    assert len(written) <= count + 1  # 49 steps cost no file writes of their own
    time.sleep(0.6)
    assert heartbeat.read_all(tmp_path)[3].step == 49


def test_an_unwritable_folder_warns_once_and_never_raises(written, tmp_path, capsys):
    heart = progress.Heart(tmp_path / "missing", rank=0, interval=0.05)
    for step in range(5):
        heart.update(heartbeat.VALIDATION if step % 2 else heartbeat.TRAINING, step)
    time.sleep(0.2)
    err = capsys.readouterr().err
    assert err.count("sprite: warning: cannot write the heartbeat") == 1
    assert "file system every node sees" in err


@pytest.mark.parametrize("phase", heartbeat.ENDED)
def test_leaving_keeps_the_time_of_the_last_progress(written, tmp_path, phase):
    """goodput's productive time ends at a rank's last progress: a fit's teardown before ``done`` (or the exit
    after a preemption save) must not move the beat's time."""
    heart = progress.Heart(tmp_path, rank=0, interval=60)
    heart.update(heartbeat.TRAINING, 0)
    heart.update(step=5)
    stepped = heart.beat.time
    time.sleep(0.05)
    heart.update(phase, 5)
    last = heartbeat.read_all(tmp_path)[0]
    assert (last.phase, last.step, last.time) == (phase, 5, stepped)
    heart.update(heartbeat.TRAINING, 6)  # a later step (a second fit in the same script) is progress again
    assert heart.beat.time > stepped


def test_a_step_written_late_by_the_background_thread_never_lands_over_a_phase_change(tmp_path, monkeypatch):
    """The background thread took step 2 and is slow to write it (a FAKE slow file system for that thread alone)
    while the rank says it failed: the file must end as "failed", not be overwritten by the older step, or sprite
    run would never see the failure (and an overwritten "done" turns a finished fit into a failed attempt)."""
    import threading

    real = heartbeat.write
    slow = threading.Event()

    def write(where, beat):
        if threading.current_thread() is not threading.main_thread():
            slow.set()
            time.sleep(0.5)
        real(where, beat)

    monkeypatch.setattr(heartbeat, "write", write)
    monkeypatch.setattr(progress, "_current", None)
    heart = progress.Heart(tmp_path, rank=0, interval=0.05)
    heart.update(heartbeat.TRAINING, 1)
    heart.update(step=2)  # no phase change: the background thread writes it
    assert slow.wait(5)
    heart.update(heartbeat.FAILED)
    time.sleep(1.0)
    last = heartbeat.read_all(tmp_path)[0]
    assert (last.phase, last.step) == (heartbeat.FAILED, 2)


@pytest.mark.parametrize("given", ["inf", "nan", "abc", "0", "-1", "1e300"])
def test_a_heartbeat_interval_that_is_no_positive_number_is_refused_where_the_rank_starts(tmp_path, given):
    """inf (and a huge number) overflowed time.sleep in the heartbeat and stack threads with a traceback each; nan
    and 0 silently wrote every 0.05 s, a word every 5 s. The rank now refuses with one line, exit 2."""
    import os
    import subprocess
    import sys

    from sprite.errors import UsageError

    env = {"SPRITE_RUN_DIR": str(tmp_path), "SPRITE_ATTEMPT": "1", "SPRITE_HEARTBEAT_SECONDS": given}
    with pytest.raises(UsageError) as refused:
        progress.start(env, 0)
    assert refused.value.exit_code == 2 and "SPRITE_HEARTBEAT_SECONDS" in str(refused.value)
    if given != "inf":
        return
    script = tmp_path / "plain.py"
    script.write_text("print('ran')\n")
    clean = {k: v for k, v in os.environ.items() if not k.startswith("SPRITE_") and k not in
             ("MASTER_ADDR", "MASTER_PORT", "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "NODE_RANK")}
    done = subprocess.run([sys.executable, "-m", "sprite.runtime", str(script)], capture_output=True, text=True,
                          env={**clean, **env, "SPRITE_ACCELERATOR": "cpu"}, timeout=120)
    assert done.returncode == 2 and "ran" not in done.stdout, done.stderr[-2000:]
    assert done.stderr.strip().splitlines() == [
        "sprite: error: SPRITE_HEARTBEAT_SECONDS='inf' is not a number of seconds above 0 and at most 3600. sprite "
        "run never exports it so (it sets 0.5 to 30): it was set by hand or changed after the launch. Unset "
        "SPRITE_HEARTBEAT_SECONDS or relaunch with sprite run."]


def test_a_heartbeat_interval_within_bounds_is_kept_and_unset_is_five_seconds():
    assert progress.heartbeat_interval({}) == 5.0
    assert progress.heartbeat_interval({"SPRITE_HEARTBEAT_SECONDS": " "}) == 5.0
    assert progress.heartbeat_interval({"SPRITE_HEARTBEAT_SECONDS": "0.6"}) == 0.6
    assert progress.heartbeat_interval({"SPRITE_HEARTBEAT_SECONDS": "0.001"}) == 0.05  # the floor stays
