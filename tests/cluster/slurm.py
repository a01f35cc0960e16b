"""A real one-node SLURM for tests: munged, slurmctld and slurmd (Debian's
slurm-wlm) with a generated slurm.conf under a temporary folder; stopped
afterwards. ``srun``, ``sbatch`` and ``squeue`` then work with
``SLURM_CONF`` pointing at the generated file.

    with LocalSlurm(tmpdir) as s:
        subprocess.run(["srun", "-n", "2", "hostname"], env=s.env())
"""
from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import time
from typing import Dict, Optional

MUNGE_SOCKET = "/run/munge/munge.socket.2"


def why_unavailable() -> Optional[str]:
    for tool in ("munged", "slurmctld", "slurmd", "srun", "sinfo"):
        if shutil.which(tool) is None:
            return f"SLURM is not installed ({tool!r} missing; make test installs slurm-wlm and munge with apt " \
                   "where it can)"
    if os.geteuid() != 0:
        return "the local SLURM fixture runs its daemons as root"
    if not os.path.exists("/etc/munge/munge.key"):
        return "no /etc/munge/munge.key"
    return None


class LocalSlurm:
    def __init__(self, folder: str, cpus: int = 0):
        self.folder = folder
        self.host = socket.gethostname()
        self.cpus = cpus or max(2, os.cpu_count() or 2)
        self.conf = os.path.join(folder, "slurm.conf")
        self._procs: Dict[str, int] = {}
        self._munged_started = False

    def env(self, base: Optional[Dict[str, str]] = None) -> Dict[str, str]:
        env = dict(os.environ if base is None else base)
        env["SLURM_CONF"] = self.conf
        for k in [k for k in env if k.startswith("SLURM_") and k != "SLURM_CONF"]:
            del env[k]          # a test runner inside a Slurm job must not leak its job into ours
        return env

    def _write_conf(self) -> None:
        f = self.folder
        for d in ("state", "spool", "log"):
            os.makedirs(os.path.join(f, d), exist_ok=True)
        with open(self.conf, "w") as fh:
            fh.write(f"""ClusterName=commproftest
SlurmctldHost={self.host}
AuthType=auth/munge
CredType=cred/munge
SlurmUser=root
SlurmdUser=root
StateSaveLocation={f}/state
SlurmdSpoolDir={f}/spool
SlurmctldPidFile={f}/slurmctld.pid
SlurmdPidFile={f}/slurmd.pid
SlurmctldLogFile={f}/log/slurmctld.log
SlurmdLogFile={f}/log/slurmd.log
SlurmctldPort=6917
SlurmdPort=6918
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
ReturnToService=2
MpiDefault=none
JobCompType=jobcomp/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
SchedulerType=sched/builtin
InactiveLimit=0
KillWait=5
MinJobAge=10
NodeName={self.host} CPUs={self.cpus} RealMemory=2000 State=UNKNOWN
PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP OverSubscribe=FORCE:8
""")

    def up(self) -> "LocalSlurm":
        self._write_conf()
        if not os.path.exists(MUNGE_SOCKET) or subprocess.run(["munge", "-n"], capture_output=True).returncode != 0:
            os.makedirs("/run/munge", exist_ok=True)
            subprocess.run(["munged", "--force"], check=True, capture_output=True)
            self._munged_started = True
        env = self.env()
        for daemon in ("slurmctld", "slurmd"):
            r = subprocess.run([daemon, "-f", self.conf], env=env, capture_output=True, text=True)
            if r.returncode != 0:
                self.down()
                raise RuntimeError(f"{daemon} did not start: {r.stderr.strip()} (log in {self.folder}/log)")
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            r = subprocess.run(["sinfo", "-h", "-o", "%t"], env=env, capture_output=True, text=True)
            if r.returncode == 0 and r.stdout.strip() in ("idle", "mix", "alloc"):
                return self
            time.sleep(0.2)
        self.down()
        raise RuntimeError(f"the SLURM node did not become idle (log in {self.folder}/log)")

    def down(self) -> None:
        env = self.env()
        for pidfile in ("slurmd.pid", "slurmctld.pid"):
            path = os.path.join(self.folder, pidfile)
            try:
                with open(path) as fh:
                    pid = int(fh.read().strip())
            except (OSError, ValueError):
                continue
            try:
                os.kill(pid, signal.SIGTERM)
            except ProcessLookupError:
                continue
            deadline = time.monotonic() + 10
            while time.monotonic() < deadline:
                try:
                    os.kill(pid, 0)
                except ProcessLookupError:
                    break
                time.sleep(0.1)
            else:
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
        del env
        if self._munged_started:
            subprocess.run(["pkill", "-x", "munged"], capture_output=True)

    def __enter__(self) -> "LocalSlurm":
        return self.up()

    def __exit__(self, *exc) -> None:
        self.down()
