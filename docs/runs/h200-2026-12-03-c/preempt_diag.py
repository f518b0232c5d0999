"""Diagnosis: where a 1-rank CUDA fit loses the preemption signal (not part of sprite)."""
import ctypes, json, os, signal, sys, time
import lightning as L
import torch
from torch import nn

libc = ctypes.CDLL(None, use_errno=True)

class SA(ctypes.Structure):
    _fields_ = [("handler", ctypes.c_void_p), ("mask", ctypes.c_ulong * 16), ("flags", ctypes.c_int),
                ("restorer", ctypes.c_void_p)]

def report(where):
    sa = SA()
    libc.sigaction(signal.SIGUSR1, None, ctypes.byref(sa))
    ps = sys.modules.get("sprite.runtime.preempt_signal")
    status = {}
    with open(f"/proc/self/task/{os.getpid()}/status") as f:
        for line in f:
            k, _, v = line.partition(":")
            if k in ("SigBlk", "SigPnd", "ShdPnd", "SigCgt", "SigIgn"):
                status[k] = v.strip()
    threads = len(os.listdir("/proc/self/task"))
    lib = "?"
    with open("/proc/self/maps") as maps:
        for line in maps:
            parts = line.split()
            lo, hi = (int(x, 16) for x in parts[0].split("-"))
            if sa.handler and lo <= sa.handler < hi:
                lib = parts[-1] if len(parts) > 5 else "anon"
                break
    status["lib"] = lib
    print("DIAG", where, json.dumps({"c_handler": hex(sa.handler or 0), "py": repr(signal.getsignal(signal.SIGUSR1)),
          "received": getattr(ps, "received", None), "threads": threads, **status}), flush=True)

report("script-start")
import traceback
def _audit(event, args):
    if event == "import" and args[0] == "mpi4py.MPI":
        print("DIAG mpi4py.MPI imported from:\n" + "".join(traceback.format_stack()), flush=True)
sys.addaudithook(_audit)

class M(L.LightningModule):
    def __init__(self, hold, folder):
        super().__init__()
        self.net = nn.Linear(8, 1)
        self.hold, self.folder = hold, folder
    def setup(self, stage):
        report("setup")
    def on_fit_start(self):
        report("fit-start")
        print("DIAG callbacks", [type(c).__name__ for c in self.trainer.callbacks], flush=True)
    def training_step(self, batch, i):
        if self.global_step in (1, 5):
            report(f"step{self.global_step}")
        if self.global_step == self.hold:
            open(os.path.join(self.folder, "held"), "w").close()
            while not os.path.exists(os.path.join(self.folder, "go")):
                time.sleep(0.05)
            report("after-hold")
        if self.global_step == self.hold + 1:
            report("next-step")
        x, y = batch
        return nn.functional.mse_loss(self.net(x), y)
    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.01)

if __name__ == "__main__":
    hold, folder = int(sys.argv[1]), sys.argv[2]
    data = torch.utils.data.TensorDataset(torch.randn(512, 8), torch.randn(512, 1))
    trainer = L.Trainer(max_steps=40, logger=False, enable_checkpointing=False, enable_progress_bar=False,
                        default_root_dir=folder)
    trainer.fit(M(hold, folder), torch.utils.data.DataLoader(data, batch_size=4))
    report("fit-end")
