"""How many accelerator devices torch will see here, counted without importing torch (login nodes, planning).

NVIDIA: the GPUs ``nvidia-smi -L`` lists, narrowed by ``CUDA_VISIBLE_DEVICES`` as the CUDA runtime reads it.
Intel: the Level Zero devices the Intel GPUs of ``/sys/class/drm`` expose. A Data Center GPU Max card has two
tiles; with ``ZE_FLAT_DEVICE_HIERARCHY=FLAT`` (Level Zero's default, and what ALCF's frameworks module sets)
every tile is a device, so an Aurora node shows 12 (6 GPUs x 2 tiles); with ``COMPOSITE`` every card is one.
``ZE_AFFINITY_MASK`` narrows that list: tile indices in FLAT mode, ``card`` or ``card.tile`` in COMPOSITE mode.
(ALCF Aurora PyTorch guide, argonne-lcf/user-guides docs/aurora/data-science/frameworks/pytorch.md and
python.md at 7d04a3f, read 2026-11-29; Level Zero spec, "Affinity Mask".)
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path
from typing import Callable, Mapping

INTEL_VENDOR = "0x8086"
_CARD = re.compile(r"card\d+")


def nvidia_gpus(environ: Mapping[str, str], which: Callable = shutil.which, run: Callable = subprocess.run) -> int:
    """GPUs CUDA will show: ``nvidia-smi -L`` narrowed by CUDA_VISIBLE_DEVICES (0 without nvidia-smi)."""
    program = which("nvidia-smi", path=environ.get("PATH"))
    if not program:
        return 0
    try:
        out = run([program, "-L"], capture_output=True, text=True, timeout=10).stdout
    except (OSError, subprocess.TimeoutExpired):
        return 0
    found = sum(1 for line in out.splitlines() if line.startswith("GPU "))
    mask = environ.get("CUDA_VISIBLE_DEVICES")
    if mask is None:
        return found
    seen: list[str] = []
    for entry in (part.strip() for part in mask.split(",")):
        # The CUDA runtime reads the list up to its first invalid entry (an index out of range, or -1).
        valid = entry.startswith(("GPU-", "MIG-")) or (entry.isdigit() and int(entry) < found)
        if not valid:
            break
        if entry not in seen:
            seen.append(entry)
    return len(seen)


def intel_cards(sysfs: str | Path = "/sys") -> list[int]:
    """Tiles of each Intel GPU card in ``sysfs`` (i915: ``cardN/gt/gtM``; xe: ``cardN/device/tileM``)."""
    cards = []
    drm = Path(sysfs) / "class" / "drm"
    for card in sorted(drm.glob("card*"), key=lambda p: int(p.name[4:]) if _CARD.fullmatch(p.name) else -1):
        if not _CARD.fullmatch(card.name):
            continue  # connectors such as card0-DP-1
        try:
            vendor = (card / "device" / "vendor").read_text().strip()
        except OSError:
            continue
        if vendor == INTEL_VENDOR:
            tiles = len(list(card.glob("gt/gt[0-9]*"))) or len(list((card / "device").glob("tile[0-9]*")))
            cards.append(max(tiles, 1))
    return cards


def intel_devices(environ: Mapping[str, str], cards: list[int]) -> int:
    """Level Zero devices for ``cards`` (tiles per card) under ZE_FLAT_DEVICE_HIERARCHY and ZE_AFFINITY_MASK."""
    composite = environ.get("ZE_FLAT_DEVICE_HIERARCHY", "FLAT").strip().upper() == "COMPOSITE"
    # COMBINED exposes cards to the Level Zero API but tiles to SYCL, which torch.xpu uses: counted as FLAT.
    mask = environ.get("ZE_AFFINITY_MASK", "").strip()
    if not mask:
        return len(cards) if composite else sum(cards)
    chosen = set()
    for entry in (part.strip() for part in mask.split(",")):
        card, _, tile = entry.partition(".")
        if composite and card.isdigit() and int(card) < len(cards) and (
                not tile or (tile.isdigit() and int(tile) < cards[int(card)])):
            chosen.add(int(card))
        elif not composite and entry.isdigit() and int(entry) < sum(cards):
            chosen.add(int(entry))
    return len(chosen)


def visible(environ: Mapping[str, str] = os.environ, sysfs: str | Path = "/sys", **probes) -> tuple[str, int]:
    """(device type, count) torch would pick with ``accelerator="auto"``: cuda, then xpu, else ("cpu", 0)."""
    gpus = nvidia_gpus(environ, **probes)
    if gpus:
        return "cuda", gpus
    tiles = intel_devices(environ, intel_cards(sysfs))
    if tiles:
        return "xpu", tiles
    return "cpu", 0


def of(accelerator: str, environ: Mapping[str, str] = os.environ, sysfs: str | Path = "/sys",
       **probes) -> tuple[str, int]:
    """(device type, count) the ranks of ``accelerator`` (auto, cpu, cuda or xpu) would use here; cpu counts 0."""
    if accelerator == "auto":
        return visible(environ, sysfs, **probes)
    if accelerator == "cuda":
        return "cuda", nvidia_gpus(environ, **probes)
    if accelerator == "xpu":
        return "xpu", intel_devices(environ, intel_cards(sysfs))
    return "cpu", 0


def torch_build() -> str:
    """The device type the installed torch was built for, without importing it: "cuda" (CUDA or ROCm), "xpu",
    "cpu", or "" when that cannot be told (no torch). Needed where the planner guesses for
    ``accelerator="auto"``: a laptop with an NVIDIA or Intel GPU and a CPU build of torch runs CPU ranks.
    Read first from ``torch/version.py`` (the file behind the public ``torch.version.cuda``, ``.hip`` and
    ``.xpu``), else from the local label of the installed version (+cu130, +rocm6.2, +xpu, +cpu). The H200
    image's torch (2.11.0) carries no label in its metadata, only in ``torch.__version__``."""
    built = _build_from_version_file()
    if built:
        return built
    from importlib import metadata

    try:
        label = metadata.version("torch").partition("+")[2].lower()
    except metadata.PackageNotFoundError:
        return ""
    if label.startswith(("cu", "rocm")):
        return "cuda"
    return label if label in ("xpu", "cpu") else ""


def _build_from_version_file(version_file: str | Path | None = None) -> str:
    """The build ``torch/version.py`` names (its literal ``cuda``, ``hip`` and ``xpu`` assignments), "" if the file
    is missing or unreadable. Located with ``importlib.util.find_spec``, which finds a top-level package without
    importing it."""
    import ast

    if version_file is None:
        from importlib.util import find_spec

        try:
            spec = find_spec("torch")
        except (ImportError, ValueError):
            return ""
        if spec is None or not spec.origin:
            return ""
        version_file = Path(spec.origin).parent / "version.py"
    try:
        tree = ast.parse(Path(version_file).read_text(encoding="utf-8"))
    except (OSError, SyntaxError, ValueError, UnicodeDecodeError):
        return ""
    found: dict[str, object] = {}
    for node in tree.body:
        if isinstance(node, ast.Assign) and len(node.targets) == 1:
            target = node.targets[0]
        elif isinstance(node, ast.AnnAssign):
            target = node.target
        else:
            continue
        if isinstance(target, ast.Name) and isinstance(node.value, ast.Constant):
            found[target.id] = node.value.value
    if "cuda" not in found and "hip" not in found:
        return ""  # not the file torch writes at build time
    if found.get("cuda") or found.get("hip"):
        return "cuda"
    if found.get("xpu"):
        return "xpu"
    return "cpu"


def default_ranks(accelerator: str, environ: Mapping[str, str] = os.environ, sysfs: str | Path = "/sys",
                  **probes) -> int:
    """Ranks per node as ``Trainer(devices="auto")`` would pick for ``accelerator``: one per visible device of
    that type (auto: cuda, then xpu), else 1 (a CPU-only machine, or accelerator cpu)."""
    if accelerator == "cpu":
        return 1
    kind, count = visible(environ, sysfs, **probes)
    if accelerator in ("auto", kind):
        return max(count, 1)
    if accelerator == "xpu":
        return max(intel_devices(environ, intel_cards(sysfs)), 1)
    return 1
