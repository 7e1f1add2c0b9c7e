"""The vocabulary every part shares: compressor families, collectives,
observations, step reports and decisions. Plain frozen dataclasses with
validation; `to_dict`/`from_dict` give the JSON/proto/store form. Nothing here
does I/O or reads a clock.

What a step runs is a compression (a family and its parameter) over a collective:

| family     | parameter           | text form    | collectives                 |
|------------|---------------------|--------------|-----------------------------|
| `dense`    | none                | `dense`      | dense_ring, dense_tree (ps) |
| `bf16`     | none                | `bf16`       | dense_ring, dense_tree      |
| `powersgd` | rank r (1..1024)    | `powersgd:4` | dense_ring                  |
| `topk`     | CR k/M in (0, 1)    | `topk:0.01`  | ag_topk, art_ring, art_tree |

`dense` sends the gradient's own values; `bf16` sends them as bfloat16 (2 bytes a
value); `powersgd` sends rank-r factors P and Q of each matrix (and the rest
dense) in all-reduces; `topk` sends the k largest values with their indices. The
lossy families (powersgd, topk) share one error-feedback residual. A full choice
reads `topk:0.01@ag_topk` (a `Choice`).
"""

from __future__ import annotations

import functools
import math
import types
import typing
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field, fields
from functools import cached_property
from typing import Any, Protocol

# Collectives: the API, CLI, JSON and store use these names.
PS = "ps"
DENSE_RING = "dense_ring"
DENSE_TREE = "dense_tree"
AG_TOPK = "ag_topk"
ART_RING = "art_ring"
ART_TREE = "art_tree"
COLLECTIVES: tuple[str, ...] = (PS, DENSE_RING, DENSE_TREE, AG_TOPK, ART_RING, ART_TREE)
DENSE_COLLECTIVES = frozenset({PS, DENSE_RING, DENSE_TREE})
SPARSE_COLLECTIVES = frozenset({AG_TOPK, ART_RING, ART_TREE})
# What the training client can actually run (the parameter server is model-only).
RUNNABLE_COLLECTIVES: tuple[str, ...] = (DENSE_RING, DENSE_TREE, AG_TOPK, ART_RING, ART_TREE)

# Compressor families.
DENSE = "dense"
BF16 = "bf16"
POWERSGD = "powersgd"
TOPK = "topk"
FAMILIES: tuple[str, ...] = (DENSE, BF16, POWERSGD, TOPK)
LOSSY_FAMILIES = frozenset({POWERSGD, TOPK})  # these keep an error-feedback residual
FAMILY_COLLECTIVES: dict[str, tuple[str, ...]] = {
    DENSE: (PS, DENSE_RING, DENSE_TREE),
    BF16: (DENSE_RING, DENSE_TREE),
    POWERSGD: (DENSE_RING,),
    TOPK: (AG_TOPK, ART_RING, ART_TREE),
}
MAX_RANK = 1024

# AR-Topk root selection: round-robin (STAR-Topk) or largest variance (VAR-Topk).
ROOT_STAR = "star"
ROOT_VAR = "var"
ROOT_SELECTIONS: tuple[str, ...] = (ROOT_STAR, ROOT_VAR)
MAX_PROBES = 64
MAX_EXACT_INT = 1 << 53  # whole numbers a double (and JSON) holds exactly: versions, steps


def check_collective(name: str, field_name: str = "collective") -> str:
    if name not in COLLECTIVES:
        raise ValueError(f"{field_name}: unknown collective {name!r} (one of {', '.join(COLLECTIVES)})")
    return name


def check_root(name: str, field_name: str = "root") -> str:
    if name not in ROOT_SELECTIONS:
        raise ValueError(f"{field_name}: unknown root selection {name!r} (one of star, var)")
    return name


def check_cr(cr: float, field_name: str = "cr") -> float:
    """A compression ratio k/M must lie in (0, 1]; 1 means dense."""
    try:
        v = float(cr)
    except (TypeError, ValueError):
        raise ValueError(f"{field_name}: expected a number, got {cr!r}") from None
    if math.isnan(v) or not (0.0 < v <= 1.0):
        raise ValueError(f"{field_name}: compression ratio must be in (0, 1], got {cr!r}")
    return v


def check_family(name: str, field_name: str = "family") -> str:
    if name not in FAMILIES:
        raise ValueError(f"{field_name}: unknown compressor family {name!r} (one of {', '.join(FAMILIES)})")
    return name


def check_param(family: str, param: float, field_name: str = "param") -> float:
    """A family's parameter: 0 for dense and bf16, a whole rank in 1..MAX_RANK for
    powersgd, a CR in (0, 1) for topk."""
    if isinstance(param, bool) or not isinstance(param, (int, float)) or not math.isfinite(param):
        raise ValueError(f"{field_name}: expected a finite number, got {param!r}")
    if family == POWERSGD:
        if param != int(param) or not 1 <= param <= MAX_RANK:
            raise ValueError(f"{field_name}: a PowerSGD rank must be a whole number in 1..{MAX_RANK}, got {param!r}")
    elif family == TOPK:
        if check_cr(param, field_name) == 1.0:
            raise ValueError(f"{field_name}: a Top-k CR must be < 1 (1 is dense)")
    elif param != 0:
        raise ValueError(f"{field_name}: {family} takes no parameter, got {param!r}")
    return float(param)


def check_pairing(family: str, collective: str, field_name: str = "collective") -> str:
    """`collective` exists and can carry `family`."""
    check_collective(collective, field_name)
    if collective not in FAMILY_COLLECTIVES[family]:
        raise ValueError(f"{field_name}: {family} runs over {', '.join(FAMILY_COLLECTIVES[family])}, "
                         f"not {collective!r}")
    return collective


def plain_fields(obj: Any) -> dict[str, Any]:
    """A dataclass's fields as a dict, each list or dict among them copied one
    level (their items are numbers and text). `asdict`'s deep copy took most of
    the ~0.4 ms an agent spent on its event loop saving one MOO job's state."""
    return {f.name: _copied(getattr(obj, f.name)) for f in fields(obj)}


def _copied(value: Any) -> Any:
    if isinstance(value, list):
        return list(value)
    if isinstance(value, dict):
        return dict(value)
    return value


@dataclass(frozen=True, order=True)
class Compression:
    """A compressor family and its parameter (see the module docstring)."""

    family: str
    param: float = 0.0

    def __post_init__(self) -> None:
        check_family(self.family)
        object.__setattr__(self, "param", check_param(self.family, self.param))

    @cached_property
    def name(self) -> str:
        """The text form: dense, bf16, powersgd:4, topk:0.01 (kept: a policy reads it per candidate)."""
        if self.family == POWERSGD:
            return f"{POWERSGD}:{int(self.param)}"
        if self.family == TOPK:
            return f"{TOPK}:{self.param!r}"
        return self.family

    @property
    def lossy(self) -> bool:
        return self.family in LOSSY_FAMILIES

    @property
    def rank(self) -> int:
        return int(self.param) if self.family == POWERSGD else 0

    @property
    def cr(self) -> float:
        """The share of values Top-k keeps (1 for every other family)."""
        return self.param if self.family == TOPK else 1.0

    @classmethod
    def parse(cls, text: str, field_name: str = "compression") -> Compression:
        """The compression a text form names ("topk:0.01", "powersgd:2", "bf16")."""
        if not isinstance(text, str):
            raise ValueError(f"{field_name}: expected text such as topk:0.01 or powersgd:2, got {text!r}")
        known = _PARSED.get(text)
        if known is not None:
            return known
        parsed = cls._parse(text, field_name)
        if len(_PARSED) < MAX_PARSED:
            _PARSED[text] = parsed
        return parsed

    @classmethod
    def _parse(cls, text: str, field_name: str) -> Compression:
        family, sep, value = text.strip().partition(":")
        check_family(family, field_name)
        if not sep:
            if family in LOSSY_FAMILIES:
                raise ValueError(f"{field_name}: {family} needs its parameter ({family}:N), got {text!r}")
            return cls(family)
        if family not in LOSSY_FAMILIES:
            raise ValueError(f"{field_name}: {family} takes no parameter, got {text!r}")
        try:
            param = float(value)
        except ValueError:
            raise ValueError(f"{field_name}: {value!r} is not a number in {text!r}") from None
        try:
            return cls(family, param)
        except ValueError as exc:
            raise ValueError(f"{field_name}: {text!r}: {str(exc).partition(': ')[2]}") from None


# Every step report names its probes' gains by text: each text is parsed once (the
# agent's ingest spent a fifth of its time parsing the same few names).
MAX_PARSED = 1024
_PARSED: dict[str, Compression] = {}

DENSE_FP32 = Compression(DENSE)


@dataclass(frozen=True, order=True)
class Choice:
    """What a step runs: a compression over a collective that can carry it. The
    text form is `topk:0.01@ag_topk`. Decisions, step reports and step statistics
    name theirs by `.choice`; their flat family/param/collective fields are the
    wire and store form."""

    compression: Compression
    collective: str

    def __post_init__(self) -> None:
        if not isinstance(self.compression, Compression):
            raise ValueError(f"compression: expected a Compression, got {self.compression!r}")
        check_pairing(self.compression.family, self.collective)

    @classmethod
    def of(cls, family: str, param: float, collective: str) -> Choice:
        return cls(Compression(family, param), collective)

    @classmethod
    def parse(cls, text: str, field_name: str = "choice") -> Choice:
        """The choice a text form names ("topk:0.01@ag_topk", "bf16@dense_ring")."""
        if not isinstance(text, str) or "@" not in text:
            raise ValueError(f"{field_name}: expected compression@collective such as topk:0.01@ag_topk, "
                             f"got {text!r}")
        compression, _, collective = text.strip().rpartition("@")
        c = Compression.parse(compression, field_name)
        check_pairing(c.family, collective, field_name)
        return cls(c, collective)

    @cached_property
    def label(self) -> str:
        """The text form: topk:0.01@ag_topk."""
        return f"{self.compression.name}@{self.collective}"

    @property
    def lossless(self) -> bool:
        return not self.compression.lossy


@functools.lru_cache(maxsize=1024)
def _choice(family: str, param: float, collective: str) -> Choice:
    """One Choice per (family, param, collective) seen: every report and decision
    names one of a few, and building each anew cost the agent's ingest a tenth."""
    return Choice.of(family, param, collective)


MAX_LAYOUT_MATRICES = 1 << 16
MAX_VALUES = 1 << 40


@dataclass(frozen=True)
class GradientLayout:
    """The gradient as the cost model needs it: `matrices` (rows, cols) are its
    tensors of two or more dimensions viewed as shape[0] x the rest (how PowerSGD
    sees them), `vector_values` the values of its 1-D tensors, `value_bytes` the
    bytes of one value (4 for fp32, 2 for bf16/fp16)."""

    matrices: tuple[tuple[int, int], ...] = ()
    vector_values: int = 0
    value_bytes: int = 4

    def __post_init__(self) -> None:
        if len(self.matrices) > MAX_LAYOUT_MATRICES:
            raise ValueError(f"layout.matrices: at most {MAX_LAYOUT_MATRICES}, got {len(self.matrices)}")
        shapes = []
        for i, shape in enumerate(self.matrices):
            if len(shape) != 2 or not all(_whole(v) and v >= 1 for v in shape):
                raise ValueError(f"layout.matrices[{i}]: expected (rows, cols) >= 1, got {shape!r}")
            shapes.append((int(shape[0]), int(shape[1])))
        object.__setattr__(self, "matrices", tuple(shapes))
        if not _whole(self.vector_values) or self.vector_values < 0:
            raise ValueError(f"layout.vector_values: must be a whole number >= 0, got {self.vector_values!r}")
        if self.value_bytes not in (1, 2, 4, 8):
            raise ValueError(f"layout.value_bytes: must be 1, 2, 4 or 8, got {self.value_bytes!r}")
        if not 0 < self.values <= MAX_VALUES:
            raise ValueError(f"layout: must hold 1..{MAX_VALUES} values, got {self.values}")

    @cached_property
    def values(self) -> int:
        return sum(r * c for r, c in self.matrices) + int(self.vector_values)

    @property
    def grad_bytes(self) -> int:
        return self.values * self.value_bytes

    @classmethod
    def flat(cls, grad_bytes: float, value_bytes: int = 4) -> GradientLayout:
        """What is known from a byte count alone: one vector (PowerSGD finds
        nothing to compress in it)."""
        return cls((), max(1, math.ceil(grad_bytes / value_bytes)), value_bytes)

    @classmethod
    def of_shapes(cls, shapes: Sequence[Sequence[int]], value_bytes: int = 4) -> GradientLayout:
        """From the shapes of a model's gradients (a 4-D conv weight is out x rest)."""
        matrices, vectors = [], 0
        for shape in shapes:
            numel = math.prod(shape)
            if len(shape) >= 2 and numel:
                matrices.append((int(shape[0]), numel // int(shape[0])))
            else:
                vectors += numel
        return cls(tuple(matrices), vectors, value_bytes)

    def to_dict(self) -> dict[str, Any]:
        return {"matrices": [list(m) for m in self.matrices], "vector_values": self.vector_values,
                "value_bytes": self.value_bytes}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> GradientLayout:
        return cls(tuple(tuple(m) for m in d.get("matrices") or ()), int(d.get("vector_values", 0)),
                   int(d.get("value_bytes", 4)))


def _whole(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def check_known_options(options: Mapping[str, Any], config: type, what: str) -> None:
    """Refuse option names that are not fields of the dataclass `config`."""
    known = {f.name for f in fields(config)}
    unknown = sorted(set(options) - known)
    if unknown:
        raise ValueError(f"{unknown[0]}: unknown {what} option (known: {', '.join(sorted(known))})")


def check_options(options: Mapping[str, Any], config: type, what: str) -> dict[str, Any]:
    """Plain option values (from an RPC, the CLI or TOML) checked against the
    fields of the dataclass `config` by their annotated types, each error naming
    the option: unknown names are refused, a bool is not a number, a string is
    not a number, a tuple takes a list (or, of strings, "a,b"). Returns the values
    as the fields hold them (lists as tuples, whole numbers as floats where a
    float is wanted); ranges are the dataclass's own to check."""
    if not isinstance(options, Mapping):
        raise ValueError(f"options: expected a table of {what} options, got {options!r:.80}")
    check_known_options(options, config, what)
    kinds = typing.get_type_hints(config)
    return {name: _as_kind(name, kinds[name], value) for name, value in options.items()}


def _as_kind(name: str, kind: Any, value: Any) -> Any:
    if kind is Any:
        return value
    origin, args = typing.get_origin(kind), typing.get_args(kind)
    if origin in (typing.Union, types.UnionType):
        return _as_union(name, args, value)
    if origin is typing.Literal:
        if value not in args:
            raise ValueError(f"{name}: must be one of {', '.join(map(repr, args))}, got {value!r:.80}")
        return value
    if origin in (tuple, list):
        return _as_sequence(name, origin, args, value)
    if origin in (dict, Mapping):
        if not isinstance(value, Mapping):
            raise ValueError(f"{name}: expected a table, got {value!r:.80}")
        key_kind, value_kind = args or (Any, Any)
        return {_as_kind(f"{name} (key)", key_kind, k): _as_kind(f"{name}.{k}", value_kind, v)
                for k, v in value.items()}
    return _as_scalar(name, kind, value)


def _as_scalar(name: str, kind: Any, value: Any) -> Any:
    if kind is bool:
        if not isinstance(value, bool):
            raise ValueError(f"{name}: expected true or false, got {value!r:.80}")
        return value
    if kind is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise ValueError(f"{name}: expected a whole number, got {value!r:.80}")
        return value
    if kind is float:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ValueError(f"{name}: expected a number, got {value!r:.80}")
        try:
            return float(value)
        except OverflowError:
            raise ValueError(f"{name}: a whole number of {len(str(value))} digits is out of range") from None
    if kind is str:
        if not isinstance(value, str):
            raise ValueError(f"{name}: expected a string, got {value!r:.80}")
        return value
    if isinstance(kind, type) and not isinstance(value, kind):
        raise ValueError(f"{name}: expected {kind.__name__}, got {value!r:.80}")
    return value


def _as_union(name: str, arms: tuple[Any, ...], value: Any) -> Any:
    if value is None and type(None) in arms:
        return None
    errors = []
    for arm in arms:
        if arm is type(None):
            continue
        try:
            return _as_kind(name, arm, value)
        except ValueError as exc:
            errors.append(str(exc))
    raise ValueError(errors[0] if len(errors) == 1 else f"{name}: unexpected value {value!r:.80}")


def _as_sequence(name: str, origin: type, args: tuple[Any, ...], value: Any) -> Any:
    """tuple[X, ...] and list[X] take any length; tuple[X, Y] exactly two."""
    homogeneous = origin is list or not args or (len(args) == 2 and args[1] is Ellipsis)
    if isinstance(value, str) and args and args[0] is str and homogeneous:
        value = [part.strip() for part in value.split(",")] if value else []
    elif homogeneous and args and args[0] in (int, float) and isinstance(value, (int, float)):
        value = [value]  # one number where a list of them goes (a lab spec's moo:ranks=4)
    if not isinstance(value, (list, tuple)):
        raise ValueError(f"{name}: expected a list, got {value!r:.80}")
    if not homogeneous and len(value) != len(args):
        raise ValueError(f"{name}: expected {len(args)} values, got {len(value)}")
    kinds = [args[0] if args else Any] * len(value) if homogeneous else list(args)
    return origin(_as_kind(f"{name}[{i}]", kind, v) for i, (kind, v) in enumerate(zip(kinds, value, strict=True)))


def check_range(name: str, v: float, lo: float, hi: float, *, open_low: bool = False) -> float:
    """`v` as given if it is a finite number in [lo, hi] ((lo, hi] with open_low)."""
    ok = (isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)
          and (lo < v if open_low else lo <= v) and v <= hi)
    if not ok:
        raise ValueError(f"{name}: must be in {'(' if open_low else '['}{lo}, {hi}], got {v!r}")
    return v


def check_count(name: str, v: Any) -> int:
    """`v` as given if it is a whole number >= 0."""
    if not _whole(v) or v < 0:
        raise ValueError(f"{name}: must be a whole number >= 0, got {v!r}")
    return v


def _finite(field_name: str, v: float, *, positive: bool = False) -> float:
    v = float(v)
    if math.isnan(v) or math.isinf(v) or v < 0 or (positive and v == 0):
        bound = "> 0" if positive else ">= 0"
        raise ValueError(f"{field_name}: must be finite and {bound}, got {v!r}")
    return v


MAX_PEAK_OVER_RATE = 16.0
MAX_BURST_S = 10.0


@dataclass(frozen=True)
class LinkBucket:
    """What a token-bucket shaped or policed link sends above its sustained rate r
    (RFC 2212's peak rate p and bucket depth b): after idle it runs at
    `peak_over_rate` * r until `burst_s` * r bytes of credit are spent, then at r.
    Cloud NICs and the lab's HTB links are such links. (1, 0) is a plain link.
    """

    peak_over_rate: float = 1.0
    burst_s: float = 0.0

    def __post_init__(self) -> None:
        check_range("peak_over_rate", self.peak_over_rate, 1.0, MAX_PEAK_OVER_RATE)
        check_range("burst_s", self.burst_s, 0.0, MAX_BURST_S)

    @classmethod
    def checked(cls, peak_over_rate: float, burst_s: float,
                names: tuple[str, str] = ("peak_over_rate", "burst_s")) -> LinkBucket:
        """A bucket from a user's settings, each error naming the setting (`names`).
        Half a bucket (a peak without credit, or credit without a peak) is refused:
        it would model a plain link, which is not what whoever set one half meant."""
        peak_name, burst_name = names
        check_range(peak_name, peak_over_rate, 1.0, MAX_PEAK_OVER_RATE)
        check_range(burst_name, burst_s, 0.0, MAX_BURST_S)
        if (peak_over_rate > 1.0) != (burst_s > 0.0):
            missing, given = (burst_name, peak_name) if peak_over_rate > 1.0 else (peak_name, burst_name)
            raise ValueError(f"{missing}: needed with {given} (a token bucket has both; "
                             "leave both out for a plain link)")
        return cls(peak_over_rate, burst_s)

    @property
    def plain(self) -> bool:
        return self.peak_over_rate == 1.0 or self.burst_s == 0.0

    @property
    def peak_s(self) -> float:
        """How long a backlog sent at the peak takes to spend a full bucket
        (infinite on a plain link, which has none to spend)."""
        return math.inf if self.plain else self.burst_s / (self.peak_over_rate - 1.0)

    def seconds(self, at_rate_s: float) -> float:
        """Time to send what takes `at_rate_s` at the rate, starting with a full
        bucket: at the peak while credit lasts, at the rate after it."""
        if self.plain:
            return at_rate_s
        return max(at_rate_s / self.peak_over_rate, at_rate_s - self.burst_s)

    def at_rate_s(self, seconds: float) -> float:
        """The inverse of `seconds`: how long at the rate what took `seconds` sends."""
        if self.plain:
            return seconds
        return min(seconds * self.peak_over_rate, seconds + self.burst_s)


PLAIN_LINK = LinkBucket()


@dataclass(frozen=True)
class NetworkObservation:
    """The network as the policy sees it: the bottleneck among the job's nodes.

    alpha_s: per-message latency in seconds. beta_s_per_byte: seconds per byte
    (1 / bandwidth in bytes/s) at the sustained rate. nodes: number of workers N.
    bucket: the links' allowance above that rate (plain unless configured);
    a mapping is taken as its fields (the `to_dict` form). evidence: what the
    figures last moved on (e.g. "sync", "probe"), for people. lower_bound: the
    bandwidth is only known to be at least this (the syncs it came from spent
    little of their time on their bytes). age_s: seconds since the bandwidth was
    last confirmed (by a sync its bytes explain or a probe). moves: how many
    moves of the bandwidth the estimator behind this figure has detected (the one
    detector of a moved network: a figure whose count is unchanged is the same
    link, refined); None for a figure no estimator judged (a user's, a probe's).
    """

    alpha_s: float
    beta_s_per_byte: float
    nodes: int
    bucket: LinkBucket = PLAIN_LINK
    evidence: str = ""
    lower_bound: bool = False
    age_s: float = 0.0
    moves: int | None = None

    def __post_init__(self) -> None:
        _finite("alpha_s", self.alpha_s)
        _finite("beta_s_per_byte", self.beta_s_per_byte, positive=True)
        if not isinstance(self.nodes, int) or self.nodes < 2:
            raise ValueError(f"nodes: need at least 2 workers, got {self.nodes!r}")
        if isinstance(self.bucket, Mapping):
            object.__setattr__(self, "bucket", LinkBucket(**self.bucket))
        elif not isinstance(self.bucket, LinkBucket):
            raise ValueError(f"bucket: expected a LinkBucket, got {self.bucket!r}")
        if not isinstance(self.evidence, str):
            raise ValueError(f"evidence: expected a string, got {self.evidence!r}")
        if not isinstance(self.lower_bound, bool):
            raise ValueError(f"lower_bound: expected a bool, got {self.lower_bound!r}")
        _finite("age_s", self.age_s)
        if self.moves is not None:
            check_count("moves", self.moves)

    @property
    def bandwidth_bps(self) -> float:
        """Bandwidth in bits per second."""
        return 8.0 / self.beta_s_per_byte

    @classmethod
    def from_link(cls, latency_s: float, bandwidth_bps: float, nodes: int,
                  bucket: LinkBucket = PLAIN_LINK) -> NetworkObservation:
        bw = _finite("bandwidth", bandwidth_bps, positive=True)
        return cls(alpha_s=_finite("latency", latency_s), beta_s_per_byte=8.0 / bw, nodes=nodes,
                   bucket=bucket)

    def to_dict(self) -> dict[str, Any]:
        d = plain_fields(self)
        d["bucket"] = plain_fields(self.bucket)
        return d


def _check_gains(gains: Mapping[str, float], field_name: str = "gains") -> dict[str, float]:
    """Gains keyed by a lossy compression's text form, each in [0, 1]."""
    if len(gains) > MAX_PROBES:
        raise ValueError(f"{field_name}: at most {MAX_PROBES} entries, got {len(gains)}")
    out = {}
    for name, g in gains.items():
        c = Compression.parse(name, field_name)
        if not c.lossy:
            raise ValueError(f"{field_name}: {name!r} loses nothing; gains are for powersgd and topk")
        if isinstance(g, bool) or not isinstance(g, (int, float)) or not 0.0 <= g <= 1.0 + 1e-6:
            raise ValueError(f"{field_name}: gain for {name} must be in [0, 1], got {g!r}")
        out[c.name] = min(1.0, float(g))
    return out


@dataclass(frozen=True)
class StepReport:
    """What one training step measured, as the client reports it.

    The step ran `family`/`param` over `collective`. gain is the share of the
    compensated gradient's squared norm the step sent (1 for dense and bf16).
    gains maps a lossy compression's text form ("topk:0.01", "powersgd:2") to the
    gain it would have had on this step's gradient (read off one gradient).
    t_compute_s is forward + backward time, when known (else 0). ended_unix: when
    the step ended, in seconds since the epoch on the reporting host's clock
    (0 when unknown). grad_norm: the L2 norm of the reporting rank's own
    gradient before any residual joined it, read on the steps that read gains (0
    when not read): the critical-regime signal (policy.regime). disturbed: the
    step overlapped a bandwidth test of the job's paths (set by the agent, never
    sent by a client): its times say nothing of the path or the option.
    """

    step: int
    family: str
    param: float
    collective: str
    t_comp_s: float
    t_sync_s: float
    gain: float
    bytes_sent: int = 0
    epoch: int = 0
    t_compute_s: float = 0.0
    gains: Mapping[str, float] = field(default_factory=dict)
    ended_unix: float = 0.0
    grad_norm: float = 0.0
    disturbed: bool = False

    def __post_init__(self) -> None:
        if self.step < 0:
            raise ValueError(f"step: must be >= 0, got {self.step!r}")
        if self.epoch < 0:
            raise ValueError(f"epoch: must be >= 0, got {self.epoch!r}")
        check_family(self.family)
        object.__setattr__(self, "param", check_param(self.family, self.param))
        check_pairing(self.family, self.collective)
        _finite("t_comp_s", self.t_comp_s)
        _finite("t_sync_s", self.t_sync_s)
        _finite("t_compute_s", self.t_compute_s)
        _finite("ended_unix", self.ended_unix)
        _finite("grad_norm", self.grad_norm)
        gain = _finite("gain", self.gain)
        if gain > 1.0 + 1e-6:
            raise ValueError(f"gain: must be in [0, 1], got {self.gain!r}")
        if self.bytes_sent < 0:
            raise ValueError(f"bytes_sent: must be >= 0, got {self.bytes_sent!r}")
        object.__setattr__(self, "gains", _check_gains(self.gains))

    @property
    def compression(self) -> Compression:
        return self.choice.compression

    @property
    def step_s(self) -> float:
        """The step's time as reported: compute, compression and sync."""
        return self.t_compute_s + self.t_comp_s + self.t_sync_s

    @cached_property
    def choice(self) -> Choice:
        return _choice(self.family, self.param, self.collective)

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["gains"] = dict(self.gains)
        return d

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> StepReport:
        return cls(**d)


@dataclass(frozen=True)
class Decision:
    """What every rank runs from the step it is adopted on: `family`/`param` over
    `collective` (AR-Topk roots chosen by `root`).

    version increases by one each time the decision changes, so ranks and
    clients can tell a new decision from a repeated one. probes are the lossy
    compressions (text forms) whose gains the policy wants in the step reports.
    The predicted_* fields are the cost model's figures for the chosen option (0
    when unknown), model_forms says which formula variants produced them,
    exploring says the policy runs it to measure it, and reason is for people.
    """

    family: str
    param: float
    collective: str
    root: str = ROOT_STAR
    version: int = 0
    predicted_sync_s: float = 0.0
    predicted_comp_s: float = 0.0
    reason: str = ""
    probes: tuple[str, ...] = ()
    model_forms: str = ""
    exploring: bool = False

    def __post_init__(self) -> None:
        check_family(self.family)
        object.__setattr__(self, "param", check_param(self.family, self.param))
        check_pairing(self.family, self.collective)
        check_root(self.root)
        # Ranks carry the version as a float64 in the agreement collective.
        if not _whole(self.version) or not (0 <= self.version < MAX_EXACT_INT):
            raise ValueError(f"version: must be a whole number in [0, 2^53), got {self.version!r}")
        # A bad probe would fail inside rank 0's backward pass and hang the others.
        if len(self.probes) > MAX_PROBES:
            raise ValueError(f"probes: at most {MAX_PROBES}, got {len(self.probes)}")
        probes = []
        for text in self.probes:
            c = Compression.parse(text, "probes")
            if not c.lossy:
                raise ValueError(f"probes: {text!r} loses nothing; probes are powersgd and topk")
            probes.append(c.name)
        object.__setattr__(self, "probes", tuple(probes))
        if not isinstance(self.exploring, bool):
            raise ValueError(f"exploring: must be true or false, got {self.exploring!r}")

    @classmethod
    def of(cls, choice: Choice, **kw: Any) -> Decision:
        return cls(choice.compression.family, choice.compression.param, choice.collective, **kw)

    @property
    def compression(self) -> Compression:
        return self.choice.compression

    @cached_property
    def choice(self) -> Choice:
        return _choice(self.family, self.param, self.collective)

    @property
    def label(self) -> str:
        """The choice as text: topk:0.01@ag_topk."""
        return self.choice.label

    def same_choice(self, other: Decision | None) -> bool:
        """True when `other` runs exactly the same thing (ignores reason/predictions)."""
        return other is not None and (self.choice, self.root) == (other.choice, other.root)

    def to_dict(self) -> dict[str, Any]:
        d = plain_fields(self)
        d["probes"] = list(self.probes)
        return d

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> Decision:
        d = dict(d)
        d["probes"] = tuple(d.get("probes") or ())
        return cls(**d)


DENSE_DECISION = Decision(DENSE, 0.0, DENSE_RING, reason="dense")


class Policy(Protocol):
    """What every policy offers. Implementations are deterministic: the same
    sequence of calls gives the same decisions (every rank's agreement rests on
    it). Observations are taken as they come, and the policy chooses when told
    to, once per batch (an agent: once per report message, however it slices
    the message): a choice evaluates every candidate, too dear for every report.
    `decide` only reads, so anyone may call it any number of times without
    moving the job.
    """

    name: str

    def observe_network(self, net: NetworkObservation) -> None:
        """The latest bottleneck alpha/beta for the job's nodes."""

    def observe_steps(self, reports: Sequence[StepReport]) -> None:
        """Steps' measurements in the order they ran (each ran `report.choice`)."""

    def choose(self) -> Decision:
        """Choose on what was observed since the last choice; return the decision
        now in force (the last one when nothing was observed)."""

    def decide(self) -> Decision:
        """The decision in force. Reads only."""

    def model_error(self) -> float | None:
        """The cost model's current relative error (Calibration.error), or None
        for a policy that predicts nothing."""

    def state_dict(self) -> dict[str, Any]:
        """Plain-data state (JSON-serialisable) to persist and restore."""

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Restore what `state_dict` returned."""
