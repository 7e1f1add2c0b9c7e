"""flexcomm.store: the daemon's memory, one SQLite database (through sqlite-utils).

The agent, `flexcomm probe`, `flexcomm emulate` and the lab all read and write it.
The schema lives in `flexcomm.store.schema` alone (a `schema_version` table and
forward migrations); the records in `flexcomm.store.records`.

    from flexcomm.store import Store, Measurement
    with Store(path) as store:              # creates or migrates; refuses a newer schema
        store.add_measurement(Measurement(peer="10.0.0.2", kind="bandwidth",
                                          bandwidth_bps=9.6e7, alpha_s=2e-4,
                                          beta_s_per_byte=8.3e-8))
        store.latest_measurements("10.0.0.2")     # newest row of each kind
        store.measurements(peer=..., kind=..., since=..., limit=...)
        store.add_decision(job_id, decision)      # a policy.types.Decision
        store.decisions(job_id)
        store.add_step_reports(job_id, reports)   # StepReports -> aggregated rows
        store.step_reports(job_id)
        store.add_emulation_step(EmulationStep(interface="veth0", step_index=3, ...))
        store.add_job(job_id, spec_dict); store.job(job_id); store.jobs(running=True)
        store.end_job(job_id, "ended")            # the row and its history stay
        store.save_policy_state(job_id, state_dict)   # atomic replace
        store.load_policy_state(job_id)               # -> dict | None
        store.history("decisions", job_id=..., since=..., limit=...)  # plain dicts
        store.prune(older_than_s)                     # retention of time series
        with store.transaction(): ...                 # several writes, all or none
        store.check()                                 # StoreDamaged if the file is damaged

Timestamps: every `add_*` takes the record's `ts` (or a `ts=` argument) when the
caller has one, else stamps it with the store's one clock, `now()` (a Store can be
given another clock for tests). Reads return newest first.

Durability: WAL journal, synchronous=FULL, every `add_*`/`save_*` one transaction
(a batch of step reports included): a process killed mid-write leaves every
committed row and none of the uncommitted ones. A Store is safe to share between
threads (one connection behind a lock) and between processes (busy timeout).

Errors are ValueErrors naming the field: `db:` for a missing store (create=False),
a directory, a read-only file system, a schema newer than this flexcomm
(`SchemaVersionError`, names both versions; the file is not touched), and a
damaged file (`StoreDamaged`: not SQLite, malformed pages, missing tables,
undecodable job or policy-state rows; `check()` reads the whole file for it).
"""

from flexcomm.store.damage import StoreDamaged
from flexcomm.store.records import (
    BANDWIDTH,
    LATENCY,
    LOOK,
    MEASUREMENT_KINDS,
    PASSIVE,
    TEST_KINDS,
    DecisionRecord,
    EmulationStep,
    JobRecord,
    Measurement,
    StepAggregate,
    aggregate_steps,
)
from flexcomm.store.schema import LATEST_VERSION, SchemaVersionError
from flexcomm.store.store import Store, default_path, now

__all__ = [
    "BANDWIDTH",
    "LATENCY",
    "LATEST_VERSION",
    "LOOK",
    "MEASUREMENT_KINDS",
    "PASSIVE",
    "TEST_KINDS",
    "DecisionRecord",
    "EmulationStep",
    "JobRecord",
    "Measurement",
    "SchemaVersionError",
    "StepAggregate",
    "Store",
    "StoreDamaged",
    "aggregate_steps",
    "default_path",
    "now",
]
