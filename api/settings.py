"""The service's configuration: the library's `autotune.settings.Settings` and the service's fields.

``ServiceSettings.from_env()`` reads every ``AUTOTUNE_*`` variable, the library's included (a bad
AUTOTUNE_CONTEXT_OVERHEAD stops the service at start, not at its first run), and raises InvalidInput
naming a malformed one; ``ServiceSettings(db=..., ...)`` is exactly the values given plus the
defaults, whatever the environment holds. ``Settings`` is the same class, the name call sites use.
"""

from __future__ import annotations

import ipaddress
import os
from pathlib import Path
from typing import Annotated, Any

from pydantic import BeforeValidator, Field
from pydantic_settings import NoDecode

from api.hosts import LOOPBACK_HOSTS, parse_hosts
from autotune.defaults import BACKENDS, DEFAULT_BACKEND, DEFAULT_MAX_BATCH
from autotune.settings import PositiveInt, Switch
from autotune.settings import Settings as LibrarySettings

DEFAULT_DB = Path("autotune.db")
RECONCILE_S = 5.0  # a failed write is retried, a lost run requeued, within seconds; a pass is 2 reads
# A worker reports a probe at least this often unless it is stuck: the estimator's slowest
# probe (an 8B model's first trace) takes about a minute here, a cuda probe of a large model a
# few, so 15 minutes of silence is no step being measured.
WATCHDOG_S = 900.0
ANALYSIS_TIMEOUT_S = 120.0  # of one check or explain on the estimator (BERT-base with levers: ~60 s)


def _cpu_count() -> int:
    """CPUs this process may run on (a container's cpuset, not the host's count)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def _db(value: Any) -> Any:
    if isinstance(value, str):
        return Path(value.strip()) if value.strip() else DEFAULT_DB
    return value


def _dirs(value: Any) -> Any:
    """os.pathsep-separated paths (``/a:/b``), ``~`` expanded; blank entries skipped."""
    if isinstance(value, str):
        return tuple(Path(p).expanduser() for p in value.strip().split(os.pathsep) if p.strip())
    return value


def _ray_address(value: Any) -> Any:
    """``auto`` (the cluster this machine is part of), ``HOST:PORT`` of its head (GCS), or a
    Ray Client address ``ray://HOST:PORT``; blank: no fleet."""
    if value is None:
        return None
    if not isinstance(value, str):
        raise ValueError("give a Ray address: auto, HOST:PORT or ray://HOST:PORT")
    value = value.strip()
    if not value:
        return None
    if value == "auto":
        return value
    host, _, port = value.removeprefix("ray://").rpartition(":")
    if not host or not port.isdigit() or not 0 < int(port) < 65536 or any(c.isspace() for c in host):
        raise ValueError(f"{value!r} is not a Ray address: use auto, HOST:PORT (the head's GCS port, "
                         "6379 by default) or ray://HOST:PORT (Ray Client, 10001 by default)")
    return value


def _backend(value: Any) -> Any:
    if isinstance(value, str):
        value = value.strip()
        if value not in BACKENDS:
            raise ValueError(f"use one of {', '.join(BACKENDS)}")
    return value


DbPath = Annotated[Path, BeforeValidator(_db)]  # "" = DEFAULT_DB
Dirs = Annotated[tuple[Path, ...], NoDecode, BeforeValidator(_dirs)]  # not JSON: /a:/b
Backend = Annotated[str, BeforeValidator(_backend)]  # one of BACKENDS
PositiveFloat = Annotated[float, Field(gt=0, allow_inf_nan=False)]  # "2.5"; "0", "-1", "nan" refused


def _hosts(value: Any) -> Any:
    """Comma-separated host names (api.hosts.parse_hosts); a list or tuple is read the same way."""
    if isinstance(value, list | tuple):
        value = ",".join(map(str, value))
    return parse_hosts(value) if isinstance(value, str) else value


Hosts = Annotated[tuple[str, ...], NoDecode, BeforeValidator(_hosts)]  # not JSON: a,b; "" = loopback


def _proxies(value: Any) -> Any:
    """Comma-separated IP addresses or networks (``10.0.0.5``, ``10.0.0.0/24``, ``::1``); blank: none."""
    if isinstance(value, list | tuple):
        value = ",".join(map(str, value))
    if not isinstance(value, str):
        return value
    proxies = []
    for item in (part.strip() for part in value.split(",")):
        if not item:
            continue
        try:
            proxies.append(str(ipaddress.ip_network(item, strict=False)) if "/" in item
                           else str(ipaddress.ip_address(item.strip("[]"))))
        except ValueError:
            raise ValueError(f"{item!r} is not an IP address or network: give the addresses of the "
                             "reverse proxies in front of this server, comma-separated (e.g. "
                             "'127.0.0.1,10.0.0.0/24')") from None
    return tuple(dict.fromkeys(proxies))


Proxies = Annotated[tuple[str, ...], NoDecode, BeforeValidator(_proxies)]  # not JSON: a,b/24; "" = none
RayAddress = Annotated[str | None, BeforeValidator(_ray_address)]  # auto | HOST:PORT | ray://HOST:PORT


class ServiceSettings(LibrarySettings):
    """The library's settings (context_overhead, offline, server, api_token) and the service's."""

    # api_token (AUTOTUNE_API_TOKEN) is the library's: writes need it as a Bearer token when set.
    db: DbPath = DEFAULT_DB  # AUTOTUNE_DB: the SQLite file of the queue and results
    # AUTOTUNE_MODEL_DIRS (os.pathsep-separated): where local model configs may be read from;
    # empty = none, only presets and hub ids.
    model_dirs: Dirs = ()
    allow_hub: Switch = True  # AUTOTUNE_ALLOW_HUB: resolve Hugging Face hub ids (configs only)
    # AUTOTUNE_MEASUREMENTS (os.pathsep-separated): measured tables to import when the server starts
    # (api/measurements.py), files or directories (their *.json, not subfolders), e.g.
    # docs/measurements/h100-80gb; empty = none. Opt-in: an import adds runs to the database.
    measurements: Dirs = ()
    backend: Backend = DEFAULT_BACKEND  # AUTOTUNE_BACKEND: for requests that name none (auto|cuda|estimate)
    # AUTOTUNE_ESTIMATE_WORKERS: estimate runs at once; default: the CPUs this process may use
    estimate_workers: PositiveInt = Field(default_factory=_cpu_count)
    max_cells: PositiveInt = 64  # AUTOTUNE_MAX_CELLS: seq_lens x modes per request
    max_batch: PositiveInt = DEFAULT_MAX_BATCH  # AUTOTUNE_MAX_BATCH: largest max_batch a request may ask
    max_seq_len: PositiveInt = 8192  # AUTOTUNE_MAX_SEQ_LEN: tokens, whatever the model allows
    max_body_bytes: PositiveInt = 16 * 1024  # AUTOTUNE_MAX_BODY_BYTES: of a request body
    # Heavy reads (check and explain on the estimator) run in worker processes, never in the server.
    # AUTOTUNE_ANALYSIS_WORKERS: at once; one more is answered 503 with Retry-After. Default: half
    # the CPUs this process may use (at least 1), the rest left to the runs and the server.
    analysis_workers: PositiveInt = Field(default_factory=lambda: max(1, _cpu_count() // 2))
    # AUTOTUNE_ANALYSIS_TIMEOUT_S: seconds one check or explain may take before its worker is killed
    # and the request answered 503; the documented bound of a heavy read's response time.
    analysis_timeout_s: PositiveFloat = ANALYSIS_TIMEOUT_S
    # AUTOTUNE_WATCHDOG_S: seconds a run's worker may report nothing (no probe ended) before it is
    # killed and its run failed with that reason, freeing its lane.
    watchdog_s: PositiveFloat = WATCHDOG_S
    # AUTOTUNE_RECONCILE_S: seconds between the reconciler's passes (writes that failed are
    # retried; a run the store says is running but no worker holds is requeued).
    reconcile_s: PositiveFloat = RECONCILE_S
    # What a request may be, checked before any route (api/hosts.py, api/limits.py).
    # AUTOTUNE_ALLOWED_HOSTS (comma-separated): the host names clients reach this server by; a
    # request for another Host is answered 400 (a DNS-rebinding page names its own site there).
    # '*.example.com' allows the names under a domain, '*' any; `autotune serve --host ADDR` adds ADDR.
    allowed_hosts: Hosts = LOOPBACK_HOSTS
    # AUTOTUNE_BODY_TIMEOUT_S: seconds a request body may take to arrive whole after its headers
    # before it is answered 408 (this API's bodies are at most AUTOTUNE_MAX_BODY_BYTES of JSON).
    body_timeout_s: PositiveFloat = 10.0
    # Connections (api/server.py; `autotune serve`, not the app). AUTOTUNE_HEADER_TIMEOUT_S: seconds a
    # request's line and headers may take to arrive whole, from the connection's start or the end of
    # its previous response (408 and closed after; a connection that sent nothing is closed).
    header_timeout_s: PositiveFloat = 10.0
    # AUTOTUNE_MAX_CONNECTIONS: connections open at once; one more is answered 503 and closed. The
    # server raises its descriptor limit (ulimit -n) to fit, or lowers this to what the limit leaves.
    max_connections: PositiveInt = 1000
    # AUTOTUNE_MAX_CONNECTIONS_PER_CLIENT: connections open at once from one address (a trusted
    # proxy's count only in the total): one client cannot take every connection.
    max_connections_per_client: PositiveInt = 100
    # AUTOTUNE_TRUSTED_PROXIES (comma-separated addresses or networks): the reverse proxies whose
    # X-Forwarded-For and X-Forwarded-Proto are believed (the client's address, https links).
    # Empty: believed from no one, loopback clients included.
    trusted_proxies: Proxies = ()
    # AUTOTUNE_RAY_ADDRESS (`autotune serve --ray`): run on the Ray cluster there (api/fleet/), a
    # fleet of GPU kinds, instead of this host's GPUs and CPUs; auto joins the cluster this
    # machine is part of. Unset: the local runner. Needs the [fleet] extra (Ray).
    ray_address: RayAddress = None


Settings = ServiceSettings
