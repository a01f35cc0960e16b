"""Config round-trip, rank detection, start-up injection."""
import os
import subprocess
import sys

from commprof.record import ranks
from commprof.record.bootstrap import write_bootstrap
from commprof.record.config import CONFIG_FILE, Config
from commprof.record.launcher import child_env, detect_launcher, with_nproc
from helpers import ROOT, venv_env


def test_config_roundtrips_through_env_and_file(tmp_path):
    cfg = Config(out_dir="/x", run_id="abc", command=("torchrun", "a b"), launcher="torchrun",
                 flush_interval=0.25, nvtx=False, disable=("dataloader",), verbose=True,
                 labels={"loader": "dali"})
    assert Config.from_env(cfg.to_env()) == cfg
    path = str(tmp_path / CONFIG_FILE)
    cfg.to_file(path)
    assert Config.from_file(path) == cfg
    assert Config.from_env({}) is None
    assert all(k.startswith("COMMPROF_") for k in cfg.to_env())


def test_rank_from_launcher_variables():
    assert ranks.from_env({"RANK": "3", "WORLD_SIZE": "8", "LOCAL_RANK": "1"}) == ranks.RankInfo(3, 8, 1, "torch")
    assert ranks.from_env({"OMPI_COMM_WORLD_RANK": "5", "OMPI_COMM_WORLD_SIZE": "6"}).rank == 5
    assert ranks.from_env({"PMI_RANK": "2", "PMI_SIZE": "4"}).world_size == 4
    assert ranks.from_env({"SLURM_PROCID": "7", "SLURM_NTASKS": "16", "SLURM_LOCALID": "3"}) == \
        ranks.RankInfo(7, 16, 3, "slurm")
    assert ranks.from_env({"HOROVOD_RANK": "1", "HOROVOD_SIZE": "2"}).source == "horovod"
    assert ranks.from_env({}) == ranks.RankInfo(0, 1, 0, "default")


def test_launcher_detection_and_nproc():
    assert detect_launcher(["torchrun", "x.py"]) == "torchrun"
    assert detect_launcher(["python3", "-m", "torch.distributed.run", "x.py"]) == "torchrun"
    assert detect_launcher(["/usr/bin/python", "x.py"]) == "python"
    assert detect_launcher(["srun", "-n", "4", "python", "x.py"]) == "srun"
    assert detect_launcher(["deepspeed", "x.py"]) == "deepspeed"
    assert with_nproc(["python", "t.py", "--a"], 4)[1:] == [
        "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=4", "t.py", "--a"]


def test_sitecustomize_chains_to_the_one_it_shadows_and_reads_the_file(tmp_path):
    other = tmp_path / "other"
    other.mkdir()
    (other / "sitecustomize.py").write_text("import os\nos.environ['OTHER_SITECUSTOMIZE'] = 'ran'\n")
    boot = tmp_path / "boot"
    cfg = Config(out_dir=str(tmp_path / "out"), run_id="r1")
    write_bootstrap(str(boot), cfg)
    env = venv_env()
    env["PYTHONPATH"] = os.pathsep.join([str(boot), ROOT, str(other)])
    # no COMMPROF_* variables: settings come from the file beside sitecustomize.py
    code = ("import os, commprof.record.session as s; "
            "print(os.environ.get('OTHER_SITECUSTOMIZE'), s.current() is not None, "
            "s.current().config.run_id, os.environ.get('COMMPROF_RUN_ID'))")
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, cwd=str(tmp_path))
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["ran", "True", "r1", '"r1"']


def test_processes_that_never_train_write_nothing(tmp_path):
    cfg = Config(out_dir=str(tmp_path / "out"), run_id="r2")
    env = child_env(cfg, str(tmp_path / "boot"), venv_env())
    write_bootstrap(str(tmp_path / "boot"), cfg)
    out = subprocess.run([sys.executable, "-c", "import torch; print(torch.ones(2).sum().item())"],
                         env=env, capture_output=True, text=True)
    assert out.returncode == 0 and out.stdout.strip() == "2.0", out.stderr
    assert not os.path.exists(tmp_path / "out" / "shards")


def test_torch_is_not_imported_by_the_bootstrap(tmp_path):
    cfg = Config(out_dir=str(tmp_path / "out"), run_id="r3")
    env = child_env(cfg, str(tmp_path / "boot"), venv_env())
    write_bootstrap(str(tmp_path / "boot"), cfg)
    out = subprocess.run([sys.executable, "-c", "import sys; print('torch' in sys.modules, 'pyarrow' in sys.modules)"],
                         env=env, capture_output=True, text=True)
    assert out.stdout.split() == ["False", "False"], out.stderr


def test_recorder_options_are_generated_from_config_fields():
    """Every Config field that declares an option is a `commprof record`
    flag (and only those); parsed values come back as Config keyword
    arguments, bad ones as one-line errors."""
    import argparse
    import dataclasses

    import pytest

    from commprof.cli import build_parser
    from commprof.record.config import Config, add_options, from_options

    declared = {f.name for f in dataclasses.fields(Config) if "option" in f.metadata}
    p = argparse.ArgumentParser()
    add_options(p)
    assert {a.dest for a in p._actions if a.dest != "help"} == declared
    args = build_parser().parse_args(["record", "--no-nvtx", "--disable", "dataloader", "--label", "a=b",
                                      "--telemetry-interval", "2", "--", "python", "x.py"])
    kw = from_options(args)
    cfg = Config(**kw)
    assert (cfg.nvtx, cfg.disable, cfg.labels, cfg.telemetry_interval) == (False, ("dataloader",), {"a": "b"}, 2.0)
    assert Config(**from_options(build_parser().parse_args(["record", "--", "x"]))) == Config()
    for bad, text in ((["--kernels", "x"], "--kernels expects START:COUNT"), (["--label", "ab"], "KEY=VALUE"),
                      (["--telemetry-interval", "0"], "--telemetry-interval must be > 0")):
        with pytest.raises(ValueError, match=text):
            from_options(build_parser().parse_args(["record", *bad, "--", "x"]))
