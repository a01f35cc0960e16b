"""Run a script under torch.profiler (CPU activities, record_shapes=True),
as a user would to get the same information from PyTorch itself."""
import runpy
import sys

import torch


def main():
    script = sys.argv[1]
    sys.argv = sys.argv[1:]
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU], record_shapes=True):
        try:
            runpy.run_path(script, run_name="__main__")
        except SystemExit as exc:
            if exc.code not in (0, None):
                raise


if __name__ == "__main__":
    main()
