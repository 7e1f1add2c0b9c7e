"""The one-line form on real gloo ranks: `flexcomm.register(model)` asks a real
agent under a job id unique to its rendezvous, or decides in-process with the MOO
(saying so once) when none answers; two jobs at once on one agent never share a
policy; a state built before the process group joins it at its first step; every
rank's hook state goes into one checkpoint and each rank gets its own back;
`import flexcomm` and the client stay light."""

from __future__ import annotations

import itertools
import json
import logging
import os
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import pytest

from flexcomm.proto import agent_pb2 as pb
from flexcomm.store import Store
from support.agent_process import free_port, running
from support.client_ranks import run_ranks

DAEMON_PACKAGES = ("pyroute2", "sqlite_utils", "prometheus_client", "grpc_health", "grpc_reflection")


def train(steps: int, state_from: Any, seed: int = 0) -> tuple[Any, list[float]]:
    """A small DDP model trained `steps` steps with the state `state_from(ddp)` builds."""
    import torch
    from torch.nn.parallel import DistributedDataParallel as DDP

    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 4))
    model = DDP(net)
    state = state_from(model)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    gen = torch.Generator().manual_seed(seed + torch.distributed.get_rank())
    teacher = torch.nn.Linear(32, 4)
    losses = []
    for _ in range(steps):
        x = torch.randn(32, 32, generator=gen)
        loss = torch.nn.functional.cross_entropy(model(x), teacher(x).argmax(1).detach())
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return state, losses


# -- the job id ---------------------------------------------------------------
def test_the_default_job_id_comes_from_the_rendezvous(monkeypatch: pytest.MonkeyPatch) -> None:
    from flexcomm.client.job import job_id

    monkeypatch.setenv("MASTER_ADDR", "10.0.0.1")
    monkeypatch.setenv("MASTER_PORT", "29500")
    monkeypatch.setenv("TORCHELASTIC_RUN_ID", "none")  # torchrun's default: no help
    first = job_id(now=0.0)
    assert first == "10.0.0.1-29500-19700101T000000Z"
    monkeypatch.setenv("MASTER_PORT", "29501")  # a second job beside it
    assert job_id(now=0.0) != first
    assert job_id(now=1.0) != job_id(now=0.0)  # the same job run again
    monkeypatch.setenv("TORCHELASTIC_RUN_ID", "my run/7")
    assert job_id(now=0.0).startswith("my_run_7-10.0.0.1-29501-")  # only [A-Za-z0-9._-]


# -- light imports --------------------------------------------------------------
BLOCKER = """
import importlib.abc, sys
BLOCKED = set(sys.argv[1].split(","))
class Block(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in BLOCKED:
            raise ImportError(f"the client imported {name}")
sys.meta_path.insert(0, Block())
"""


def test_import_flexcomm_loads_no_torch_and_the_client_no_daemon_package() -> None:
    light = subprocess.run([sys.executable, "-c", "import sys, flexcomm; print('torch' in sys.modules, "
                            "sorted(flexcomm.__all__))"], capture_output=True, text=True, check=True)
    assert light.stdout.startswith("False"), light.stdout
    client = BLOCKER + """
import pkgutil, importlib, flexcomm.client
for m in pkgutil.walk_packages(flexcomm.client.__path__, "flexcomm.client."):
    if not m.name.startswith("flexcomm.client.integrations."):
        importlib.import_module(m.name)
print(flexcomm.register.__module__, flexcomm.GradientSync.__module__)
"""
    done = subprocess.run([sys.executable, "-c", client, ",".join(DAEMON_PACKAGES)], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.split() == ["flexcomm.client.job", "flexcomm.client.job"]


# -- no agent: the MOO in-process, said once -------------------------------------
def one_line_without_agent(rank: int, world: int) -> dict:
    import flexcomm

    records: list[str] = []
    handler = logging.Handler()
    handler.emit = lambda r: records.append(r.getMessage())  # type: ignore[method-assign]
    logging.getLogger("flexcomm").addHandler(handler)
    logging.getLogger("flexcomm").setLevel(logging.INFO)
    state, losses = train(60, lambda m: flexcomm.register(m, control_interval=5))
    summary = state.summary()
    state.close()
    return {"losses": losses, "records": records, "summary": summary, "version": state.decision.version,
            "source": type(state.controller.source).__name__}


@pytest.mark.slow  # real gloo ranks
@pytest.mark.timeout(150)
def test_without_an_agent_the_one_line_form_decides_in_process_and_says_so_once(tmp_path: Path,
                                                                                monkeypatch) -> None:
    monkeypatch.setenv("FLEXCOMM_AGENT_SOCKET", str(tmp_path / "nobody.sock"))
    results = run_ranks(2, "client/test_one_line.py:one_line_without_agent")
    zero, one = results
    warned = [r for r in zero["records"] if "no flexcomm agent answers" in r]
    assert len(warned) == 1 and str(tmp_path / "nobody.sock") in warned[0]
    assert not [r for r in one["records"] if "no flexcomm agent" in r]
    assert zero["source"] == "PolicySource" and zero["version"] > 1  # the MOO decided, every rank adopted
    assert one["version"] == zero["version"]
    assert sum(zero["losses"][-10:]) < sum(zero["losses"][:10])
    changes = [r for r in zero["records"] if "adopted decision" in r]
    assert changes and all("(was " in r for r in changes)
    # one line per real change: never the same choice twice in a row
    choices = [r.split(": ", 2)[2].split(", root")[0] for r in changes]
    assert all(a != b for a, b in itertools.pairwise(choices)), changes
    assert not [r for r in one["records"] if "adopted decision" in r]  # rank 0 speaks for the job
    summary = zero["summary"]
    assert summary["steps"] == 60 and sum(c["steps"] for c in summary["choices"].values()) == 60
    assert summary["dense_bytes"] == 60 * (32 * 64 + 64 + 64 * 4 + 4) * 4
    assert summary["bytes_saved"] == summary["dense_bytes"] - summary["bytes_sent"]
    # The default MOO explores at most 5% of max(steps, 100): an item costs ~K steps
    # (control_interval 5), and the job ran 60, so little or nothing was explored.
    assert summary["exploring_share"] * summary["steps"] <= 0.05 * 100
    assert one["summary"]["exploring_share"] == 0  # known on rank 0 only


def gradient_sync_without_agent(rank: int, world: int) -> dict:
    import torch

    import flexcomm

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 4))
    sync = flexcomm.GradientSync(model, control_interval=5)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    gen = torch.Generator().manual_seed(rank)
    teacher = torch.nn.Linear(32, 4)
    losses = []
    for _ in range(40):
        x = torch.randn(32, 32, generator=gen)
        loss = torch.nn.functional.cross_entropy(model(x), teacher(x).argmax(1).detach())
        opt.zero_grad()
        loss.backward()
        sync.synchronize()
        opt.step()
        losses.append(loss.item())
    return {"losses": losses, "version": sync.decision.version, "source": type(sync.controller.source).__name__,
            "weights": [p.detach().clone() for p in model.parameters()]}


@pytest.mark.slow  # real gloo ranks
@pytest.mark.timeout(120)
def test_gradient_sync_takes_the_same_default(tmp_path: Path, monkeypatch) -> None:
    import torch

    monkeypatch.setenv("FLEXCOMM_AGENT_SOCKET", str(tmp_path / "nobody.sock"))
    zero, one = run_ranks(2, "client/test_one_line.py:gradient_sync_without_agent")
    assert zero["source"] == "PolicySource" and zero["version"] > 1 and one["version"] == zero["version"]
    assert sum(zero["losses"][-10:]) < sum(zero["losses"][:10])
    assert all(torch.equal(a, b) for a, b in zip(zero["weights"], one["weights"], strict=True))  # in step


# -- with an agent: a unique id, and two jobs at once -----------------------------
def one_line_with_agent(rank: int, world: int, master_port: str, steps: int) -> dict:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=master_port)  # as torchrun sets them
    import flexcomm

    state, losses = train(steps, lambda m: flexcomm.register(m, control_interval=5))
    source = state.controller.source
    job = getattr(source, "job_id", None)
    state.close()  # the ranks leave through os._exit: no atexit
    return {"job": job, "losses": losses, "version": state.decision.version,
            "ended": getattr(source, "ended", None)}


@pytest.mark.slow  # real gloo ranks
@pytest.mark.timeout(200)
def test_two_jobs_at_once_on_one_agent_never_share_a_policy(tmp_path: Path, monkeypatch) -> None:
    with running(tmp_path) as agent:
        monkeypatch.setenv("FLEXCOMM_AGENT_SOCKET", agent.socket)
        results: dict[int, list[dict]] = {}
        ports = {0: str(free_port()), 1: str(free_port())}
        steps = {0: 40, 1: 60}

        def job(i: int) -> None:
            results[i] = run_ranks(2, "client/test_one_line.py:one_line_with_agent",
                                   args={"master_port": ports[i], "steps": steps[i]}, timeout=150)

        threads = [threading.Thread(target=job, args=(i,)) for i in (0, 1)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert set(results) == {0, 1}, "a job failed (see the log)"
        ids = [results[i][0]["job"] for i in (0, 1)]
        assert ids[0] != ids[1] and all(f"127.0.0.1-{ports[i]}-" in ids[i] for i in (0, 1))
        assert all(results[i][0]["ended"] for i in (0, 1))  # rank 0 ended each job at the agent
        assert agent.stub.ListJobs(pb.ListJobsRequest(), timeout=5).jobs == []
    with Store(agent.db, create=False) as store:
        jobs = {j.job_id: j for j in store.jobs()}
        assert set(jobs) == set(ids)
        for i in (0, 1):  # each policy saw its own job's steps, and only those
            assert jobs[ids[i]].end_reason == "ended" and store.decisions(ids[i])
            aggregates = store.step_reports(ids[i])
            assert sum(a.count for a in aggregates) == steps[i]
            assert max(a.step_last for a in aggregates) == steps[i] - 1


# -- a state built before the process group ----------------------------------------
def state_before_the_group(rank: int, world: int, store: str) -> dict:
    import torch.distributed as dist

    from flexcomm.client.checkpoint import EveryRank
    from flexcomm.client.hook import FlexcommState, flexcomm_hook
    from flexcomm.policy.static import StaticPolicy
    from flexcomm.policy.types import Compression

    dist.destroy_process_group()
    # As Lightning's DDPStrategy(ddp_comm_state=...) takes it: before the group exists.
    state = FlexcommState(policy=StaticPolicy(Compression.parse("topk:0.25"), "ag_topk"), control_interval=2)
    before = (state.step, state.decision.label)
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=world)
    saved = EveryRank(state).state_dict()  # a checkpoint written before the first step (every rank calls it)
    restore = EveryRank()
    restore.load_state_dict(saved)
    restore.attach(state)  # restores nothing
    _, losses = train(20, lambda m: (m.register_comm_hook(state, flexcomm_hook), state)[1])
    ran = state.last_stats().compression.name  # closes the last step
    return {"before": before, "saved": saved, "after": state.decision.label, "steps": state.step, "ran": ran,
            "losses": losses}


@pytest.mark.slow  # real gloo ranks
@pytest.mark.timeout(120)
def test_a_state_built_before_the_process_group_joins_it_at_its_first_step_and_checkpoints_before_it(
        tmp_path: Path) -> None:
    results = run_ranks(2, "client/test_one_line.py:state_before_the_group",
                        args={"store": str(tmp_path / "store")})
    for r in results:
        assert r["before"] == (0, "dense@dense_ring") and r["saved"] == {"ranks": [{}, {}]}
        assert (r["after"], r["steps"], r["ran"]) == ("topk:0.25@ag_topk", 20, "topk:0.25")
        assert sum(r["losses"][-5:]) < sum(r["losses"][:5])


def test_a_state_before_the_group_still_checks_its_options_at_once() -> None:
    from flexcomm.client.hook import FlexcommState

    with pytest.raises(ValueError, match="compression"):
        FlexcommState(compression="zip:3")
    with pytest.raises(ValueError, match="control_interval"):
        FlexcommState(control_interval=0)


# -- every rank's state in one checkpoint ------------------------------------------
def every_rank_checkpoint(rank: int, world: int) -> dict:
    import torch

    from flexcomm.client.checkpoint import EveryRank
    from flexcomm.client.hook import register

    state, _ = train(12, lambda m: register(m, compression="topk:0.1", control_interval=2))
    saved = EveryRank(state).state_dict()  # every rank calls it; rank 0 would write it
    mine = {k: v.clone() for k, v in state.state_dict()["gradient_step"]["memory"]["residuals"].items()}
    fresh, _ = train(0, lambda m: register(m, compression="topk:0.1", control_interval=2))
    restore = EveryRank()
    restore.load_state_dict(saved)  # before the hook exists, as Lightning restores callbacks
    restore.attach(fresh)
    back = fresh.state_dict()["gradient_step"]["memory"]["residuals"]
    return {"ranks": len(saved["ranks"]), "own": all(torch.equal(back[k], v) for k, v in mine.items()),
            "keys": sorted(map(str, mine)), "norm": float(sum(v.norm() for v in mine.values())),
            "step": fresh.step}


@pytest.mark.slow  # real gloo ranks
@pytest.mark.timeout(120)
def test_every_ranks_residuals_go_into_the_checkpoint_and_each_rank_gets_its_own() -> None:
    results = run_ranks(2, "client/test_one_line.py:every_rank_checkpoint")
    for r in results:
        assert r["ranks"] == 2 and r["keys"] and r["own"] and r["step"] == 12
    assert results[0]["norm"] != results[1]["norm"]  # the ranks' residuals differ: rank 0's would not do


def test_a_state_before_its_group_checkpoints_what_it_was_given_to_restore() -> None:
    from flexcomm.client.hook import FlexcommState

    state = FlexcommState(compression="topk:0.1")  # no process group in this process: not joined
    assert state.state_dict() == {}
    given = {"controller": {"step": 7}, "gradient_step": {}}
    state.load_state_dict(given)
    assert state.state_dict() == given  # a checkpoint written now keeps it for the resumed run


# -- an agent client on another rank ---------------------------------------------------
def agent_client_on_rank_one(rank: int, world: int, socket: str) -> dict:
    from flexcomm.client.agent_client import AgentClient

    records: list[str] = []
    handler = logging.Handler()
    handler.emit = lambda r: records.append(r.getMessage())  # type: ignore[method-assign]
    logging.getLogger("flexcomm").addHandler(handler)
    clients = [AgentClient(socket, job_id="every-rank", world_size=2, grad_bytes=4096, nodes=["127.0.0.1"],
                           poll_interval_s=0.1) for _ in range(2)]
    import time

    deadline = time.monotonic() + 20
    while any(c.latest() is None for c in clients) and time.monotonic() < deadline:
        time.sleep(0.02)
    torch_barrier()
    if rank == 1:
        for c in clients:
            c.close()
    torch_barrier()
    ended = [c.ended for c in clients]
    if rank == 0:
        for c in clients:
            c.close()
    return {"warnings": [r for r in records if "only rank 0's is asked" in r], "ended_by_rank_one": ended}


def torch_barrier() -> None:
    import torch.distributed as dist

    dist.barrier()


@pytest.mark.slow  # real gloo ranks
@pytest.mark.timeout(120)
def test_an_agent_client_on_another_rank_warns_once_and_does_not_end_the_job(tmp_path: Path) -> None:
    with running(tmp_path) as agent:
        results = run_ranks(2, "client/test_one_line.py:agent_client_on_rank_one", args={"socket": agent.socket})
        assert results[0]["warnings"] == []
        assert len(results[1]["warnings"]) == 1 and "every-rank" in results[1]["warnings"][0]
        assert results[1]["ended_by_rank_one"] == [False, False]
        assert results[0]["ended_by_rank_one"] == [False, False]  # still running when rank 1 had closed
    with Store(agent.db, create=False) as store:
        (job,) = store.jobs()
        assert job.end_reason == "ended"  # rank 0 ended it


# -- scalars for TensorBoard -------------------------------------------------------------
def scalars_to_tensorboard(rank: int, world: int, logdir: str) -> dict:
    from torch.utils.tensorboard import SummaryWriter

    from flexcomm.client.hook import register

    writer = SummaryWriter(f"{logdir}/rank{rank}")
    state, _ = train(10, lambda m: register(m, compression="bf16", writer=writer))
    writer.close()
    return {"steps": state.step}


@pytest.mark.slow  # real gloo ranks
@pytest.mark.timeout(120)
def test_the_hook_writes_its_scalars_to_a_tensorboard_summary_writer(tmp_path: Path) -> None:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    run_ranks(2, "client/test_one_line.py:scalars_to_tensorboard", args={"logdir": str(tmp_path)})
    events = EventAccumulator(str(tmp_path / "rank0")).Reload()
    tags = events.Tags()["scalars"]
    assert {"flexcomm/t_sync_s", "flexcomm/bytes_sent", "flexcomm/gain"} <= set(tags)
    sent = events.Scalars("flexcomm/bytes_sent")
    assert [e.step for e in sent] == list(range(len(sent))) and len(sent) >= 9
    dense = (32 * 64 + 64 + 64 * 4 + 4) * 4
    assert sent[-1].value == dense // 2  # bf16: two bytes a value
    assert EventAccumulator(str(tmp_path / "rank1")).Reload().Tags()["scalars"] == []  # rank 0 writes


def test_a_writer_without_add_scalar_is_refused_by_name() -> None:
    from flexcomm.client.summary import ScalarWriter

    with pytest.raises(ValueError, match="writer: needs an add_scalar"):
        ScalarWriter(json)
