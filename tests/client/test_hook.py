"""The DDP hook and GradientSync on real gloo ranks (2 and 4 processes).

- dense mode is bit-identical to PyTorch's allreduce_hook (several buckets);
- Top-k through DDP (per bucket, and global over several buckets) and through
  GradientSync equal a reference computed by hand from every rank's gradients;
- switching CR and collective mid-training never hangs and every rank runs rank
  0's sequence, though every rank's own policy disagrees on purpose, a decision
  the client cannot run is ignored and a failing source changes nothing;
- state_dict/load_state_dict restores the residuals.
Bad input fails at construction (in this process, and a group of one rank).
"""

from __future__ import annotations

import pytest
import torch
from torch import nn

from flexcomm.policy.types import Decision
from support.client_ranks import run_ranks

CONTROL_INTERVAL = 2
SWITCH_STEPS = 16


def mlp(seed: int) -> nn.Module:
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(20, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU(),
                         nn.Linear(64, 5))


def batch(rank: int, step: int, features: int = 20):
    gen = torch.Generator().manual_seed(7919 * rank + step)
    return torch.randn(16, features, generator=gen), torch.randint(0, 5, (16,), generator=gen)


def ddp(model: nn.Module) -> nn.parallel.DistributedDataParallel:
    # ~1250 floats per bucket: the MLP spans several buckets.
    return nn.parallel.DistributedDataParallel(model, bucket_cap_mb=0.005)


def train_step(model, opt, rank, step, features=20) -> None:
    x, y = batch(rank, step, features)
    opt.zero_grad()
    nn.functional.cross_entropy(model(x), y).backward()


# -- on the ranks ----------------------------------------------------------------

def check_dense_bitwise(rank: int, world: int) -> dict:
    from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook

    from flexcomm.client.hook import register

    builtin, ours = ddp(mlp(0)), ddp(mlp(0))
    builtin.register_comm_hook(None, allreduce_hook)
    state = register(ours, control_interval=3)
    opts = [torch.optim.SGD(m.parameters(), lr=0.1) for m in (builtin, ours)]
    grads_equal = []
    for step in range(6):
        for m, opt in zip((builtin, ours), opts, strict=True):
            train_step(m, opt, rank, step)
        grads_equal.append(all(torch.equal(a.grad, b.grad) for a, b in
                               zip(builtin.parameters(), ours.parameters(), strict=True)))
        for opt in opts:
            opt.step()
    params_equal = all(torch.equal(a, b) for a, b in
                       zip(builtin.parameters(), ours.parameters(), strict=True))
    last = state.last_stats()
    return {"grads_equal": grads_equal, "params_equal": params_equal,
            "buckets": len(ours.reducer._get_zeros_like_grad_buckets()) if hasattr(
                ours.reducer, "_get_zeros_like_grad_buckets") else None,
            "collectives": [s.collective for s in state.history], "bytes": last.bytes_sent}


def _all_local_grads(model: nn.Module, rank: int, world: int, step: int, features: int):
    """Every rank's local gradient for `step`, flattened, exchanged with all_gather."""
    import torch.distributed as dist

    model.zero_grad()
    x, y = batch(rank, step, features)
    nn.functional.cross_entropy(model(x), y).backward()
    mine = torch.cat([p.grad.reshape(-1) for p in model.parameters()])
    every = [torch.empty_like(mine) for _ in range(world)]
    dist.all_gather(every, mine)
    return every


def _reference_topk(local, residual, cr, collective, step, world):
    from flexcomm.client.compress import k_for

    numel = local[0].numel()
    k = k_for(numel, cr)
    g_e = [g + r for g, r in zip(local, residual, strict=True)]
    if collective == "ag_topk":
        idx = [torch.topk(g.abs(), k).indices for g in g_e]
    else:
        idx = [torch.topk(g_e[step % world].abs(), k).indices] * world
    g_c = []
    for r in range(world):
        c = torch.zeros(numel)
        c[idx[r]] = g_e[r][idx[r]]
        g_c.append(c)
    return sum(c / world for c in g_c), [e - c for e, c in zip(g_e, g_c, strict=True)]


def _run_against_reference(rank, world, model, shadow, state_or_sync, cr, collective, steps,
                           features, warmup, first_step=0, residual=None):
    """Train `model` (DDP or with GradientSync) and compare each step's averaged gradient
    with the hand reference built from `shadow`'s (an identical plain copy) gradients.
    `residual`: every rank's residual at the start (zeros if None)."""
    numel = sum(p.numel() for p in shadow.parameters())
    residual = residual or [torch.zeros(numel) for _ in range(world)]
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    shadow_opt = torch.optim.SGD(shadow.parameters(), lr=0.05)
    errors = []
    for step in range(first_step, first_step + steps):
        local = _all_local_grads(shadow, rank, world, step, features)
        if step - first_step < warmup:
            expected = sum(g / world for g in local)
        else:
            expected, residual = _reference_topk(local, residual, cr, collective, step, world)
        train_step(model, opt, rank, step, features)
        if hasattr(state_or_sync, "synchronize"):
            state_or_sync.synchronize()
        got = torch.cat([p.grad.reshape(-1) for p in model.parameters()])
        errors.append(float((got - expected).abs().max()))
        for p, e in zip(shadow.parameters(), torch.split(expected, [p.numel() for p in
                                                                   shadow.parameters()]),
                        strict=True):
            p.grad = e.view_as(p).clone()
        opt.step()
        shadow_opt.step()
    return errors


def check_sparse_through_ddp(rank: int, world: int) -> dict:
    from flexcomm.client.hook import register

    out = {}
    # One parameter of 81920 entries (the fast selector's range): one bucket.
    single = lambda: (torch.manual_seed(3), nn.Linear(512, 160, bias=False))[1]  # noqa: E731
    model = nn.parallel.DistributedDataParallel(single())
    state = register(model, cr=0.01, collective="ag_topk", warmup_steps=1)
    out["bucket_ag_topk"] = _run_against_reference(
        rank, world, model, single(), state, 0.01, "ag_topk", 4, 512, warmup=1)
    out["restart"] = _restart(rank, world, model, state)
    # Several buckets, one Top-k over all of them (global mode), AR-Topk ring, STAR root.
    model = ddp(mlp(1))
    state = register(model, cr=0.05, collective="art_ring", global_topk=True, warmup_steps=2)
    out["global_art_ring"] = _run_against_reference(
        rank, world, model, mlp(1), state, 0.05, "art_ring", 5, 20, warmup=2)
    out["global_roots"] = [s.roots for s in state.history]
    return out


def _restart(rank: int, world: int, model, state) -> list[float]:
    """A new DDP model and hook restored from `state` (as after a restart) runs its
    dense warm-up step, then uses the restored residual: checked by hand."""
    import copy

    import torch.distributed as dist

    from flexcomm.client.hook import register

    saved = state.state_dict()
    mine = saved["engine"]["residuals"][0]
    every = [torch.empty_like(mine) for _ in range(world)]
    dist.all_gather(every, mine)
    restarted = nn.parallel.DistributedDataParallel(copy.deepcopy(model.module))
    again = register(restarted, cr=0.01, collective="ag_topk", warmup_steps=1)
    again.load_state_dict(saved)
    errors = _run_against_reference(rank, world, restarted, copy.deepcopy(model.module), again,
                                    0.01, "ag_topk", 2, 512, warmup=1, first_step=4,
                                    residual=every)
    assert [s.step for s in again.history] == [4, 5]
    return errors


def check_gradient_sync(rank: int, world: int) -> dict:
    from flexcomm.client.sync import GradientSync

    model = mlp(2)
    sync = GradientSync(model, cr=0.02, collective="ag_topk")
    errors = _run_against_reference(rank, world, model, mlp(2), sync, 0.02, "ag_topk", 4, 20,
                                    warmup=0)
    saved = sync.state_dict()
    again = GradientSync(model, cr=0.02, collective="ag_topk")
    again.load_state_dict(saved)
    # The original and the restored one take the same next step: same result, bit for bit.
    train_step(model, torch.optim.SGD(model.parameters(), lr=0.0), rank, 99)
    grads = [p.grad.clone() for p in model.parameters()]
    sync.synchronize()
    continued = [p.grad.clone() for p in model.parameters()]
    for p, g in zip(model.parameters(), grads, strict=True):
        p.grad.copy_(g)
    stats = again.synchronize()
    restored = [p.grad.clone() for p in model.parameters()]
    return {"errors": errors, "restored_step": stats.step,
            "same_next_step": all(torch.equal(a, b) for a, b in
                                  zip(continued, restored, strict=True)),
            "saved_residual_norm": float(saved["engine"]["residuals"]["model"].norm())}


class ScheduledPolicy:
    """Test-only policy: the decision for the number of steps it has observed."""

    name = "scheduled"

    def __init__(self, schedule: dict[int, Decision]) -> None:
        self.schedule = schedule
        self.observed = 0
        self.decides = 0

    def observe_network(self, net) -> None:
        pass

    def observe_step(self, report) -> None:
        self.observed += 1

    def decide(self) -> Decision:
        self.decides += 1
        return self.schedule[max(s for s in self.schedule if s <= self.observed)]

    def state_dict(self) -> dict:
        return {}

    def load_state_dict(self, state) -> None:
        pass


def schedule_for(rank: int) -> dict[int, Decision]:
    """Rank 0's plan, and a deliberately different plan on every other rank."""
    if rank != 0:
        return {0: Decision(cr=0.5, collective="ag_topk", version=100 + rank)}
    return {
        0: Decision(cr=0.1, collective="ag_topk", version=1),
        4: Decision(cr=0.01, collective="art_ring", root="var", version=2),
        6: Decision(cr=1.0, collective="ps", version=3),  # model-only: must be ignored
        8: Decision(cr=1.0, collective="dense_tree", version=4),
        10: Decision(cr=0.05, collective="art_tree", root="star", version=5),
        12: Decision(cr=1.0, collective="dense_ring", version=6, probe_crs=(0.1, 0.01)),
        14: Decision(cr=0.001, collective="ag_topk", version=7, probe_crs=(0.1, 0.01)),
    }


class FlakySource:
    """Rank 0's source: wraps a policy, raises on one call of latest()."""

    def __init__(self, policy, fail_on_call: int) -> None:
        from flexcomm.client.decisions import PolicySource

        self.inner = PolicySource(policy)
        self.calls = 0
        self.fail_on_call = fail_on_call
        self.reports = []

    def latest(self):
        self.calls += 1
        if self.calls == self.fail_on_call:
            raise RuntimeError("agent went away")
        return self.inner.latest()

    def report(self, report) -> None:
        self.reports.append(report)
        self.inner.report(report)

    def close(self) -> None:
        pass


def check_switching(rank: int, world: int) -> dict:
    from flexcomm.client.hook import register

    policy = ScheduledPolicy(schedule_for(rank))
    # latest() call 6 (step 10's agreement) fails: rank 0 keeps what it ran.
    source = FlakySource(policy, fail_on_call=6)
    model = ddp(mlp(4))
    state = register(model, source=source, control_interval=CONTROL_INTERVAL, warmup_steps=1)
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    dense_after_sparse_residual_zero = None
    for step in range(SWITCH_STEPS):
        train_step(model, opt, rank, step)
        opt.step()
        if step == 9:  # first dense_tree step after art_ring: the residual went out
            dense_after_sparse_residual_zero = all(
                not ef.dirty and float(ef.residual.abs().max()) == 0.0
                for ef in state.engine.memory.values())
    state.close()
    return {
        "sequence": [(s.step, s.collective, s.cr, s.version, tuple(s.roots))
                     for s in state.history],
        "source_calls": source.calls,
        "reports": [(r.step, r.collective, sorted(r.gains)) for r in source.reports],
        "rejected": state.controller.rejected,
        "dense_flushed": dense_after_sparse_residual_zero,
        "rank_stats": state.rank_stats,
    }


def battery(rank: int, world: int) -> dict:
    return {
        "dense": check_dense_bitwise(rank, world),
        "sparse": check_sparse_through_ddp(rank, world),
        "sync": check_gradient_sync(rank, world),
        "switching": check_switching(rank, world),
    }


def group_of_one(rank: int, world: int) -> dict:
    from flexcomm.client.hook import FlexcommState
    from flexcomm.client.sync import GradientSync

    messages = []
    for build in (lambda: FlexcommState(cr=0.01), lambda: GradientSync(mlp(0))):
        try:
            build()
        except ValueError as e:
            messages.append(str(e))
    return {"messages": messages}


# -- in the test process -------------------------------------------------------

@pytest.fixture(scope="module", params=[2, 4], ids=["2ranks", "4ranks"])
def results(request):
    return request.param, run_ranks(request.param, "client/test_hook.py:battery", timeout=200)


@pytest.mark.timeout(260)
def test_dense_mode_is_bitwise_allreduce_hook(results):
    _, per_rank = results
    for res in per_rank:
        d = res["dense"]
        assert d["buckets"] is None or d["buckets"] >= 2  # several buckets were compared
        assert d["grads_equal"] == [True] * 6
        assert d["params_equal"]
        assert d["collectives"] == ["dense_ring"] * 6
        assert d["bytes"] == 4 * sum(p.numel() for p in mlp(0).parameters())


@pytest.mark.timeout(260)
def test_topk_through_ddp_equals_hand_reference(results):
    world, per_rank = results
    for res in per_rank:
        s = res["sparse"]
        assert max(s["bucket_ag_topk"]) < 1e-6, s["bucket_ag_topk"]
        assert max(s["restart"]) < 1e-6, s["restart"]  # restored residual used, by hand
        assert max(s["global_art_ring"]) < 1e-6, s["global_art_ring"]
        # global mode: one root per step (round-robin), none in the dense warm-up
        assert s["global_roots"] == [[], [], [2 % world], [3 % world], [4 % world]]


@pytest.mark.timeout(260)
def test_gradient_sync_equals_hand_reference_and_restores(results):
    _, per_rank = results
    for res in per_rank:
        s = res["sync"]
        assert max(s["errors"]) < 1e-6, s["errors"]
        assert s["saved_residual_norm"] > 0
        assert s["restored_step"] == 4  # the step counter came back too
        assert s["same_next_step"]


def expected_sequence(world: int) -> list[tuple]:
    """What rank 0's plan makes every rank run: a decision proposed at step s (a
    multiple of the control interval) runs from step s + 1 (step 0's at once)."""
    plan = schedule_for(0)
    seq, adopted, proposed = [], None, None
    for step in range(SWITCH_STEPS):
        if proposed is not None:
            adopted, proposed = proposed, None
        if step % CONTROL_INTERVAL == 0:
            proposal = plan[max(s for s in plan if s <= step)]
            if step == 10:  # the flaky source's failing call: keep what was adopted
                proposal = adopted
            proposed = adopted if proposal.collective == "ps" else proposal
            if step == 0:
                adopted, proposed = proposed, None
        d = adopted if step >= 1 else Decision(cr=1.0, collective="dense_ring")
        roots = ()
        if d.collective in ("art_ring", "art_tree"):
            roots = None if d.root == "var" else (step % world,)
        seq.append((step, d.collective, d.cr, roots))
    return seq


@pytest.mark.timeout(260)
def test_switching_follows_rank_0_on_every_rank(results):
    world, per_rank = results
    sequences = [res["switching"]["sequence"] for res in per_rank]
    assert all(s == sequences[0] for s in sequences), "ranks ran different sequences"
    expected = expected_sequence(world)
    got = [(step, c, cr, roots) for step, c, cr, _version, roots in sequences[0]]
    assert len(got) == SWITCH_STEPS
    for g, e in zip(got, expected, strict=True):
        if e[3] is None:  # VAR: one agreed root per bucket, whichever it is
            assert g[:3] == e[:3] and len(g[3]) >= 1, (g, e)
        else:
            assert g == e, (g, e)
    # Only rank 0 asked its source: once per agreement.
    assert per_rank[0]["switching"]["source_calls"] == SWITCH_STEPS // CONTROL_INTERVAL
    assert all(res["switching"]["source_calls"] == 0 for res in per_rank[1:])
    assert per_rank[0]["switching"]["rejected"] == 1  # the "ps" decision
    assert per_rank[0]["switching"]["dense_flushed"] is True
    # Reports carry gains for the CRs the decision asked about, on the first step
    # of each control interval.
    reports = per_rank[0]["switching"]["reports"]
    assert [r[0] for r in reports] == list(range(SWITCH_STEPS))
    assert reports[14][2] == [0.01, 0.1]  # asked by the decision agreed at step 12
    assert reports[15][2] == []
    assert len(per_rank[0]["switching"]["rank_stats"]) == world


@pytest.mark.parametrize("kwargs, field", [
    ({"cr": 0.0}, "cr"),
    ({"cr": 1.5}, "cr"),
    ({"cr": float("nan")}, "cr"),
    ({"cr": 0.1, "collective": "allgather"}, "collective"),
    ({"cr": 1.0, "collective": "ps"}, "collective"),
    ({"collective": "art_ring"}, "cr"),
    ({"cr": 0.1, "root": "biggest"}, "root"),
    ({"cr": 0.1, "selector": "approx"}, "selector"),
    ({"cr": 0.1, "warmup_steps": 0}, "warmup_steps"),
])
def test_bad_input_fails_at_construction(kwargs, field):
    from flexcomm.client.hook import FlexcommState

    with pytest.raises(ValueError, match=rf"^{field}:"):
        FlexcommState(**kwargs)


@pytest.mark.timeout(90)
def test_a_group_of_one_rank_is_refused():
    (res,) = run_ranks(1, "client/test_hook.py:group_of_one", timeout=60)
    assert len(res["messages"]) == 2
    for msg in res["messages"]:
        assert msg.startswith("process_group: needs at least 2 ranks"), msg
