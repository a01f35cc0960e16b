"""Start-up injection: the ``sitecustomize`` that ``commprof record`` puts
first on PYTHONPATH calls :func:`boot` in every new interpreter of the job.

``boot`` first runs any ``sitecustomize`` it shadows, then reads the config
(environment first, the JSON file next to sitecustomize.py second) and
starts a recording session. It never raises."""
from __future__ import annotations

import importlib.machinery
import importlib.util
import os
import sys

from .config import CONFIG_FILE, Config

SITECUSTOMIZE = '''\
# Written by `commprof record`: starts commprof in every Python process of
# the recorded job, then runs any sitecustomize this file shadows.
def _commprof_boot():
    import os, sys
    here = os.path.dirname(os.path.abspath(__file__))
    try:
        from commprof.record.bootstrap import boot
    except Exception as exc:  # commprof not importable in this interpreter
        sys.stderr.write("commprof: not recording %s: %r\\n" % (sys.executable, exc))
        return
    boot(here)
_commprof_boot()
del _commprof_boot
'''


def write_bootstrap(folder: str, config: Config) -> None:
    os.makedirs(folder, exist_ok=True)
    with open(os.path.join(folder, "sitecustomize.py"), "w") as fh:
        fh.write(SITECUSTOMIZE)
    config.to_file(os.path.join(folder, CONFIG_FILE))


def run_shadowed_sitecustomize(here: str) -> None:
    """Execute the sitecustomize that ours hides (coverage.py does the same)."""
    here = os.path.realpath(here)
    path = [p for p in sys.path if os.path.realpath(p or os.getcwd()) != here]
    spec = importlib.machinery.PathFinder.find_spec("sitecustomize", path)
    if spec is None or spec.loader is None:
        return
    module = importlib.util.module_from_spec(spec)
    sys.modules["_commprof_shadowed_sitecustomize"] = module
    spec.loader.exec_module(module)


def boot(here: str) -> None:
    try:
        run_shadowed_sitecustomize(here)
    except Exception as exc:
        sys.stderr.write(f"commprof: the shadowed sitecustomize failed: {exc!r}\n")
    try:
        config = Config.from_env()
        if config is None:
            path = os.path.join(here, CONFIG_FILE)
            if not os.path.exists(path):
                return
            config = Config.from_file(path)
            # Children of this process (e.g. ranks a remote launcher starts)
            # get the settings through the environment from here on.
            os.environ.update(config.to_env())
        from .session import start

        start(config)
        if config.verbose:
            sys.stderr.write(f"commprof: recording pid {os.getpid()} ({sys.argv[:3]})\n")
    except Exception as exc:
        sys.stderr.write(f"commprof: recording disabled in pid {os.getpid()}: {exc!r}\n")
