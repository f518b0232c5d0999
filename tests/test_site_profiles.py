"""Site profiles carry the values the sites' own guides give (read 2026-11-29; each value names its page in a
comment), say which could not be read, and the --cpu-bind flag and spec key override the profile's binding."""

from __future__ import annotations

from importlib import resources
import pytest

from sprite.spec import sites
from sprite.launch.plan import plan_run

ONECCL_MINIMAL = {"CCL_PROCESS_LAUNCHER": "pmix", "CCL_ATL_TRANSPORT": "mpi", "CCL_KVS_MODE": "mpi",
                  "FI_MR_CACHE_MONITOR": "userfaultfd"}


def test_aurora_follows_alcfs_current_guide():
    aurora = sites.load("aurora")
    assert ONECCL_MINIMAL.items() <= aurora.job["env"].items()  # oneCCL.md "Minimal set"
    assert "FI_PROVIDER" not in aurora.job["env"]
    assert aurora.cpu_bind == "list:4-7:8-11:12-15:16-19:20-23:24-27:56-59:60-63:64-67:68-71:72-75:76-79"
    assert aurora.rendezvous_domain == "hsn.cm.aurora.alcf.anl.gov" and aurora.require_account == "refuse"
    assert aurora.submit["extra"] == ("-k doe",)
    assert aurora.queues["debug-scaling"]["max_nodes"] == 256 and aurora.queues["prod"]["min_nodes"] == 256
    assert aurora.queues["capacity"] == {"min_nodes": 1, "max_nodes": 16, "max_walltime": "168:00:00"}


def test_polaris_nccl_and_libfabric_variables():
    env = sites.load("polaris").job["env"]
    assert {"NCCL_NET_GDR_LEVEL": "PHB", "NCCL_CROSS_NIC": "1", "NCCL_COLLNET_ENABLE": "1",
            "FI_CXI_DISABLE_HOST_REGISTER": "1", "FI_MR_CACHE_MONITOR": "userfaultfd",
            "FI_CXI_DEFAULT_CQ_SIZE": "131072"}.items() <= env.items()
    assert "NCCL_NET" not in env  # needs the aws-ofi-nccl plugin on LD_LIBRARY_PATH (see the profile)


@pytest.mark.parametrize("name", ["aurora", "polaris", "perlmutter"])
def test_profiles_say_where_and_when_their_values_were_read(name):
    text = (resources.files("sprite.conf") / f"{name}.yaml").read_text()
    assert "2026-11-29" in text
    if name == "perlmutter":  # NERSC's QOS table could not be read here: the profile says so
        assert "NOT READ" in text and "could not be read" in text and sites.load(name).require_account == "warn"
    else:
        assert "argonne-lcf/user-guides at 7d04a3f" in text


def test_cpu_bind_flag_and_spec_key_override_the_profile(tmp_path, clean_env, example_script):
    nodefile = tmp_path / "nodefile"
    nodefile.write_text("x1\n")
    pbs = {**clean_env, "PBS_JOBID": "1.pbs", "PBS_NODEFILE": str(nodefile)}
    argv = plan_run({"script": example_script, "site": "aurora", "cpu_bind": "depth"}, pbs).argv
    assert argv[argv.index("--cpu-bind") + 1] == "depth"
    spec = tmp_path / "job.yaml"
    spec.write_text(f"site: perlmutter\nscript: {example_script}\ncpu_bind: map_cpu:0,16,32,48\n")
    slurm = {**clean_env, "SLURM_JOB_ID": "2", "SLURM_JOB_NODELIST": "nid001", "SLURM_NTASKS_PER_NODE": "4"}
    assert "--cpu-bind=map_cpu:0,16,32,48" in plan_run({}, slurm, spec_file=str(spec)).argv
    assert "--cpu-bind=cores" in plan_run({"script": example_script, "site": "perlmutter"}, slurm).argv


def test_site_key_rules(tmp_path):
    profile = tmp_path / "mine.yaml"
    profile.write_text("name: mine\nscheduler: pbs\nrequire_account: always\n")
    with pytest.raises(Exception, match=r"mine.yaml:3.*'require_account'.*refuse, warn"):
        sites.load(str(profile))
    assert "devices" not in sites.load("local").job  # ranks per node follow the visible GPUs (test_device_count)
