"""How the runtime fills a plain Trainer(...) from the SPRITE_* contract, and what it refuses."""

from __future__ import annotations

import subprocess
import sys

import lightning
import pytest
from lightning.fabric.plugins.environments import LightningEnvironment
from lightning.pytorch import Trainer
from lightning.pytorch.accelerators import CPUAccelerator
from lightning.pytorch.strategies import DDPStrategy

from sprite.errors import UsageError
from sprite.runtime import config, trainer_wrap
from sprite.runtime.environment import TorchrunEnvironment
from sprite.runtime.fsdp2 import FSDP2Strategy
from sprite.runtime.precision import XPUMixedPrecision

LAUNCH = {
    "SPRITE_ACCELERATOR": "cpu",
    "SPRITE_STRATEGY": "auto",
    "SPRITE_PRECISION": "auto",
    "SPRITE_NUM_NODES": "1",
    "SPRITE_DEVICES": "2",
    "SPRITE_WORLD_SIZE": "2",
    "SPRITE_LAUNCHER": "local",
}


def cfg(**changes):
    return config.from_env({**LAUNCH, **{f"SPRITE_{k.upper()}": v for k, v in changes.items()}})


@pytest.fixture
def rank1(monkeypatch):
    """This test process poses as rank 1 of a 2-rank local launch (monkeypatch restores the variables)."""
    for name, value in {**LAUNCH, "RANK": "1", "LOCAL_RANK": "1", "WORLD_SIZE": "2", "MASTER_PORT": "29999"}.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setattr(Trainer, "__init__", Trainer.__init__)  # restored after the test
    trainer_wrap.install(config.from_env(dict(__import__("os").environ)))


def test_no_contract_means_no_launch():
    assert config.from_env({"PATH": "/bin"}) is None


@pytest.mark.parametrize(
    "env, message",
    [
        ({**LAUNCH, "SPRITE_WORLD_SIZE": "3"}, "SPRITE_WORLD_SIZE=3 is not SPRITE_NUM_NODES=1 x SPRITE_DEVICES=2"),
        ({**LAUNCH, "SPRITE_DEVICES": "two"}, "SPRITE_DEVICES='two'"),
        ({**LAUNCH, "SPRITE_STRATEGY": "deepspeed"}, "SPRITE_STRATEGY='deepspeed'"),
        ({**LAUNCH, "SPRITE_LAUNCHER": "pbsdsh"}, "SPRITE_LAUNCHER='pbsdsh'"),
        ({**LAUNCH, "SPRITE_STRATEGY": "single"}, "SPRITE_STRATEGY=single in a launched world of 2"),
    ],
)
def test_malformed_contract(env, message):
    with pytest.raises(UsageError, match=message.replace("(", r"\(")):
        config.from_env(env)


def test_plain_trainer_gets_the_launched_world(rank1):
    assert lightning.Trainer is Trainer  # scripts importing either name get the wrapped __init__
    trainer = lightning.Trainer(max_steps=1, logger=False)
    assert isinstance(trainer.strategy, DDPStrategy) and type(trainer.strategy).__name__ == "XPUDDPStrategy"
    assert trainer.num_devices == 2 and trainer.num_nodes == 1
    assert isinstance(trainer.strategy.cluster_environment, TorchrunEnvironment)
    assert trainer.global_rank == 1 and trainer.world_size == 2


def test_agreeing_explicit_arguments_pass_through(rank1):
    trainer = Trainer(max_steps=1, logger=False, devices=2, num_nodes=1, accelerator="cpu", strategy="ddp")
    assert trainer.num_devices == 2 and type(trainer.strategy).__name__ == "XPUDDPStrategy"


@pytest.mark.parametrize(
    "kwargs, names",
    [
        ({"devices": 4}, ["Trainer(devices=4)", "2 rank(s) per node"]),
        ({"num_nodes": 3}, ["Trainer(num_nodes=3)", "1 node(s)"]),
        ({"devices": [0, 1, 2]}, ["Trainer(devices=[0, 1, 2])", "2 rank(s) per node"]),
        ({"accelerator": "cuda"}, ["Trainer(accelerator='cuda')", "accelerator 'cpu'"]),
    ],
)
def test_contradicting_arguments_raise_naming_both_values(rank1, kwargs, names):
    with pytest.raises(UsageError) as err:
        Trainer(max_steps=1, logger=False, **kwargs)
    for name in names:
        assert name in str(err.value)


def test_strategy_choice(rank1):
    assert trainer_wrap.launched_trainer_kwargs(cfg(), {})["strategy"].__class__.__name__ == "XPUDDPStrategy"
    assert isinstance(trainer_wrap.launched_trainer_kwargs(cfg(strategy="fsdp"), {})["strategy"], FSDP2Strategy)
    kept = FSDP2Strategy()
    assert trainer_wrap.launched_trainer_kwargs(cfg(), {"strategy": kept})["strategy"] is kept  # auto keeps the script's
    with pytest.raises(UsageError, match="Trainer\\(strategy='ddp'\\).*strategy 'fsdp'"):
        trainer_wrap.launched_trainer_kwargs(cfg(strategy="fsdp"), {"strategy": "ddp"})


def test_precision_becomes_an_autocast_plugin_for_the_launched_device(rank1):
    kwargs = trainer_wrap.launched_trainer_kwargs(cfg(), {"precision": "bf16", "accelerator": CPUAccelerator()})
    (plugin,) = [p for p in kwargs["plugins"] if isinstance(p, XPUMixedPrecision)]
    assert plugin.device == "cpu" and plugin.precision == "bf16-mixed" and "precision" not in kwargs
    kwargs = trainer_wrap.launched_trainer_kwargs(cfg(precision="32-true"), {"precision": 32})
    assert kwargs["precision"] == "32-true"
    with pytest.raises(UsageError, match="precision='16-mixed'"):
        trainer_wrap.launched_trainer_kwargs(cfg(precision="bf16-mixed"), {"precision": "16-mixed"})


def test_a_precision_plugin_of_the_scripts_own_is_held_to_the_launchs_precision(rank1):
    """docs/runtime.md: another precision than the launch's stops with one line naming both, a plugin's too."""
    from lightning.pytorch.plugins import MixedPrecision, Precision

    for plugin, launched in ((Precision(), "bf16-mixed"), (MixedPrecision("16-mixed", "cpu"), "bf16-mixed"),
                             (MixedPrecision("bf16-mixed", "cpu"), "32-true")):
        with pytest.raises(UsageError) as caught:
            trainer_wrap.launched_trainer_kwargs(cfg(precision=launched), {"plugins": [plugin]})
        assert repr(plugin.precision) in str(caught.value) and repr(launched) in str(caught.value)
    agreeing = MixedPrecision("bf16-mixed", "cpu")
    kwargs = trainer_wrap.launched_trainer_kwargs(cfg(precision="bf16-mixed"), {"plugins": [agreeing]})
    assert [p for p in kwargs["plugins"] if isinstance(p, Precision)] == [agreeing]  # kept, none added
    kwargs = trainer_wrap.launched_trainer_kwargs(cfg(precision="auto"), {"plugins": [Precision()]})
    assert [type(p) for p in kwargs["plugins"] if isinstance(p, Precision)] == [Precision]


def test_auto_accelerator_keeps_the_scripts_choice(rank1):
    kwargs = trainer_wrap.launched_trainer_kwargs(cfg(accelerator="auto"), {"accelerator": "cpu", "precision": "bf16-mixed"})
    assert kwargs["accelerator"] == "cpu" and kwargs["plugins"][0].device == "cpu"
    assert trainer_wrap.launched_trainer_kwargs(cfg(accelerator="auto"), {})["accelerator"] in ("cpu", "cuda")


def test_world_of_one_gets_lightnings_own_environment_so_lightning_never_detects_mpi():
    kwargs = trainer_wrap.launched_trainer_kwargs(cfg(devices="1", world_size="1"), {})
    assert [type(p) for p in kwargs["plugins"]] == [LightningEnvironment]
    assert kwargs["devices"] == 1 and kwargs["strategy"] == "auto"


def test_pytorch_lightning_trainer_is_refused_in_a_launched_world(tmp_path):
    script = tmp_path / "pl_script.py"
    script.write_text("import pytorch_lightning as pl\npl.Trainer(max_steps=1)\nprint('BUILT')\n")
    env = {"PATH": "/usr/bin:/bin", **LAUNCH, "RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "2"}
    proc = subprocess.run([sys.executable, "-m", "sprite.runtime", str(script)], env=env, capture_output=True, text=True)
    assert proc.returncode == 2 and "BUILT" not in proc.stdout
    assert "pytorch_lightning.Trainer" in proc.stderr and "import lightning.pytorch" in proc.stderr
    # docs/runtime.md: with one rank such a script runs as plain Lightning
    one = {**env, "SPRITE_DEVICES": "1", "SPRITE_WORLD_SIZE": "1", "WORLD_SIZE": "1"}
    proc = subprocess.run([sys.executable, "-m", "sprite.runtime", str(script)], env=one, capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 0 and "BUILT" in proc.stdout, proc.stderr[-2000:]


def test_runtime_without_contract_runs_the_script_with_its_argv(tmp_path):
    script = tmp_path / "plain.py"
    script.write_text(
        "import sys\nfrom lightning.pytorch.accelerators import AcceleratorRegistry\n"
        "print(sys.argv, sys.path[0], 'xpu' in AcceleratorRegistry, __name__)\n"
    )
    proc = subprocess.run(
        [sys.executable, "-m", "sprite.runtime", str(script), "--flag", "x"],
        env={"PATH": "/usr/bin:/bin"}, capture_output=True, text=True, cwd="/",
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == f"[{str(script)!r}, '--flag', 'x'] {tmp_path} True __main__"


@pytest.mark.parametrize("source, name", [("sprite", "FSDP2Strategy"), ("sprite", "trainer_kwargs"),
                                          ("sprite.runtime.fsdp2", "FSDP2Strategy")])
def test_a_script_whose_first_lightning_import_is_sprites_api_runs_in_a_fresh_rank(tmp_path, source, name):
    """The runtime wraps Lightning when it is first imported, and that imports sprite's strategy modules; when the
    first import came from one of them, it found that one half-made (a circular import; seen on the H200, whose
    CUDA ranks start fresh; CPU ranks forked from a warm process had Lightning already). Wrapping Lightning in
    the runtime waits until that module is whole (hooks.after_import's wait_for)."""
    script = tmp_path / "first.py"
    script.write_text(f"from {source} import {name}\nfrom lightning.pytorch.strategies import StrategyRegistry\n"
                      f"print('fsdp2' in StrategyRegistry, callable({name}))\n")
    import os

    # PYTHONPATH kept: where sprite is installed with pip --target (the H200 runs) it is how sprite is found
    env = {"PATH": "/usr/bin:/bin", **{k: v for k, v in os.environ.items() if k == "PYTHONPATH"}}
    proc = subprocess.run([sys.executable, "-m", "sprite.runtime", str(script)], env=env,
                          capture_output=True, text=True, cwd="/")
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.strip() == "True True"
