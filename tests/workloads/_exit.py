"""The test workloads use workloads/teardown.py's wait_released."""
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))),
                                "workloads"))
from teardown import wait_released  # noqa: E402,F401
