"""The daemon: open the store, resume the jobs, serve the API, and shut down
cleanly.

Start-up order (sd_notify READY=1 is sent only after all of it): the store is
opened and checked (a damaged one stops the agent, or is moved aside) and every
stored job resumed; the Unix socket is bound with its final
permissions (the umask is tightened around the bind, so there is no moment it
is open to others); TCP with TLS if configured; health and reflection; metrics.
While serving, the event loop writes step reports and state to the store every
`flush_interval_s`, after a decision changes and before a report stream is
acknowledged (one group commit, agent/commit.py), and pings the systemd
watchdog, so a stuck loop gets the agent restarted. SIGTERM or SIGINT:
STOPPING=1, health NOT_SERVING, streams get a short grace, a last flush, the
socket file is removed. A start that fails (a setting, a file, a port, a
damaged store) raises ValueError naming it: the CLI prints that one line and
exits 2.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import grp
import logging
import os
import signal
import time
from pathlib import Path

import grpc
from grpc_health.v1 import _async as health_async
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection

from flexcomm import __version__
from flexcomm.agent import sdnotify
from flexcomm.agent.commit import GroupCommit
from flexcomm.agent.config import AgentConfig, split_host_port
from flexcomm.agent.emulation import EpochEmulation
from flexcomm.agent.jobs import Jobs
from flexcomm.agent.lifecycle import JobLifecycle
from flexcomm.agent.metrics import Metrics
from flexcomm.agent.network_feed import NetworkFeed
from flexcomm.agent.persist import Persister
from flexcomm.agent.probing import Probing
from flexcomm.agent.service import AgentService
from flexcomm.policy.jobspec import policy_for
from flexcomm.policy.linkestimate import LinkEstimateConfig
from flexcomm.probe.estimate import RESTORED_PER_KIND, EstimateConfig, Estimator
from flexcomm.probe.serving import listen_address
from flexcomm.proto import agent_pb2 as pb
from flexcomm.proto import agent_pb2_grpc as pb_grpc
from flexcomm.sockets import tcp_listen_error, unix_socket_listening
from flexcomm.store import EmulationStep

log = logging.getLogger("flexcomm.agent")
SERVICE_NAME = pb.DESCRIPTOR.services_by_name["Agent"].full_name
# Transport limit on one message; larger ones get RESOURCE_EXHAUSTED from gRPC
# itself. The API's own limits (validate.py) are well inside it.
MAX_MESSAGE_BYTES = 4 * 1024 * 1024
SHUTDOWN_GRACE_S = 2.0


def _prepare_socket_path(path: Path) -> None:
    """Make the directory; remove a stale socket left by a killed agent, but
    refuse to steal one another agent is serving on."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True, mode=0o755)
    except OSError as exc:
        raise ValueError(f"socket: cannot create the directory {path.parent}: {exc.strerror}") from None
    if path.exists() or path.is_symlink():
        if not path.is_socket():
            raise ValueError(f"socket: {path} exists and is not a socket")
        if unix_socket_listening(path):
            raise ValueError(f"socket: another agent is serving on {path}")
        path.unlink()


def _secure_socket(path: Path, group: str) -> None:
    if group:
        try:
            gid = grp.getgrnam(group).gr_gid
        except KeyError:
            raise ValueError(f"socket_group: no group {group!r}") from None
        os.chown(path, -1, gid)
        os.chmod(path, 0o660)
    else:
        os.chmod(path, 0o600)


def _tls_credentials(config: AgentConfig) -> grpc.ServerCredentials:
    def read(field: str, path: str) -> bytes:
        try:
            return Path(path).read_bytes()
        except OSError as exc:
            raise ValueError(f"{field}: cannot read {path}: {exc.strerror}") from None

    ca = read("tls_client_ca", config.tls_client_ca) if config.tls_client_ca else None
    return grpc.ssl_server_credentials(
        [(read("tls_key", config.tls_key), read("tls_cert", config.tls_cert))],
        root_certificates=ca, require_client_auth=ca is not None)


class Agent:
    """One agent process's parts, wired together: each part is handed what it
    uses, and only this class knows them all. `run()` serves until stopped."""

    def __init__(self, config: AgentConfig) -> None:
        self.config = config
        self.metrics = Metrics()
        self.jobs = Jobs(config.max_jobs)
        self.persister = Persister(config.db, move_damaged=config.move_damaged_db)
        self.commits = GroupCommit(self._write_pending)
        looks = config.probe and config.probe_look_duty_cycle > 0
        link = LinkEstimateConfig(probes=config.probe, looks=looks)
        estimator = Estimator(config.link_bucket(), EstimateConfig(max_probe_age_s=config.max_probe_age_s, link=link))
        self.network = NetworkFeed(estimator, self.metrics,
                                   redecide=lambda job_id: self.lifecycle.refresh_job(job_id))
        self.lifecycle = JobLifecycle(self.jobs, self.network, self.persister, self.metrics, policy_for)
        self.service = AgentService(self.lifecycle, self.jobs, self.network, self.persister, self.metrics,
                                    self.commits.commit, agent_info=self.info)
        self.health = health_async.HealthServicer()
        self.server: grpc.aio.Server | None = None
        self.stopping = asyncio.Event()
        self.metrics_port: int | None = None
        self._metrics_server: object | None = None
        self._tasks: list[asyncio.Task] = []
        self.failed_stops = 0
        self._bound_socket: Path | None = None
        self.ready = False  # start() finished: stopping is news worth logging
        self._flush_soon = asyncio.Event()
        self.lifecycle.on_decision = self._flush_soon.set
        # Started after the bind, stopped before the last flush.
        self.emulation: EpochEmulation | None = None
        self.probing: Probing | None = None
        if config.emulation_schedule:
            # a bad schedule fails here, before READY
            self.emulation = EpochEmulation(config, record=self._record_emulation_step)
            self.lifecycle.on_epoch = self.emulation.advance
        if config.probe:
            self.probing = Probing(config, on_measurement=self.network.measured,
                                   on_bandwidth_start=self.network.bandwidth_started)
            self.network.request_probes = self.probing.request_bandwidth
            self.network.request_looks = self.probing.request_looks
            self.lifecycle.on_jobs_changed = self._probe_job_nodes

    @property
    def extensions(self) -> list[EpochEmulation | Probing]:
        return [ext for ext in (self.emulation, self.probing) if ext is not None]

    def _job_nodes(self) -> set[str]:
        return {node for job in self.jobs for node in job.spec.nodes}

    async def _probe_job_nodes(self) -> None:
        assert self.probing is not None
        await self.probing.update_peers(self._job_nodes())

    def _probe_listeners(self) -> list[tuple[str, str]]:
        servers = self.probing.servers if self.probing is not None else None
        if servers is None:
            return []
        return ([("iperf3", a) for a in servers.listeners()] +
                [("looks (udp)", a) for a in servers.look_listeners()])

    def _record_emulation_step(self, step: EmulationStep) -> None:
        store = self.persister.store
        if store is not None:
            store.add_emulation_step(step)

    async def start(self) -> None:
        await self.persister.open()
        for job in await self.persister.load_jobs(policy_for):
            if job.idle_s(time.time()) > self.config.job_idle_expiry_s:  # its client died meanwhile
                await self.lifecycle.write_end(job, "expired")
                continue
            self.jobs.add(job)
            await self.network.add_job(job)
            self.lifecycle.publish(job)
            log.info("job resumed", extra={"fields": {
                "job": job.job_id, "version": job.version, "last_step": job.last_step,
                "compression": job.decision.compression.name, "collective": job.decision.collective}})
        self.metrics.jobs.set(len(self.jobs))
        peers = self._job_nodes()
        self.network.restore(m for m in await self.persister.latest_measurements(RESTORED_PER_KIND)
                             if m.peer in peers)
        self.server = grpc.aio.server(options=[
            ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
            ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
            ("grpc.so_reuseport", 0),
        ])
        pb_grpc.add_AgentServicer_to_server(self.service, self.server)
        health_pb2_grpc.add_HealthServicer_to_server(self.health, self.server)
        reflection.enable_server_reflection(
            (SERVICE_NAME, health_pb2.DESCRIPTOR.services_by_name["Health"].full_name,
             reflection.SERVICE_NAME), self.server)
        self._bind()
        await self.server.start()
        for name in ("", SERVICE_NAME):
            await self.health.set(name, health_pb2.HealthCheckResponse.SERVING)
        if self.config.metrics:
            self._metrics_server, self.metrics_port = self.metrics.serve(self.config.metrics)
        if self.emulation is not None:
            await self.emulation.start(max((job.last_epoch for job in self.jobs), default=0))
        if self.probing is not None:
            await self.probing.start(self.persister.store, self._job_nodes())
        self._tasks = [asyncio.create_task(self._flush_loop(), name="flush"),
                       asyncio.create_task(self._prune_loop(), name="prune"),
                       asyncio.create_task(self._expiry_loop(), name="expiry")]
        interval = sdnotify.watchdog_interval_s()
        if interval:
            self._tasks.append(asyncio.create_task(self._watchdog_loop(interval), name="watchdog"))
        log.info("agent ready", extra={"fields": {
            "listening": [f"{kind} {address}" for kind, address in self.listeners()],
            "db": self.config.db, "jobs": len(self.jobs), "pid": os.getpid()}})
        self.ready = True
        # What lives as long as the agent (modules, the server, resumed jobs) out of
        # the collector's reach: a full collection walked ~80k objects and held the
        # loop 25-45 ms under load (bench/agent_load.py); after this, ~30k and <= 15 ms.
        # Collected first, so that no garbage is frozen with them.
        gc.collect()
        gc.freeze()
        sdnotify.notify(f"READY=1\nSTATUS=serving {len(self.jobs)} job(s)\nMAINPID={os.getpid()}")

    def listeners(self) -> list[tuple[str, str]]:
        """(kind, address) of everything this agent listens on now."""
        out = [("api", f"unix:{self.config.socket}")]
        if self.config.tcp:
            out.append(("tcp", self.config.tcp))
        if self.metrics_port is not None:
            host, _ = split_host_port("metrics", self.config.metrics)
            out.append(("metrics", listen_address(host, self.metrics_port)))
        out += self._probe_listeners()
        return out

    def info(self) -> pb.AgentInfo:
        return pb.AgentInfo(listeners=[pb.Listener(kind=k, address=a) for k, a in self.listeners()],
                            max_jobs=self.config.max_jobs, job_idle_expiry_s=self.config.job_idle_expiry_s,
                            pid=os.getpid(), version=__version__)

    def _bind(self) -> None:
        assert self.server is not None
        path = Path(self.config.socket)
        _prepare_socket_path(path)
        old_umask = os.umask(0o177)  # the socket is born 0600
        try:
            if self.server.add_insecure_port(f"unix:{path}") == 0:
                raise RuntimeError
        except RuntimeError:  # grpc's "Failed to bind", with no reason
            raise ValueError(f"socket: cannot listen on {path}") from None
        finally:
            os.umask(old_umask)
        self._bound_socket = path
        _secure_socket(path, self.config.socket_group)
        if self.config.tcp:
            why = tcp_listen_error(*split_host_port("tcp", self.config.tcp))
            if why:
                raise ValueError(f"tcp: cannot listen on {self.config.tcp}: {why}")
            try:
                if self.config.tls_cert:
                    port = self.server.add_secure_port(self.config.tcp, _tls_credentials(self.config))
                else:  # loopback only (config.validate)
                    port = self.server.add_insecure_port(self.config.tcp)
            except RuntimeError:  # grpc's "Failed to bind", with no reason
                port = 0
            if port == 0:
                raise ValueError(f"tcp: cannot listen on {self.config.tcp}")

    async def _flush_loop(self) -> None:
        # Every flush_interval_s, and at once after a decision changes: a decision
        # is what a restarted agent must not lose (reports may wait for the timer).
        while True:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._flush_soon.wait(), self.config.flush_interval_s)
            self._flush_soon.clear()
            await self.flush()

    async def flush(self) -> None:
        with contextlib.suppress(Exception):  # counted and logged by the write; retried next time
            await self.commits.commit()

    async def _write_pending(self) -> None:
        try:
            await self.persister.flush(list(self.jobs))
        except Exception as exc:  # the disk may come back; what was pending is kept
            self.metrics.store_errors.inc()
            log.error("store write failed", extra={"fields": {"error": str(exc)}})
            raise

    async def _prune_loop(self) -> None:
        while True:
            try:
                deleted = await self.persister.prune(self.config.retention_s)
                if any(deleted.values()):
                    log.info("pruned old rows", extra={"fields": deleted})
            except Exception as exc:  # a full or locked disk must not stop the agent
                self.metrics.store_errors.inc()
                log.error("store prune failed", extra={"fields": {"error": str(exc)}})
            await asyncio.sleep(min(3600.0, self.config.retention_s / 10))

    async def _expiry_loop(self) -> None:
        expiry = self.config.job_idle_expiry_s
        while True:
            await asyncio.sleep(min(30.0, expiry / 4))
            now = time.time()
            for job in [j for j in self.jobs if j.idle_s(now) > expiry]:
                if self.jobs.find(job.job_id) is job:  # not ended by its client meanwhile
                    await self.lifecycle.end(job, "expired")

    async def _watchdog_loop(self, interval: float) -> None:
        while True:
            sdnotify.notify("WATCHDOG=1")
            await asyncio.sleep(interval)

    async def stop(self) -> None:
        sdnotify.notify("STOPPING=1")
        if self.ready:  # a start that failed says why once, in its error
            log.info("agent stopping", extra={"fields": {"jobs": len(self.jobs)}})
        await self.health.enter_graceful_shutdown()
        for ext in reversed(self.extensions):
            try:
                await ext.stop()
            except Exception as exc:
                # An emulation that cannot restore its interface leaves the node
                # shaped: say so loudly, and exit non-zero.
                self.failed_stops += 1
                log.error("could not stop cleanly", extra={"fields": {"part": type(ext).__name__,
                                                                      "error": str(exc)}})
        for job in self.jobs:
            job.close()  # ends WatchDecisions streams
        if self.server is not None:
            await self.server.stop(SHUTDOWN_GRACE_S)
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        await self.flush()
        await self.persister.close()
        if self._metrics_server is not None:
            self._metrics_server.shutdown()  # type: ignore[attr-defined]
        if self._bound_socket is not None:
            with contextlib.suppress(FileNotFoundError):
                self._bound_socket.unlink()
        if self.ready:
            log.info("agent stopped")

    async def run(self) -> None:
        loop = asyncio.get_running_loop()
        owner = os.getpid()

        # Not loop.add_signal_handler: its wakeup fd is inherited by the helper
        # processes pyroute2 forks (and stops with SIGTERM), and their signal would
        # stop this agent. A forked child just exits, as SIGTERM's default would.
        def on_signal(signum: int, frame: object) -> None:
            if os.getpid() != owner:
                os._exit(128 + signum)
            loop.call_soon_threadsafe(self.stopping.set)

        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, on_signal)
        try:
            await self.start()
            await self.stopping.wait()
        finally:
            await self.stop()


async def serve(config: AgentConfig) -> int:
    """Run the agent until SIGTERM/SIGINT; the exit status (1 if a part failed to stop)."""
    agent = Agent(config)
    await agent.run()
    return 1 if agent.failed_stops else 0
