"""Start-up at scale: what one rank's start-up asks of the shared file system, staged (``--stage``) and not,
the local time to first step of a 2-rank fit, and a projection to 1,024 and 10,624 nodes.

1. File-system operations: one rank (``python -m sprite.runtime FIT``, stopped at its first training step) runs
   under ``strace -f -y``; every stat, open, read, mmap, getdents, readlink or access whose path (or file
   descriptor's path) lies under the environment's prefixes is counted. Unstaged, the prefixes are where the
   environment lives; staged, the same prefixes while the rank runs from the node-local copy.
2. Time to first step: ``sprite run --devices 2 [--stage auto] FIT`` from launch to the first training step of
   the slowest rank, with the stage record (pack, broadcast) from the run's audit trail.
3. ``python -X importtime``: what the runtime imports before the script's first line, and what Lightning pulls in.
4. Projection (every rate stated, with where it comes from): metadata operations of all ranks over an effective
   metadata rate calibrated on ALCF's published ``import torch`` times without Copper, against ezpz's
   ``yeet`` and Copper's published figures.

The environment measured is a small venv made here (hard links to this venv's packages; torch, Lightning and
sprite's runtime in full, the Hugging Face stack and plotting left out) unless ``--full``.

    python benchmarks/startup_scale.py [--quick] [--full] [--json OUT]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import sysconfig
import tempfile
import time
from pathlib import Path

# What a CPU Lightning fit never imports when it is absent: left out of the small venv made for tests.
LEAVE_OUT = ("transformers", "tokenizers", "huggingface_hub", "hf_xet", "matplotlib", "mpl_toolkits", "fonttools",
             "pil", "pillow", "peft", "pip", "ipython", "hypothesis", "aiohttp", "_pytest", "pytest", "safetensors",
             "accelerate", "regex", "kiwisolver", "contourpy", "cycler", "pyparsing", "dateutil", "python_dateutil",
             "mpi4py", "mpich")  # mpich's libmpi lives in the venv's lib/, outside site-packages
TORCH_LEAVE_OUT = ("include", "test", "share", "lib/libtorchbind_test.so", "lib/libaoti_custom_ops.so")

FIT = '''
import json, os, sys, time
import lightning as L, torch
from torch.utils.data import DataLoader, TensorDataset

class M(L.LightningModule):
    def __init__(self):
        super().__init__()
        self.net = torch.nn.Linear(8, 1)
    def training_step(self, batch, batch_idx):
        if batch_idx == 0:
            out = os.environ.get("STARTUP_OUT")
            if out:
                rank = os.environ.get("RANK", "0")
                with open(os.path.join(out, f"first{rank}.json"), "w") as f:
                    json.dump({"first_step": time.time(), "torch": torch.__file__, "lightning": L.__file__,
                               "prefix": sys.prefix}, f)
            if os.environ.get("STOP_AT_FIRST_STEP"):
                os._exit(0)
        return self.net(batch[0]).pow(2).mean()
    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.01)

data = DataLoader(TensorDataset(torch.randn(64, 8)), batch_size=8)
L.Trainer(max_steps=int(os.environ.get("STEPS", "3")), logger=False, enable_checkpointing=False,
          enable_progress_bar=False, enable_model_summary=False).fit(M(), data)
'''

# ALCF user guide, "Data movement", Copper section (argonne-lcf/user-guides, aurora data-management): import torch
# from Lustre on Aurora, 12 ranks a node, without and with Copper (seconds).
COPPER_TABLE = {64: (105, 50), 128: (110, 52), 256: (110, 54), 512: (115, 56), 1024: (240, 58), 2048: (420, 58),
                4096: (480, 59), 8192: (1020, 60)}
# Issue 29's published figures: ezpz yeet (copy the environment to node-local storage) + first step.
EZPZ = {1024: (255, 61), 4096: (751, 194)}
# Copper's evaluation figures for import torch, quoted in issue 29.
COPPER_EVAL = {128: 63, 256: 105, 512: 283}
RANKS_PER_NODE = 12  # Aurora: 12 XPU tiles a node (conf/aurora.yaml)
NIC_BYTES_PER_S = 25e9  # Slingshot 11: 200 Gb/s a NIC (HPE), the slowest link of a node-to-node broadcast
SBCAST_FANOUT = 8  # sbcast(1) of Slurm 22.05: "--fanout ... Maximum value is currently eight"
FS_READ_BYTES_PER_S = 650e9  # ASSUMPTION: Flare's aggregate read bandwidth as ALCF advertises it; not measured here


def _norm(name: str) -> str:
    return name.lower().replace("-", "_").split(".dist_info")[0].split("_", 1)[0] if name.endswith(".dist-info") \
        else name.lower().replace("-", "_")


def make_small_venv(dest: str, install_sprite: bool = False) -> str:
    """A venv at ``dest`` (made by this Python's base interpreter) whose site-packages holds hard links to this
    venv's packages minus LEAVE_OUT and torch's headers and tests; returns its python. ``install_sprite``: sprite
    installed into it from this checkout (as on a cluster) instead of linked as this venv's editable install."""
    base = getattr(sys, "_base_executable", sys.executable)
    subprocess.run([base, "-m", "venv", "--without-pip", dest], check=True)
    src = sysconfig.get_path("purelib")
    dst = os.path.join(dest, os.path.relpath(src, sys.prefix))
    skip = {os.path.join(src, "torch", p) for p in TORCH_LEAVE_OUT}
    for entry in sorted(os.listdir(src)):
        key = entry.lower().replace("-", "_")
        if any(key == n or key.startswith(n + "_") or key.startswith(n + ".") for n in LEAVE_OUT):
            continue
        if install_sprite and ("sprite_hpc" in key or "__editable__" in key):
            continue
        _link_tree(os.path.join(src, entry), os.path.join(dst, entry), skip)
    if install_sprite:
        subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-build-isolation",
                        "--no-index", "--target", dst, str(Path(__file__).resolve().parent.parent)], check=True,
                       capture_output=True)
    return os.path.join(dest, "bin", "python")


def _link_tree(src: str, dst: str, skip: set) -> None:
    if src in skip:
        return
    if os.path.islink(src):
        os.symlink(os.readlink(src), dst)
    elif not os.path.isdir(src):
        try:
            os.link(src, dst)
        except OSError:
            shutil.copy2(src, dst)
    else:
        os.mkdir(dst)
        for entry in os.listdir(src):
            _link_tree(os.path.join(src, entry), os.path.join(dst, entry), skip)


# ---- 1. file-system operations of one rank -------------------------------------------------------------------
META = ("stat", "lstat", "newfstatat", "statx", "fstatat64", "access", "faccessat", "faccessat2", "readlink",
        "readlinkat", "getdents64", "getdents", "open", "openat", "openat2", "execve", "statfs")
DATA = ("read", "pread64", "readv", "mmap")
LINE = re.compile(r"^(?:\[pid\s+\d+\]\s+|\d+\s+)?(\w+)\((.*)")


def count_ops(log: str, prefixes: list[str]) -> dict:
    """Counts of metadata and data operations in an ``strace -f -y`` log whose path argument or descriptor path
    lies under one of ``prefixes``."""
    meta = data = 0
    by_call: dict[str, int] = {}
    by_prefix: dict[str, int] = {}
    marks = tuple(p.rstrip("/") + "/" for p in prefixes)
    with open(log, errors="replace") as lines:
        for line in lines:
            m = LINE.match(line)
            if not m or "resumed>" in line:
                continue
            call, rest = m.group(1), m.group(2)
            paths = re.findall(r'"(/[^"]*)"', rest) + re.findall(r"<(/[^>]*)>", rest)
            if not any(p.startswith(marks) or p + "/" in marks for p in paths):
                continue
            if call in META:
                meta += 1
            elif call in DATA:
                data += 1
            else:
                continue
            by_call[call] = by_call.get(call, 0) + 1
            where = next(mark for mark in marks for p in paths if p.startswith(mark) or p + "/" == mark)
            by_prefix[where] = by_prefix.get(where, 0) + 1
    return {"metadata": meta, "data": data, "total": meta + data, "by_call": by_call, "by_prefix": by_prefix}


def traced_rank(python: str, fit: str, prefixes: list[str], work: str, tag: str, argv=None) -> dict:
    """One rank's start-up to its first training step under strace (or ``python ARGV``); its operations on
    ``prefixes``."""
    log = os.path.join(work, f"strace-{tag}.log")
    env = {**_clean_env(), "STOP_AT_FIRST_STEP": "1", "STARTUP_OUT": work, "PYTHONSAFEPATH": "1"}
    start = time.time()
    subprocess.run(["strace", "-f", "-y", "-qq", "-o", log, "-e",
                    "trace=" + ",".join(c for c in META + DATA if c not in ("fstatat64", "getdents", "open")),
                    python, *(argv or ["-m", "sprite.runtime", fit])], env=env, check=True, capture_output=True, text=True,
                   cwd=work)
    counts = count_ops(log, prefixes)
    counts["seconds_traced"] = round(time.time() - start, 2)
    os.unlink(log)
    return counts


def _clean_env() -> dict:
    return {k: v for k, v in os.environ.items() if not k.startswith(("SPRITE_", "SLURM_", "PBS_")) and k not in
            ("MASTER_ADDR", "MASTER_PORT", "RANK", "WORLD_SIZE", "LOCAL_RANK")}


# ---- 2. time to first step -----------------------------------------------------------------------------------
def first_step(python: str, fit: str, work: str, local: str, stage: bool, tag: str) -> dict:
    """``sprite run --devices 2 [--stage auto] FIT``: launch to the slowest rank's first step, and the stage
    record."""
    out = os.path.join(work, tag)
    os.mkdir(out)
    env = {**_clean_env(), "STARTUP_OUT": out, "STEPS": "3", "TMPDIR": os.path.join(local, "node-local"),
           "SPRITE_STAGE_CACHE": os.path.join(local, "cache")}
    os.makedirs(env["TMPDIR"], exist_ok=True)
    cmd = [python, "-m", "sprite", "run", "--devices", "2", "--accelerator", "cpu", "--run-dir",
           os.path.join(out, "run"), *(["--stage", "auto"] if stage else []), fit]
    start = time.time()
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, cwd=out, timeout=900)
    if done.returncode:
        raise SystemExit(f"{tag}: sprite run exited {done.returncode}: {done.stderr[-2000:]}")
    firsts = [json.loads(Path(out, f"first{r}.json").read_text()) for r in range(2)]
    record = {}
    for line in Path(out, "run", "audit.jsonl").read_text().splitlines():
        entry = json.loads(line)
        if entry.get("kind") == "stage":
            record = {k: entry[k] for k in ("bytes", "files", "cached", "pack_seconds", "broadcast_seconds")}
    return {"seconds_to_first_step": round(max(f["first_step"] for f in firsts) - start, 2),
            "torch": firsts[0]["torch"], "stage": record,
            "left_in_tmpdir": sorted(os.listdir(env["TMPDIR"]))}


# ---- 3. imports ----------------------------------------------------------------------------------------------
def import_times(python: str, work: str) -> dict:
    """``-X importtime`` of sprite's runtime before the script (``sprite.runtime.__main__`` imports up to
    runpy) and of ``import lightning``: total and the heaviest packages pulled in (cumulative microseconds)."""
    out = {}
    for tag, code in (("sprite_runtime_prelude", "import sprite.runtime.__main__"),
                      ("lightning", "import lightning"), ("torch", "import torch")):
        done = subprocess.run([python, "-X", "importtime", "-c", code], capture_output=True, text=True,
                              env={**_clean_env(), "PYTHONSAFEPATH": "1"}, cwd=work)
        rows = [r.split("|") for r in done.stderr.splitlines() if r.startswith("import time:") and "|" in r][1:]
        cumulative = {row[2].strip(): int(row[1]) for row in rows if not row[2].startswith("  ")}
        tops = {}
        for row in rows:
            name = row[2].strip()
            tops[name.split(".")[0]] = max(tops.get(name.split(".")[0], 0), int(row[1]))
        out[tag] = {"modules": len(rows), "seconds": round(max(cumulative.values(), default=0) / 1e6, 2),
                    "heaviest": dict(sorted(tops.items(), key=lambda kv: -kv[1])[:8])}
    return out


# ---- 4. projection -------------------------------------------------------------------------------------------
def projection(torch_ops: int, unstaged_ops: int, staged_ops: int, local_unstaged: float, local_staged: float,
               unpack_bytes_per_s: float, archive_bytes: int) -> dict:
    """Time to first step at 1,024 and 10,624 nodes, unstaged and staged, from an effective metadata rate.

    Effective rate: ALCF's ``import torch`` without Copper at 1,024 nodes (240 s, 12 ranks a node) against the
    operations one ``import torch`` makes here: rate = 1024 * 12 * torch_ops / 240 s (optimistic for the file
    system: it charges the whole 240 s to metadata). Staged: the archive read by every
    node (sbcast tree at NIC speed, or N reads at the file system's aggregate bandwidth, the slower of the two
    counted), unpacked at the rate measured here, then the local time to first step plus the staged ranks'
    remaining shared operations at the same rate.
    """
    rate = 1024 * RANKS_PER_NODE * torch_ops / COPPER_TABLE[1024][0]
    rows = {}
    for nodes in (1024, 4096, 10624):
        ranks = nodes * RANKS_PER_NODE
        hops = max(1, _ceil_log(nodes, SBCAST_FANOUT))
        sbcast = archive_bytes / NIC_BYTES_PER_S + hops * 8e6 / NIC_BYTES_PER_S
        read = max(nodes * archive_bytes / FS_READ_BYTES_PER_S, archive_bytes / NIC_BYTES_PER_S)
        unpack = archive_bytes / unpack_bytes_per_s
        staged = max(sbcast, read) + unpack + local_staged + ranks * staged_ops / rate
        rows[nodes] = {"unstaged_s": round(ranks * unstaged_ops / rate + local_unstaged, 1),
                       "staged_s": round(staged, 1), "broadcast_s": round(max(sbcast, read), 1),
                       "unpack_s": round(unpack, 1), "ezpz_s": sum(EZPZ[nodes]) if nodes in EZPZ else None,
                       "copper_import_torch_s": COPPER_TABLE.get(nodes, (None, None))[1]}
    return {"effective_metadata_ops_per_s": round(rate), "nodes": rows}


def _ceil_log(n: int, base: int) -> int:
    hops, reach = 0, 1
    while reach < n:
        reach *= base
        hops += 1
    return hops


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="CI size: skip the import-time breakdown")
    parser.add_argument("--full", action="store_true", help="measure this venv itself, not a small one")
    parser.add_argument("--json", help="write the figures here too")
    opts = parser.parse_args()
    if not shutil.which("strace"):
        raise SystemExit("strace is missing: apt-get install -y strace")
    # Run folders on disk (sprite refuses one under /dev); node-local storage and the cache on the ramdisk, as
    # Aurora's /tmp is one, so that this machine's slow, shared disk does not stand in for a node's storage.
    work = tempfile.mkdtemp(prefix="startup-scale-")
    local = tempfile.mkdtemp(prefix="startup-scale-", dir="/dev/shm" if os.path.isdir("/dev/shm") else None)
    try:
        python = sys.executable if opts.full else make_small_venv(os.path.join(work, "venv"), install_sprite=True)
        fit = os.path.join(work, "fit.py")
        Path(fit).write_text(FIT)
        figures = measure(python, fit, work, local, opts.quick)
    finally:
        shutil.rmtree(work, ignore_errors=True)
        shutil.rmtree(local, ignore_errors=True)
    print(json.dumps(figures, indent=2))
    if opts.json:
        Path(opts.json).write_text(json.dumps(figures, indent=2))
    ok = figures["ops_ratio"] <= 0.01 and figures["projection"]["nodes"][1024]["staged_s"] <= 120
    print(f"shared ops staged/unstaged = {figures['ops_ratio']:.4f} (target <= 0.01); projected first step at "
          f"1,024 nodes {figures['projection']['nodes'][1024]['staged_s']} s (target <= 120 s): "
          f"{'met' if ok else 'NOT met'}", file=sys.stderr)
    return 0 if ok else 1


def measure(python: str, fit: str, work: str, local: str, quick: bool) -> dict:
    # The shared prefixes: the whole venv and base interpreter prefix (binary and libpython included) and every
    # folder the environment imports from outside them (editable installs, .pth paths).
    probe = subprocess.run([python, "-c", "from sprite.launch.stage import source; import json, sys; "
                            "s = source.current(); print(json.dumps([[sys.prefix, sys.base_prefix], list(s.shared)]))"],
                           capture_output=True, text=True, check=True, env={**_clean_env(), "PYTHONSAFEPATH": "1"})
    roots, shared = json.loads(probe.stdout)
    prefixes = roots + shared
    unstaged = traced_rank(python, fit, prefixes, work, "unstaged")
    torch_only = traced_rank(python, fit, prefixes, work, "torch", ["-c", "import torch"])
    plain = first_step(python, fit, work, local, stage=False, tag="plain")
    packed = first_step(python, fit, work, local, stage=True, tag="staged-pack")
    cached = first_step(python, fit, work, local, stage=True, tag="staged-cached")
    # One rank from a staged copy that stays for the count (sprite's node tool, as a launch would run it).
    stage_dir = os.path.join(local, "node-local", "counted")
    archive = next(str(p) for p in Path(local, "cache").glob("*.tar"))
    sha = json.loads(Path(archive + ".json").read_text())["sha256"]
    subprocess.run([python, "-m", "sprite.launch.stage.node", "unpack", "--dir", stage_dir, "--token", "bench",
                    "--archive", archive, "--sha256", sha], check=True, capture_output=True,
                   env={**_clean_env(), "PYTHONSAFEPATH": "1"})
    staged_python = os.path.join(stage_dir, "env" if "/env/" in packed["torch"] else "base", "bin",
                                 f"python{sys.version_info[0]}.{sys.version_info[1]}")
    staged = traced_rank(staged_python, fit, prefixes, work, "staged")
    ratio = staged["total"] / max(unstaged["total"], 1)
    rec = packed["stage"]
    unpack_rate = rec["bytes"] / max(cached["stage"]["broadcast_seconds"], 1e-3)
    # The staged launch's own start-up, without packing and unpacking (those are projected separately).
    local_staged = cached["seconds_to_first_step"] - cached["stage"]["pack_seconds"] - \
        cached["stage"]["broadcast_seconds"]
    figures = {
        "environment": {"roots": roots, "shared_outside": shared, "archive_bytes": rec["bytes"],
                        "files": rec["files"]},
        "ops_import_torch": torch_only, "ops_unstaged": unstaged, "ops_staged": staged, "ops_ratio": round(ratio, 5),
        "first_step": {"unstaged": plain, "staged_first_launch": packed, "staged_cached": cached},
        "projection": projection(torch_only["total"], unstaged["total"], staged["total"],
                                 plain["seconds_to_first_step"], local_staged,
                                 unpack_rate, rec["bytes"]),
    }
    if not quick:
        figures["imports"] = import_times(python, work)
    return figures


if __name__ == "__main__":
    sys.exit(main())
