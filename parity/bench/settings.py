"""What one `sprite bench` run measures: the step (model, batch, precision, strategy), the world sizes of the
sweep, the arms and the schedule of timed windows every arm follows.

Light on purpose (no torch): the CLI, the arm workers and the report all read it.
"""

from __future__ import annotations

import dataclasses

from sprite.parity.settings import JsonSettings

PRECISIONS = ("32-true", "bf16-mixed", "bf16-true")
STRATEGIES = ("ddp", "fsdp")
BASELINES = ("raw", "lightning")
ATTENTIONS = ("sdpa", "eager")
# A step whose time grows by less than this factor when the batch doubles is launch-bound: its kernels are too
# small to fill the device (a compute-bound step doubles; the H200 facts showed ~1.0 for 8 -> 32).
LAUNCH_BOUND_RATIO = 1.3
SETTINGS_FILE = "bench_settings.json"


TIMED = ("sync", "nosync", "probe")


@dataclasses.dataclass(frozen=True)
class Window:
    """``steps`` consecutive steps between two device synchronisations.

    mode: "warmup" and "probe_warmup" (untimed: compilation, allocator and kernel selection settle, also after
    the batch changes), "sync" (the step as trained), "nosync" (the same step without gradient synchronisation,
    for the communication time) or "probe" (the step at twice the batch, for the launch-bound check).
    """

    mode: str
    batch: int
    steps: int

    @property
    def timed(self) -> bool:
        return self.mode in TIMED


@dataclasses.dataclass(frozen=True)
class BenchSettings(JsonSettings):
    """One benchmark run. ``batch`` is per rank; ``devices`` 0 puts every sweep point on one node."""

    model: str = "tiny"
    lora: bool = True
    strategy: str = "ddp"
    batch: int = 8
    seq: int = 128
    precision: str = "32-true"
    steps: int = 40
    warmup: int = 5
    window: int = 10
    sweep: tuple[int, ...] = (1,)
    devices: int = 0
    baselines: tuple[str, ...] = ()
    repeats: int = 1
    compile: bool = False
    measure_peak: bool = False
    accelerator: str = "auto"
    attention: str = "sdpa"
    seed: int = 0

    def __post_init__(self):
        object.__setattr__(self, "sweep", tuple(int(w) for w in self.sweep))
        object.__setattr__(self, "baselines", tuple(self.baselines))

    @property
    def arms(self) -> tuple[str, ...]:
        return ("sprite", *self.baselines)

    def probes(self, world: int, arm: str) -> bool:
        """Whether the arm ``arm`` at ``world`` runs the launch-bound probe: sprite's own arm at the sweep's
        smallest world only. Every rank of a DDP or FSDP step runs the batch of one rank, so the check answers the
        same at every world, and the summary reports the smallest world's; at the others it only cost time (on
        2 CPU cores, about a sixth of the world-2 launch of a `tiny` sweep)."""
        return arm == "sprite" and world == min(self.sweep)

    def placement(self, world: int) -> tuple[int, int]:
        """(nodes, ranks per node) of a sweep point: one node unless ``devices`` caps the ranks per node."""
        if not self.devices or world <= self.devices:
            return 1, world
        return world // self.devices, self.devices

    def phases(self, world: int, probe: bool) -> list[Window]:
        """Every window an arm runs, in order: warm-up; synced windows, each followed by a no-sync window when
        there is communication to measure (world > 1); then, if ``probe``, a second warm-up at twice the batch (a
        compiled step recompiles for the new shape) and one probe window."""
        out = [Window("warmup", self.batch, self.warmup)]
        for _ in range(self.steps // self.window):
            out.append(Window("sync", self.batch, self.window))
            if world > 1:
                out.append(Window("nosync", self.batch, self.window))
        if probe:
            out += [Window("probe_warmup", 2 * self.batch, self.warmup), Window("probe", 2 * self.batch, self.window)]
        return out

    def windows(self, world: int, probe: bool) -> list[Window]:
        """The timed windows, in order."""
        return [window for window in self.phases(world, probe) if window.timed]

    def step_plan(self, world: int, probe: bool) -> list[tuple[str, int]]:
        """(mode, batch) of every step the arm runs, window after window."""
        return [(window.mode, window.batch) for window in self.phases(world, probe) for _ in range(window.steps)]

    def tokens_per_step(self, world: int) -> int:
        """Tokens the whole world trains in one step (``batch`` rows of ``seq`` tokens on every rank)."""
        return self.batch * self.seq * world
