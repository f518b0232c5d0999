import os, signal, subprocess, sys, tempfile, time
def one(tag, accel, extra_env):
    folder = tempfile.mkdtemp(prefix=f"diag-{tag}-")
    env = dict(os.environ, **extra_env)
    argv = [sys.executable, "-m", "sprite", "run", "--devices", "1", "--accelerator", accel, "--strategy", "ddp",
            "--run-dir", os.path.join(folder, "run"), os.path.join(os.path.dirname(__file__), "preempt_diag.py"),
            "10", folder]
    t = time.monotonic()
    proc = subprocess.Popen(argv, cwd=folder, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    while not os.path.exists(os.path.join(folder, "held")):
        if proc.poll() is not None:
            break
        time.sleep(0.1)
    proc.send_signal(signal.SIGUSR1)
    time.sleep(2)
    open(os.path.join(folder, "go"), "w").close()
    out, _ = proc.communicate()
    print(f"===== {tag}: exit {proc.returncode} in {time.monotonic() - t:.1f} s")
    print("\n".join(l for l in out.splitlines() if "DIAG" in l or "sprite:" in l or "rror" in l or "preempt" in l))
for spec in sys.argv[1:]:
    tag, accel, *kv = spec.split(",")
    one(tag, accel, dict(x.split("=", 1) for x in kv))
