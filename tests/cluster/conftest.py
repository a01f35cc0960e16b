import os
import sys

import pytest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import cluster as _cluster  # noqa: E402


@pytest.fixture(scope="session")
def cluster_available():
    reason = _cluster.why_unavailable()
    if reason:
        pytest.skip(reason)


@pytest.fixture
def make_cluster(cluster_available):
    """make_cluster(n, rate_mbit=None, ...) -> an up Cluster, torn down after the test."""
    made = []

    def make(n, **kw):
        c = _cluster.Cluster(n, **kw).up()
        made.append(c)
        return c

    yield make
    for c in made:
        c.down()
    leftover = [n.ns for c in made for n in c.nodes if os.path.exists(f"/run/netns/{n.ns}")]
    assert not leftover, f"namespaces left behind: {leftover}"
