"""Benchmark Top-k selection + packing + error feedback on a 25M-element fp32 gradient.

For CR 0.1, 0.01 and 0.001 it times the exact (torch.topk) and fast (sampled
threshold) pipelines: compensate (g_e = g + residual), select k indices (int32),
pack the values, settle the residual. Figures are ratios to one pass over the
tensor (`g.abs()`) and to `torch.topk` alone, plus the fast selector's share of
the exact top-k's squared mass. Goals: fast <= 4 passes, >= 4x faster than
torch.topk, >= 0.99 of the mass. The last printed line is one JSON object.

    .venv/bin/python bench/compress.py [--numel N] [--repeats R]
"""

from __future__ import annotations

import argparse
import json
import time

import torch

from flexcomm.client.compress import ErrorFeedback, k_for, make_selector

CRS = (0.1, 0.01, 0.001)


def best_time(fn, repeats: int) -> float:
    fn()
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return min(times)


def pipeline(g: torch.Tensor, ef: ErrorFeedback, select, k: int):
    def run() -> torch.Tensor:
        g_e = ef.compensate(g)
        idx = select(g_e, k)
        values = g_e[idx]
        ef.settle(idx)
        return values

    return run


def mass(g: torch.Tensor, idx: torch.Tensor) -> float:
    v = g[idx.long()].double()
    return float(torch.dot(v, v))


def bench_cr(g: torch.Tensor, cr: float, repeats: int, t_pass: float) -> dict:
    k = k_for(g.numel(), cr)
    t_topk = best_time(lambda: torch.topk(g.abs(), k, sorted=False), max(1, repeats // 2))
    row = {"cr": cr, "k": k, "t_pass_s": t_pass, "t_topk_s": t_topk}
    for name in ("exact", "fast"):
        select = make_selector(name)
        ef = ErrorFeedback(g.numel(), g.dtype)
        t = best_time(pipeline(g, ef, select, k), repeats if name == "fast" else max(1, repeats // 2))
        row[f"{name}_s"] = t
        row[f"{name}_passes"] = t / t_pass
        row[f"{name}_speedup_vs_topk"] = t_topk / t
    exact_idx = make_selector("exact")(g, k)
    fast = make_selector("fast", seed=1)
    row["fast_mass_share"] = mass(g, fast(g, k)) / mass(g, exact_idx)
    row["fast_fallbacks"] = fast.fallbacks
    return row


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--numel", type=int, default=25_000_000)
    ap.add_argument("--repeats", type=int, default=5)
    args = ap.parse_args()
    torch.manual_seed(0)
    g = torch.randn(args.numel)
    t_pass = best_time(lambda: g.abs(), args.repeats)
    detail = []
    for cr in CRS:
        row = bench_cr(g, cr, args.repeats, t_pass)
        detail.append(row)
        print(
            f"cr={cr:<6g} pass={t_pass * 1e3:6.1f}ms topk={row['t_topk_s'] * 1e3:7.1f}ms "
            f"exact={row['exact_s'] * 1e3:7.1f}ms ({row['exact_passes']:.2f} passes) "
            f"fast={row['fast_s'] * 1e3:7.1f}ms ({row['fast_passes']:.2f} passes, "
            f"{row['fast_speedup_vs_topk']:.1f}x vs topk, mass {row['fast_mass_share']:.4f})",
            flush=True,
        )
    print(json.dumps({
        "numel": args.numel,
        "threads": torch.get_num_threads(),
        "fast_passes_max": max(r["fast_passes"] for r in detail),
        "fast_speedup_vs_topk_min": min(r["fast_speedup_vs_topk"] for r in detail),
        "fast_mass_share_min": min(r["fast_mass_share"] for r in detail),
        "detail": detail,
    }))


if __name__ == "__main__":
    main()
