"""A job's node list from its process group: every rank's address toward the
master, gathered once on real gloo ranks; and the hook hands it to rank 0's
source when that source asks for one."""

from __future__ import annotations

import pytest

from flexcomm.client.nodes import address_toward, node_list, rank_address
from support.client_ranks import run_ranks


def test_each_node_once_in_rank_order_and_the_masters_node_as_the_others_see_it() -> None:
    master = "10.0.0.1"
    seen = [("127.0.0.1", master), ("127.0.0.1", master), ("10.0.0.2", master), ("10.0.0.3", master),
            ("10.0.0.2", master), (None, None)]
    assert node_list(seen) == ["10.0.0.1", "10.0.0.2", "10.0.0.3"]
    assert node_list([("127.0.0.1", "127.0.0.1")] * 4) == ["127.0.0.1"]  # one machine
    assert node_list([(None, None)] * 2) == []


def test_rank_address_is_the_source_toward_the_master() -> None:
    assert address_toward("127.0.0.1") == "127.0.0.1"
    assert rank_address("localhost") == ("127.0.0.1", "127.0.0.1")
    assert rank_address("nowhere.invalid") == (None, None)


class RecordingSource:
    """A decision source that records the nodes the hook hands it (rank 0)."""

    def __init__(self) -> None:
        self.nodes: list[str] | None = None

    def use_nodes(self, nodes: list[str]) -> None:
        self.nodes = list(nodes)

    def latest(self):
        return None

    def report(self, report) -> None:
        pass

    def close(self) -> None:
        pass


def gather_through_the_hook(rank: int, world: int) -> dict:
    import torch
    from torch.nn.parallel import DistributedDataParallel as DDP

    from flexcomm.client.hook import register
    from flexcomm.client.nodes import job_nodes

    source = RecordingSource() if rank == 0 else None
    register(DDP(torch.nn.Linear(4, 2)), source=source)
    return {"handed": source.nodes if source else None, "gathered": job_nodes()}


@pytest.mark.slow  # real gloo ranks
@pytest.mark.timeout(120)
def test_the_hook_gathers_the_nodes_on_every_rank_and_hands_them_to_rank_0(monkeypatch) -> None:
    monkeypatch.setenv("MASTER_ADDR", "localhost")  # as torchrun sets it
    results = run_ranks(2, "client/test_nodes.py:gather_through_the_hook")
    assert results[0]["handed"] == ["127.0.0.1"]
    assert [r["gathered"] for r in results] == [["127.0.0.1"]] * 2
    assert results[1]["handed"] is None
