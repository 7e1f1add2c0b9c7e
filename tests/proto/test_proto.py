"""The API's generated code is current, importable without torch, and its enums
cover exactly the canonical names of flexcomm.policy.types."""

from __future__ import annotations

import re
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from flexcomm.policy.jobspec import JobSpec
from flexcomm.policy.types import COLLECTIVES, ROOT_SELECTIONS, Decision, StepReport
from flexcomm.proto import agent_pb2 as pb
from flexcomm.proto import convert

ROOT = Path(__file__).resolve().parents[2]


def test_generated_code_is_not_stale() -> None:
    out = subprocess.run(
        [sys.executable, str(ROOT / "proto" / "generate.py"), "--check"],
        capture_output=True, text=True, timeout=60,
    )
    assert out.returncode == 0, out.stdout + out.stderr


def _floor(requirements: list[str], package: str) -> tuple[int, ...]:
    for requirement in requirements:
        name, _, version = requirement.partition(">=")
        if name.strip() == package:
            return _version(version.split(",")[0])
    raise AssertionError(f"pyproject.toml declares no floor for {package}")


def _version(text: str) -> tuple[int, ...]:
    return tuple(int(part) for part in text.strip().split("."))


def test_declared_floors_are_what_the_generated_code_checks_at_import() -> None:
    # The generated modules refuse to import under an older grpcio or protobuf than
    # made them; an install that pip allowed must import.
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    generated = ROOT / "proto" / "flexcomm" / "v1"
    grpc_stamp = re.search(r"GRPC_GENERATED_VERSION = '([\d.]+)'", (generated / "agent_pb2_grpc.py").read_text())
    protobuf_stamp = re.search(r"Protobuf Python Version: ([\d.]+)", (generated / "agent_pb2.py").read_text())
    assert grpc_stamp and protobuf_stamp, "the generated code carries no version stamp"
    assert _floor(project["dependencies"], "grpcio") >= _version(grpc_stamp[1])
    assert _floor(project["dependencies"], "protobuf") >= _version(protobuf_stamp[1])
    for package in ("grpcio-health-checking", "grpcio-reflection"):
        assert _floor(project["optional-dependencies"]["agent"], package) >= _version(grpc_stamp[1])


def test_generated_code_imports_inside_flexcomm_proto_without_torch() -> None:
    code = (
        "import sys\n"
        "from flexcomm.proto import agent_pb2, agent_pb2_grpc\n"
        "assert agent_pb2.DESCRIPTOR.package == 'flexcomm.v1'\n"
        "assert hasattr(agent_pb2_grpc, 'AgentStub')\n"
        "assert 'torch' not in sys.modules, 'proto pulled in torch'\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr


def test_enums_match_the_canonical_names_one_to_one() -> None:
    values = {convert.collective_to_enum(c) for c in COLLECTIVES}
    assert len(values) == len(COLLECTIVES)
    assert set(pb.Collective.values()) - values == {pb.COLLECTIVE_UNSPECIFIED}
    for name in COLLECTIVES:
        assert convert.collective_from_enum(convert.collective_to_enum(name)) == name
    for name in ROOT_SELECTIONS:
        assert convert.root_from_enum(convert.root_to_enum(name)) == name


@pytest.mark.parametrize("value", [0, 7, 99, -1])
def test_unknown_or_unspecified_collective_names_the_field(value: int) -> None:
    with pytest.raises(ValueError, match=r"^collective: "):
        convert.collective_from_enum(value)


@pytest.mark.parametrize(("family", "param", "collective"), [
    ("topk", 0.01, "art_ring"), ("powersgd", 4, "dense_ring"), ("bf16", 0, "dense_tree"), ("dense", 0, "dense_ring"),
])
def test_decision_round_trip(family: str, param: float, collective: str) -> None:
    d = Decision(family, param, collective, root="var", version=7, predicted_sync_s=0.2, reason="why",
                 probes=("topk:0.1", "powersgd:2"), model_forms="paper", exploring=True)
    msg = convert.decision_to_proto(d, "j")
    assert (msg.family, msg.param) == (family, param)
    assert convert.decision_from_proto(msg) == d


def test_report_to_proto_keeps_every_field() -> None:
    r = StepReport(step=3, family="powersgd", param=2, collective="dense_ring", t_comp_s=0.01, t_sync_s=0.2,
                   gain=0.9, bytes_sent=100, epoch=1, t_compute_s=0.5, gains={"topk:0.1": 0.9, "powersgd:1": 0.5},
                   ended_unix=1.8e9)
    msg = convert.report_to_proto(r)
    assert (msg.step, msg.epoch, msg.bytes_sent, msg.family, msg.param) == (3, 1, 100, "powersgd", 2)
    assert msg.ended_unix == 1.8e9
    assert {g.compression: g.gain for g in msg.gains} == {"topk:0.1": 0.9, "powersgd:1": 0.5}
    assert convert.collective_from_enum(msg.collective) == "dense_ring"


def test_a_layout_round_trips_and_must_match_the_gradient() -> None:
    from flexcomm.policy.types import GradientLayout
    from flexcomm.proto import agent_pb2 as pb
    from flexcomm.proto import validate

    layout = GradientLayout(((64, 27), (10, 64)), 74, 4)
    spec = pb.JobSpec(job_id="j", world_size=2, grad_bytes=layout.grad_bytes, policy="moo")
    spec.layout.CopyFrom(convert.layout_to_proto(layout))
    assert validate.spec(spec).layout == layout
    assert JobSpec.from_dict(validate.spec(spec).to_dict()).layout == layout
    spec.grad_bytes += 4
    with pytest.raises(ValueError, match=r"^spec\.layout: "):
        validate.spec(spec)
    spec.layout.matrices.add(rows=0, cols=3)
    with pytest.raises(ValueError, match=r"^spec\.layout\.matrices\[2\]: "):
        validate.spec(spec)
