"""Real gloo ranks (2 and 4 processes): every family and collective against a
reference by hand or against PyTorch's own PowerSGD hook.

Each rank can regenerate every other rank's gradients (seeded by rank and step),
so the test computes the expected average, each rank's residual and the roots
without trusting any of the client's communication. One group run per world
size does all the checks; the tests below assert on what it returned.
"""

from __future__ import annotations

import pytest
import torch

from support.client_ranks import run_ranks

CASES = [  # (collective, root, numel, cr): the fast selector above 65536 entries
    ("ag_topk", "star", 100_000, 0.01),
    ("ag_topk", "star", 3_000, 0.1),
    ("art_ring", "star", 100_000, 0.01),
    ("art_ring", "var", 3_000, 0.05),
    ("art_tree", "star", 3_000, 0.05),
    ("art_tree", "var", 100_000, 0.001),
]
STEPS = 4
SMOOTHING = 0.3  # VAR's EWMA weight on the past; low, so the hot rank wins


def local_grad(rank: int, step: int, numel: int, world: int) -> torch.Tensor:
    gen = torch.Generator().manual_seed(1000 * rank + step)
    # One "hot" rank per step, hotter every step (its variance outweighs what error
    # feedback keeps of the earlier steps), so VAR's root moves around.
    return torch.randn(numel, generator=gen) * (5.0 * (step + 1) if rank == step % world else 1.0)


class Reference:
    """The client's semantics written out plainly for all ranks at once."""

    def __init__(self, world: int, numel: int, smoothing: float = SMOOTHING) -> None:
        self.world, self.numel, self.smoothing = world, numel, smoothing
        self.residual = [torch.zeros(numel) for _ in range(world)]
        self.var: list[float | None] = [None] * world

    def step(self, collective: str, root: str, cr: float, step: int):
        from flexcomm.client.selection import k_for

        k = k_for(self.numel, cr)
        g_e = [local_grad(r, step, self.numel, self.world) + self.residual[r]
               for r in range(self.world)]
        root_rank = None
        if collective == "ag_topk":
            idx = [torch.topk(g.abs(), k).indices for g in g_e]
        else:
            root_rank = step % self.world if root == "star" else self._var_root(g_e, step)
            idx = [torch.topk(g_e[root_rank].abs(), k).indices] * self.world
        g_c = []
        for r in range(self.world):
            c = torch.zeros(self.numel)
            c[idx[r]] = g_e[r][idx[r]]
            g_c.append(c)
        result = sum(c / self.world for c in g_c)
        self.residual = [e - c for e, c in zip(g_e, g_c, strict=True)]
        return result, g_e, g_c, root_rank

    def _var_root(self, g_e, step: int) -> int:
        """The largest smoothed variance up to the previous step (star's root before any)."""
        root = step % self.world if self.var[0] is None else max(range(self.world), key=lambda r: (self.var[r], -r))
        for r, g in enumerate(g_e):
            v = float(g.double().var(unbiased=False))
            prev = self.var[r]
            self.var[r] = v if prev is None else self.smoothing * prev + (1 - self.smoothing) * v
        return root


def run_step(gradient_step, key, g, shapes, step, family, param, collective, root="star"):
    from flexcomm.client.compressors import Bucket
    from flexcomm.client.stats import StepStats
    from flexcomm.policy.types import Decision

    stats = StepStats(step, family, param, collective, 1)
    decision = Decision(family, param, collective, root=root)
    return gradient_step.run(Bucket(key, g, shapes, step), decision, stats).wait(), stats


def check_sparse(rank: int, world: int) -> list[dict]:
    from flexcomm.client.step import GradientStep

    out = []
    for collective, root, numel, cr in CASES:
        gradient_step = GradientStep(None, selector="fast", var_smoothing=SMOOTHING)
        ref = Reference(world, numel)
        for step in range(STEPS):
            expected, g_e, g_c, root_rank = ref.step(collective, root, cr, step)
            g = local_grad(rank, step, numel, world)
            result, stats = run_step(gradient_step, "b0", g, [g.shape], step, "topk", cr, collective, root)
            residual = gradient_step.memory.residuals["b0"].residual
            out.append({
                "case": (collective, root, numel, cr, step),
                "max_err": float((result - expected).abs().max()),
                "scale": float(expected.abs().max()),
                # Error feedback: what was sent plus what is kept is exactly g_e.
                "ef_exact": bool(torch.equal(residual + g_c[rank], g_e[rank])),
                "residual_matches": bool(torch.equal(residual, ref.residual[rank])),
                "roots": (stats.roots, [] if root_rank is None else [root_rank]),
                "gain": (stats.gain, float(g_c[rank].norm() ** 2 / g_e[rank].norm() ** 2)),
            })
    return out


def check_dense(rank: int, world: int) -> dict:
    """dense and bf16 over the ring and the tree; bf16 against casting by hand."""
    from flexcomm.client.step import GradientStep

    gradient_step = GradientStep(None)
    out = {}
    for family in ("dense", "bf16"):
        for collective in ("dense_ring", "dense_tree"):
            g = local_grad(rank, 0, 5_000, world)
            result, stats = run_step(gradient_step, "t", g, [g.shape], 0, family, 0, collective)
            grads = [local_grad(r, 0, 5_000, world) for r in range(world)]
            if family == "bf16":  # what PyTorch's bf16 hook sends: each rank's bf16 / N, summed
                expected = sum(x.to(torch.bfloat16).div_(world).float() for x in grads)
                scale = 2 ** -7 * world  # a few roundings of bf16's 8-bit mantissa
            else:
                expected, scale = sum(grads) / world, 1e-6
            out[f"{family}@{collective}"] = (float((result - expected).abs().max() / expected.abs().max()), scale,
                                             stats.bytes_sent)
    return out


SHAPES = [torch.Size((64, 48)), torch.Size((48,)), torch.Size((30, 20, 2)), torch.Size((5, 3))]


class _Bucket:
    """What powerSGD_hook reads of a DDP GradBucket (which Python cannot build)."""

    def __init__(self, buffer: torch.Tensor) -> None:
        self._buffer = buffer

    def buffer(self) -> torch.Tensor:
        return self._buffer

    def gradients(self) -> list[torch.Tensor]:
        views, offset = [], 0
        for s in SHAPES:
            views.append(self._buffer[offset : offset + s.numel()].view(s))
            offset += s.numel()
        return views

    def index(self) -> int:
        return 0

    def is_last(self) -> bool:
        return True


def check_powersgd_is_pytorchs(rank: int, world: int) -> list[float]:
    """Three steps of PyTorch's powerSGD_hook (error feedback off, warm start on)
    and of this client's compressor alone, from the same Q: the same averages."""
    from torch.distributed.algorithms.ddp_comm_hooks import powerSGD_hook as psgd

    from flexcomm.client.collectives import Ring
    from flexcomm.client.compressors import Bucket
    from flexcomm.client.compressors.powersgd import PowerSgd
    from flexcomm.client.gains import ORTHOGONALIZE_EPSILON
    from flexcomm.client.stats import StepStats
    from flexcomm.policy.types import Decision

    numel = sum(s.numel() for s in SHAPES)
    state = psgd.PowerSGDState(None, matrix_approximation_rank=2, start_powerSGD_iter=2, use_error_feedback=False,
                               warm_start=True, orthogonalization_epsilon=ORTHOGONALIZE_EPSILON)
    state.iter = 2
    ours, ring, decision = PowerSgd(), Ring(None), Decision("powersgd", 2, "dense_ring")
    q0 = torch.randn(48 * 2 + 40 * 2, generator=torch.Generator().manual_seed(9))  # (5, 3) goes dense at rank 2
    state.p_memory_dict[0] = torch.empty(64 * 2 + 30 * 2)
    state.q_memory_dict[0] = q0.clone()
    ours.warm.keep(("b", 2), q0.clone())
    errors = []
    for step in range(3):
        g = local_grad(rank, step, numel, world)
        theirs = psgd.powerSGD_hook(state, _Bucket(g.clone())).wait()
        bucket = Bucket("b", g.clone(), SHAPES, step)
        stats = StepStats(step, "powersgd", 2, "dense_ring", 1)
        mine = ours.communicate(ours.compress(bucket, g.clone(), decision, ring, stats), ring, stats).wait()
        errors.append(float((mine - theirs).abs().max() / theirs.abs().max()))
    return errors


def check_families_keep_the_residual(rank: int, world: int) -> dict:
    """Switching among Top-k, PowerSGD, bf16 and dense loses no residual mass:
    summed over steps and ranks, what the average carried (times N) plus the
    residuals left equals every gradient fed in."""
    from flexcomm.client.step import GradientStep

    gradient_step = GradientStep(None)
    numel = sum(s.numel() for s in SHAPES)
    plan = [("topk", 0.05, "ag_topk"), ("powersgd", 2, "dense_ring"), ("topk", 0.05, "art_ring"),
            ("powersgd", 1, "dense_ring"), ("powersgd", 2, "dense_ring"), ("topk", 0.1, "art_tree"),
            ("dense", 0, "dense_tree")]
    fed, carried = torch.zeros(numel, dtype=torch.float64), torch.zeros(numel, dtype=torch.float64)
    residual_norms = []
    for step, (family, param, collective) in enumerate(plan):
        g = local_grad(rank, step, numel, world)
        fed += g.double()
        result, _ = run_step(gradient_step, "b", g, SHAPES, step, family, param, collective)
        carried += result.double()
        residual_norms.append(float(gradient_step.memory.residuals["b"].residual.norm()))
    return {"fed": fed, "carried": carried, "left": gradient_step.memory.residuals["b"].residual.double(),
            "residual_norms": residual_norms}


WIDTH_OPTIONS = [("dense", 0, "dense_ring", "star"), ("bf16", 0, "dense_tree", "star"),
                 ("powersgd", 2, "dense_ring", "star"), ("topk", 0.05, "ag_topk", "star"),
                 ("topk", 0.05, "art_ring", "star")]


def check_widths(rank: int, world: int) -> dict:
    """bytes_sent of each option on fp32, bf16 and fp16 gradients of the same shapes,
    and whether the average came back in the bucket's dtype."""
    from flexcomm.client.step import GradientStep

    numel = sum(s.numel() for s in SHAPES)
    out = {}
    for dtype in (torch.float32, torch.bfloat16, torch.float16):
        gradient_step = GradientStep(None)
        for family, param, collective, root in WIDTH_OPTIONS:
            g = local_grad(rank, 0, numel, world).to(dtype)
            result, stats = run_step(gradient_step, (family, collective), g, SHAPES, 0, family, param, collective,
                                     root)
            out[(str(dtype), family, collective)] = (stats.bytes_sent, result.dtype == dtype)
    return out


def battery(rank: int, world: int) -> dict:
    return {"sparse": check_sparse(rank, world), "dense": check_dense(rank, world),
            "powersgd": check_powersgd_is_pytorchs(rank, world),
            "families": check_families_keep_the_residual(rank, world), "widths": check_widths(rank, world)}


@pytest.fixture(scope="module", params=[2, 4], ids=["2ranks", "4ranks"])
def results(request):
    return request.param, run_ranks(request.param, "client/test_collectives.py:battery", timeout=150)


@pytest.mark.slow  # real gloo ranks
@pytest.mark.timeout(200)
def test_sparse_collectives_equal_the_hand_reference(results):
    _, per_rank = results
    for rank, res in enumerate(per_rank):
        for row in res["sparse"]:
            assert row["max_err"] <= 1e-6 * max(1.0, row["scale"]), (rank, row)


@pytest.mark.slow  # real gloo ranks
@pytest.mark.timeout(200)
def test_error_feedback_invariant_every_step(results):
    _, per_rank = results
    for rank, res in enumerate(per_rank):
        for row in res["sparse"]:
            assert row["ef_exact"], (rank, row["case"])
            assert row["residual_matches"], (rank, row["case"])
            gain, expected = row["gain"]
            assert gain == pytest.approx(expected, rel=1e-4), (rank, row["case"])


@pytest.mark.slow  # real gloo ranks
@pytest.mark.timeout(200)
def test_ar_topk_roots_star_round_robin_and_var_largest_variance(results):
    world, per_rank = results
    seen_var_roots = set()
    for res in per_rank:
        for row in res["sparse"]:
            got, expected = row["roots"]
            assert got == expected, row["case"]
            if row["case"][1] == "var":
                seen_var_roots.update(got)
    # The hot rank moves every step, so VAR must not be stuck on one root.
    assert len(seen_var_roots) >= min(world, 3)


@pytest.mark.slow  # real gloo ranks
@pytest.mark.timeout(200)
def test_dense_and_bf16_average_over_ring_and_tree(results):
    _, per_rank = results
    for res in per_rank:
        for option, (err, bound, bytes_sent) in res["dense"].items():
            assert err < bound, option
            assert bytes_sent == 5_000 * (2 if option.startswith("bf16") else 4), option


@pytest.mark.slow  # real gloo ranks
@pytest.mark.timeout(200)
def test_powersgd_computes_what_pytorchs_hook_does(results):
    _, per_rank = results
    for res in per_rank:
        assert max(res["powersgd"]) < 1e-4, res["powersgd"]


@pytest.mark.slow  # real gloo ranks
@pytest.mark.timeout(200)
def test_switching_families_loses_no_residual_mass(results):
    world, per_rank = results
    fed = sum(res["families"]["fed"] for res in per_rank)
    left = sum(res["families"]["left"] for res in per_rank)
    carried = per_rank[0]["families"]["carried"]
    assert all(torch.equal(carried, res["families"]["carried"]) for res in per_rank)  # every rank agrees
    assert float((carried * world + left - fed).abs().max()) < 1e-4 * float(fed.abs().max())
    # The lossy steps did leave something behind, and the final dense step sent it.
    norms = per_rank[0]["families"]["residual_norms"]
    assert min(norms[:-1]) > 0 and norms[-1] == 0


@pytest.mark.slow  # real gloo ranks
@pytest.mark.timeout(200)
def test_values_go_at_the_buckets_width_and_indices_at_four_bytes(results):
    from flexcomm.client.selection import k_for

    _, per_rank = results
    k = k_for(sum(s.numel() for s in SHAPES), 0.05)
    for rank, res in enumerate(per_rank):
        widths = res["widths"]
        for family, collective in [(f, c) for f, _, c, _ in WIDTH_OPTIONS]:
            fp32, same_dtype = widths[("torch.float32", family, collective)]
            assert same_dtype
            for half in ("torch.bfloat16", "torch.float16"):
                got, same_dtype = widths[(half, family, collective)]
                assert same_dtype, (half, family, collective)
                if family == "bf16":  # bf16 on the wire whatever the bucket holds
                    assert got == fp32
                elif family == "topk":  # 2-byte values; the sender's int32 indices (AR-Topk: the root's only)
                    sends_indices = collective == "ag_topk" or rank == 0
                    assert (fp32, got) == (k * (4 + 4 * sends_indices), k * (2 + 4 * sends_indices))
                else:
                    assert got * 2 == fp32, (half, family, collective)


def test_callbacks_count_as_released_once_the_thread_that_ran_them_let_go():
    # Here the main thread completes the future, so it runs and lets go of the
    # callback at once; on gloo its worker thread does, later (test_hook's close).
    from flexcomm.client.collectives import callbacks_released, chain

    fut = torch.futures.Future()
    ran = []
    chained = chain(fut, lambda f: ran.append(f.value()))
    assert not callbacks_released(timeout_s=0.05)  # held by a future not yet complete
    fut.set_result(3)
    chained.wait()
    assert ran == [3] and callbacks_released(timeout_s=0.05)
