"""One Horovod process (gloo, no launcher) that allreduces many small
tensors in one grouped call and exits at once: what is still queued for
Horovod's timeline writer when the process ends (the phases that close
last) is lost unless the timeline is stopped first
(tests/record/test_frameworks.py)."""
import sys

import horovod.torch as hvd
import torch


def main():
    n = int(sys.argv[1])
    hvd.init()
    hvd.synchronize(hvd.grouped_allreduce_async([torch.ones(8) for _ in range(n)], name="burst"))


if __name__ == "__main__":
    main()
