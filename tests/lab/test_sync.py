"""Every way the lab synchronises gradients trains the residual CNN, whose
convolution weights are 4-D, on 2 real gloo ranks through the trainer's own DDP
wrapping: PyTorch's DDP AllReduce, its bf16 and PowerSGD hooks (PowerSGD past its
dense start, at ranks 1, 2 and 4), and flexcomm's hook dense, at fixed Top-k CRs,
and under the MOO and GraVAC run in-process, and PyTorch's post-local SGD. Every
rank ends with the same finite model (post-local SGD: different ones, its last
step local), the model moved, and each method ran what it says it ran."""

from __future__ import annotations

import pytest
import torch

from flexcomm.lab.plan import ALL_POLICIES
from flexcomm.lab.sync import POWERSGD_START_ITER
from support.client_ranks import run_ranks

STEPS = POWERSGD_START_ITER + 2  # PowerSGD compresses from its 11th step on
METHODS = (*ALL_POLICIES, "allreduce")


def every_method(rank: int, world: int) -> dict:
    from flexcomm.lab.plan import parse_policy
    from flexcomm.lab.sync import attach_sync
    from flexcomm.lab.trainer import TrainConfig, wrap
    from flexcomm.lab.workload import (
        ShardLoader,
        WorkloadSpec,
        build_model,
        gradient_bytes,
        load_dataset,
        loss_of,
    )

    spec = WorkloadSpec(name="cnn")  # 1.2 MB: more than DDP's default first bucket
    data = load_dataset(spec)
    batches = ShardLoader(data, rank, world, batch=16, seed=0).epoch(0)[:STEPS]
    results = {}
    for label in METHODS:
        policy = parse_policy(label)
        model = build_model(spec, data.features, data.classes)
        before = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
        ddp = wrap(model)
        cfg = TrainConfig(policy=policy.kind, policy_options=policy.options, world=world,
                          master_addr="", master_port=0, records="",
                          hook_options={"control_interval": 2})
        sync = attach_sync(ddp, cfg, rank, gradient_bytes(model))
        optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
        probed = 0  # records that carry the probes' readings
        for step, (x, y) in enumerate(batches):
            optimizer.zero_grad(set_to_none=True)
            loss_of(ddp(x), y).backward()
            optimizer.step()
            last = sync.after_step(step, 0)
            probed += "gains" in last and last["t_probe_s"] > 0
        sync.close()
        after = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
        results[label] = {"params": after, "moved": float((after - before).norm()),
                          "last": {k: last.get(k) for k in ("compression", "cr", "collective",
                                                            "bytes_sent")},
                          "grad_bytes": gradient_bytes(model), "probed": probed}
    return results


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_every_baseline_and_policy_trains_4d_weights_alike_on_every_rank() -> None:
    ranks = run_ranks(2, "lab/test_sync.py:every_method", timeout=280)
    for label in METHODS:
        mine, theirs = ranks[0][label], ranks[1][label]
        if label == "localsgd":  # averaged after step 10 (its 11th), then a local step
            assert not torch.equal(mine["params"], theirs["params"]), "local SGD synchronised"
        else:
            assert torch.equal(mine["params"], theirs["params"]), f"{label}: ranks disagree"
        assert torch.isfinite(mine["params"]).all(), label
        assert mine["moved"] > 1e-3, label
    # rank 0 records what its probes read, for a replay of the policy; nothing reads them elsewhere
    assert ranks[0]["moo"]["probed"] > 0 and ranks[1]["moo"]["probed"] == ranks[0]["dense"]["probed"] == 0
    last = {label: r["last"] for label, r in ranks[0].items()}
    full = ranks[0]["dense"]["grad_bytes"]
    assert last["powersgd-1"]["collective"] == last["powersgd-4"]["collective"] == "powersgd"
    assert (last["powersgd-1"]["compression"], last["powersgd-4"]["compression"]) == (
        "powersgd:1", "powersgd:4")
    assert last["powersgd-1"]["bytes_sent"] < last["powersgd"]["bytes_sent"] \
        < last["powersgd-4"]["bytes_sent"] < full / 2
    assert last["localsgd"] == {"compression": "localsgd:4", "cr": 0.0, "collective": "local",
                                "bytes_sent": 0}
    assert last["bf16"] == {"compression": "bf16", "cr": 0.5, "collective": "bf16_allreduce",
                            "bytes_sent": full // 2}
    assert (last["topk-0.01"]["compression"], last["topk-0.01"]["collective"]) == (
        "topk:0.01", "ag_topk")
    assert last["dense"]["bytes_sent"] == full
