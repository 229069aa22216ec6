"""Service settings, read once from `CRONHOOK_*` environment variables and handed down.

The one home of every setting's default: the service configs (SchedulerConfig,
ReaperConfig, TenantLimits) copy values from here with `copy_settings`, and take the same defaults
(`default_of`) when a test or bench builds one by hand. The rules that tie settings
together are functions here, so the configs check them the same way.
"""

from __future__ import annotations

import dataclasses
import os
import secrets
import socket
from collections.abc import Mapping
from functools import cached_property
from pathlib import Path
from typing import Any, Literal, TypeVar
from urllib.parse import urlsplit

from pydantic import Field, SecretStr, field_validator, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict
from sqlalchemy.engine import URL

from app.db.url import DatabaseUrlError, parse_database_url
from app.domain.egress import EgressPolicy, parse_egress_allow
from app.domain.retry import RetryPolicy
from app.keyring import KeyRing, KeyRingError, load_key_file, parse_key_ring

# The largest per-target HTTP deadline any deployment may configure.
TARGET_TIMEOUT_CEILING_S = 300.0
# Bootstrap and admin keys shorter than this are refused at start-up (guessable).
MIN_CONFIGURED_KEY_LENGTH = 20
# A partition lease must survive this many renew intervals.
MIN_RENEWALS_PER_PARTITION_LEASE = 3
# The secret settings: each also reads from a file named by CRONHOOK_<NAME>_FILE (Docker and
# Kubernetes secrets), so a secret need not sit in the environment.
FILE_SETTINGS = ("database_url", "database_password", "bootstrap_api_key", "admin_api_key", "secret_keys")
ENV_PREFIX = "CRONHOOK_"
NEW_KEY_RECIPE = (
    "make one with `cronhook secrets new-key` (or: python3 -c 'import base64, secrets; "
    'print("k1:" + base64.b64encode(secrets.token_bytes(32)).decode())\')'
)


def lease_outlasts_http_deadline(lease_s: float, max_target_timeout_s: float, lease_margin_s: float) -> bool:
    """A job lease must outlive the longest POST plus the time to record its outcome."""
    return lease_s > max_target_timeout_s + lease_margin_s


def partition_lease_survives_renewals(lease_s: float, renew_s: float) -> bool:
    """One slow or failed renewal must not cost a replica its partitions."""
    return lease_s >= MIN_RENEWALS_PER_PARTITION_LEASE * renew_s


def default_of(name: str) -> Any:
    """The default of setting `name`, for a config built without Settings (tests, bench)."""
    return Settings.model_fields[name].get_default(call_default_factory=True)


_Config = TypeVar("_Config")


def copy_settings(config: type[_Config], settings: Settings, prefix: str = "", **sources: str) -> _Config:
    """A config dataclass whose every field is copied from the setting of the same name
    (`prefix` + name, or the name given in `sources`): one list of fields, not two."""
    names = {f.name for f in dataclasses.fields(config)}  # type: ignore[arg-type]
    if unknown := set(sources) - names:
        raise TypeError(f"{config.__name__} has no field {sorted(unknown)}")
    values = {name: getattr(settings, sources.get(name, prefix + name)) for name in names}
    return config(**values)


def default_replica_id() -> str:
    # The random part tells a restarted process (same host, same pid in a container) from
    # its previous life, whose partition leases and job leases must not be mistaken for its own.
    return f"{socket.gethostname()}-{os.getpid()}-{secrets.token_hex(3)}"


def read_secret_files(values: dict[str, Any], environ: Mapping[str, str]) -> dict[str, Any]:
    """`values` with each secret setting whose CRONHOOK_<NAME>_FILE is set read from that file
    (trailing whitespace and newlines stripped). Setting both forms is an error: which one
    wins would be a guess."""
    values = dict(values)
    for name in FILE_SETTINGS:
        variable = f"{ENV_PREFIX}{name.upper()}_FILE"
        path = environ.get(variable)
        if not path:
            continue
        if values.get(name) is not None:
            raise ValueError(f"set {ENV_PREFIX}{name.upper()} or {variable}, not both")
        try:
            text = Path(path).read_text().rstrip()
        except OSError as exc:
            raise ValueError(f"{variable}: cannot read {path}: {exc.strerror or type(exc).__name__}") from None
        if not text:
            raise ValueError(f"{variable}: {path} is empty")
        values[name] = text
    return values


class Settings(BaseSettings):
    # hide_input_in_errors: a rejected secret (a URL with its password) is never echoed.
    model_config = SettingsConfigDict(env_prefix=ENV_PREFIX, extra="ignore", hide_input_in_errors=True)

    # Storage. With no URL, an embedded PostgreSQL runs in `data_dir`/pg. libpq's forms,
    # several hosts included (app/db/url.py); the password may come separately.
    database_url: SecretStr | None = None
    database_password: SecretStr | None = None
    data_dir: Path = Path(".cronhook")
    db_pool_size: int = Field(default=10, ge=1, le=200)
    # PostgreSQL ends a session left idle inside a transaction this long (0 = never), so a
    # stalled or stopped process cannot keep job rows locked: SKIP LOCKED would hide them
    # from every other scheduler and from the reaper for as long as the stall lasted.
    db_idle_in_transaction_timeout_s: float = Field(default=10.0, ge=0, le=3600)
    # PostgreSQL cancels any statement running longer than this (0 = no limit). A cancelled
    # statement is treated as an outage: the service backs off and tries again.
    db_statement_timeout_s: float = Field(default=0.0, ge=0, le=3600)
    # A database operation not returned after this long is logged as a stall (with what the
    # server says it waits for), and readiness fails after three times it without a commit
    # (app/services/db_health.py).
    db_stall_warn_s: float = Field(default=5.0, gt=0, le=3600)
    auto_migrate: bool = True

    # HTTP API.
    host: str = "127.0.0.1"
    port: int = Field(default=8080, ge=0, le=65535)
    bootstrap_api_key: SecretStr | None = None
    # Bearer key for the operator endpoints (/v1/cluster); unset, they answer 403.
    admin_api_key: SecretStr | None = None
    max_payload_bytes: int = Field(default=256 * 1024, ge=1024, le=16 * 1024 * 1024)
    # The whole body of POST /v1/jobs/batch and PUT /v1/schedule-sets/{set} (each job's payload
    # is still held to max_payload_bytes).
    max_batch_bytes: int = Field(default=16 * 1024 * 1024, ge=64 * 1024, le=256 * 1024 * 1024)
    # How long the API keeps an idle client connection open. Longer than the idle timeout of
    # the proxies and load balancers in front of it (60 s for most): a server that closes
    # first races the proxy's next request on that connection, which then fails (a 502, or
    # "server disconnected" to a direct client). uvicorn's own default is 5 s.
    http_keep_alive_s: int = Field(default=75, ge=1, le=3600)
    # API worker processes sharing the listening socket (`cronhook api|up --workers`).
    api_workers: int = Field(default=1, ge=1, le=64)
    # The API's address as webhook receivers reach it (`https://cron.example.com`): an async
    # delivery's completion URL starts with it. Unset: http://<host>:<port>, which only a
    # receiver on the same machine can reach (start-up warns while async targets exist).
    public_url: str | None = None
    # Reports (heartbeats and completions) one completion token may make per minute, per API
    # replica; a bad token counts as a failed authentication of its address.
    completion_reports_per_min: int = Field(default=600, ge=1)

    # Processes: scheduler processes on this machine (`cronhook up|scheduler --processes`),
    # each its own replica sharing the partitions; default one per CPU.
    scheduler_processes: int = Field(default_factory=lambda: os.cpu_count() or 1, ge=1, le=64)
    # Key ring for secrets at rest (`id:base64key,...`, the first seals; app/keyring.py).
    # Unset: a key generated once into `data_dir`/secret-keys (mode 0600).
    secret_keys: SecretStr | None = None

    # Per-tenant quotas (defaults; `cronhook tenant limits` overrides them per tenant).
    # API requests per second, across all API replicas (0 = unlimited); bursts of 2 s worth.
    tenant_requests_per_s: float = Field(default=1000.0, ge=0)
    tenant_max_active_jobs: int = Field(default=100_000, ge=1)
    tenant_max_targets: int = Field(default=1_000, ge=1)
    # The shortest interval between fire times of a recurring job (cron or every_s).
    tenant_min_interval_s: int = Field(default=1, ge=1)
    tenant_min_backoff_base_s: float = Field(default=0.01, ge=0)
    tenant_max_attempts: int = Field(default=100, ge=1, le=100)
    # Failed authentications per client address per minute, per API replica.
    failed_auth_per_min: int = Field(default=60, ge=1)

    # Scheduler.
    replica_id: str = Field(default_factory=default_replica_id)
    batch_size: int = Field(default=100, ge=1, le=10_000)
    concurrency: int = Field(default=200, ge=1, le=10_000)
    poll_interval_s: float = Field(default=0.2, gt=0, le=60)
    # A scheduler claims the jobs falling due within this many seconds and POSTs each at its
    # due time, not a claim's round trip after it (0: only jobs already due).
    claim_ahead_s: float = Field(default=0.05, ge=0, le=1)
    lease_s: float = Field(default=60.0, gt=0)
    # Targets may not ask for a longer HTTP deadline than this; the job lease must outlast it
    # by `lease_margin_s`, the time allowed to record an outcome after the POST returns.
    max_target_timeout_s: float = Field(default=30.0, gt=0, le=TARGET_TIMEOUT_CEILING_S)
    lease_margin_s: float = Field(default=5.0, ge=0.5)
    # A replica whose heartbeat lapsed and whose sessions are all gone is dead: its jobs are
    # rescued at once (app/store/rescues.py). Turn off behind a transaction-mode pooler
    # (PgBouncer), where sessions do not belong to processes: its jobs then wait the
    # target's timeout plus the lease margin more.
    dead_replica_fast_rescue: bool = True
    # Partition ownership: each replica renews its partition leases every `partition_renew_s`;
    # a replica that dies loses them `partition_lease_s` later, when the others take them over.
    partition_lease_s: float = Field(default=15.0, gt=0, le=3600)
    partition_renew_s: float = Field(default=3.0, gt=0, le=600)
    # A due job gains one priority level per this many seconds waited (app/domain/priority.py).
    priority_aging_s: float = Field(default=60.0, gt=0, le=86_400)
    # Fairness (app/domain/fair_share.py): the largest fraction of one scheduler's delivery
    # slots a tenant's deliveries may hold, and how many deliveries one scheduler starts at
    # once to a target that sets no max_in_flight of its own.
    tenant_max_share: float = Field(default=0.5, gt=0, le=1)
    target_default_max_in_flight: int = Field(default=100, ge=1, le=10_000)

    # Reaper.
    reaper_interval_s: float = Field(default=5.0, gt=0, le=3600)
    reaper_batch_size: int = Field(default=500, ge=1, le=100_000)

    # Schedule health (app/domain/health.py): a job is `failing` after this many failed
    # occurrences in a row, or when none succeeded within `expect_success_within_s` (unset:
    # no such deadline), unless its tenant or the job itself says otherwise.
    expect_max_consecutive_failures: int = Field(default=1, ge=1, le=10_000)
    expect_success_within_s: int | None = Field(default=None, ge=1)
    # Inbound check-ins: pings one check's token may make per minute, per API replica, and
    # the pings kept per check (older ones are deleted by the reaper).
    check_pings_per_min: int = Field(default=60, ge=1)
    check_pings_kept: int = Field(default=100, ge=1, le=100_000)

    # Retention (the reaper deletes in batches of `retention_batch_size`, app/store/retention.py):
    # finished jobs (succeeded, cancelled, dead without a dead letter) and their runs after
    # `retention_days`; dead letters are kept until deleted, or after
    # `dead_letter_retention_days` when set; a recurring job keeps its newest
    # `runs_kept_per_job` runs.
    retention_days: float = Field(default=30.0, gt=0, le=36_500)
    dead_letter_retention_days: float | None = Field(default=None, gt=0, le=36_500)
    runs_kept_per_job: int = Field(default=1000, ge=1, le=10_000_000)
    retention_batch_size: int = Field(default=500, ge=1, le=100_000)

    # Defaults for jobs that do not set their own retry policy.
    default_max_attempts: int = Field(default=5, ge=1, le=100)
    default_backoff_base_s: float = Field(default=2.0, gt=0)
    default_backoff_max_s: float = Field(default=600.0, gt=0)
    default_backoff_factor: float = Field(default=RetryPolicy.backoff_factor, ge=1, le=10)
    default_target_timeout_s: float = Field(default=10.0, gt=0, le=TARGET_TIMEOUT_CEILING_S)

    # Internal destinations deliveries may reach anyway (comma-separated CIDRs and host
    # names); empty: only globally routable addresses (app/domain/egress.py).
    egress_allow: str = ""

    log_level: str = "INFO"
    # json (one object per line) or text; auto: text when stderr is a terminal, else json.
    log_format: Literal["auto", "json", "text"] = "auto"
    # Scheduler and reaper roles: serve GET /metrics and GET /healthz on this port (0 = off).
    # `cronhook health` checks it; the API serves both on its own port.
    metrics_port: int = Field(default=0, ge=0, le=65535)
    metrics_host: str = "127.0.0.1"

    @property
    def default_retry_policy(self) -> RetryPolicy:
        """The retry policy of a job that sets none of its own."""
        return RetryPolicy(
            self.default_max_attempts,
            self.default_backoff_base_s,
            self.default_backoff_max_s,
            self.default_backoff_factor,
        )

    @model_validator(mode="before")
    @classmethod
    def _secrets_from_files(cls, data: Any) -> Any:
        if isinstance(data, dict):
            return read_secret_files(data, os.environ)
        return data

    @field_validator("database_url")
    @classmethod
    def _database_url_parses(cls, value: SecretStr | None) -> SecretStr | None:
        if value is not None:
            try:
                parse_database_url(value.get_secret_value())
            except DatabaseUrlError as exc:
                raise ValueError(str(exc)) from None
        return value

    @property
    def database(self) -> URL | None:
        """The engine's URL (CRONHOOK_DATABASE_PASSWORD in place of the URL's own), or None
        for the embedded server."""
        if self.database_url is None:
            return None
        password = self.database_password.get_secret_value() if self.database_password is not None else None
        return parse_database_url(self.database_url.get_secret_value(), password)

    @field_validator("egress_allow")
    @classmethod
    def _egress_allow_parses(cls, value: str) -> str:
        parse_egress_allow(value)
        return value

    @field_validator("bootstrap_api_key", "admin_api_key")
    @classmethod
    def _configured_key_long_enough(cls, value: SecretStr | None) -> SecretStr | None:
        if value is not None and len(value.get_secret_value()) < MIN_CONFIGURED_KEY_LENGTH:
            raise ValueError(
                f"must be at least {MIN_CONFIGURED_KEY_LENGTH} characters "
                "(e.g. python3 -c 'import secrets; print(secrets.token_urlsafe(32))')"
            )
        return value

    @field_validator("secret_keys")
    @classmethod
    def _secret_keys_parse(cls, value: SecretStr | None) -> SecretStr | None:
        if value is not None:
            try:
                parse_key_ring(value.get_secret_value())
            except KeyRingError as exc:
                raise ValueError(str(exc)) from None
        return value

    def load_key_ring(self) -> KeyRing:
        """CRONHOOK_SECRET_KEYS; with the embedded server only, the data dir's key file
        (generated on first use). Every process of a deployment on an external database must
        hold the same ring: a key generated per process would seal what no other can open, and
        vanish with its container."""
        if self.secret_keys is not None:
            return parse_key_ring(self.secret_keys.get_secret_value())
        if self.database_url is not None:
            raise KeyRingError(
                "CRONHOOK_SECRET_KEYS (or CRONHOOK_SECRET_KEYS_FILE) is required with CRONHOOK_DATABASE_URL: "
                f"every process needs the same key ring to seal and open target secrets; {NEW_KEY_RECIPE}, "
                "keep it safe, and pass it to every process"
            )
        return load_key_file(self.data_dir)

    @cached_property
    def egress_policy(self) -> EgressPolicy:
        return parse_egress_allow(self.egress_allow)

    @property
    def completion_base_url(self) -> str:
        """What async deliveries' completion URLs start with (CRONHOOK_PUBLIC_URL's default)."""
        if self.public_url:
            return self.public_url.rstrip("/")
        host = "127.0.0.1" if self.host in ("0.0.0.0", "::", "") else self.host
        if ":" in host:
            host = f"[{host}]"
        return f"http://{host}:{self.port}"

    @field_validator("public_url")
    @classmethod
    def _public_url_absolute(cls, value: str | None) -> str | None:
        if value is None or value == "":
            return None
        parts = urlsplit(value)
        if parts.scheme not in ("http", "https") or not parts.netloc or parts.query or parts.fragment:
            raise ValueError("CRONHOOK_PUBLIC_URL must be an absolute http(s) URL without query or fragment")
        return value

    @field_validator("replica_id")
    @classmethod
    def _replica_id_not_async_owner(cls, value: str) -> str:
        # An open asynchronous attempt's lease owner (app/domain/completion.py) is no replica.
        if value.startswith("~"):
            raise ValueError("CRONHOOK_REPLICA_ID must not start with '~'")
        return value

    @model_validator(mode="after")
    def _lease_outlasts_http_deadline(self) -> Settings:
        if not lease_outlasts_http_deadline(self.lease_s, self.max_target_timeout_s, self.lease_margin_s):
            raise ValueError(
                f"CRONHOOK_LEASE_S={self.lease_s:g} must be greater than CRONHOOK_MAX_TARGET_TIMEOUT_S "
                f"({self.max_target_timeout_s:g}) plus CRONHOOK_LEASE_MARGIN_S ({self.lease_margin_s:g}), "
                "so that a delivery in flight never outlives its lease"
            )
        if self.claim_ahead_s >= self.lease_s - self.max_target_timeout_s - self.lease_margin_s:
            raise ValueError(
                f"CRONHOOK_CLAIM_AHEAD_S={self.claim_ahead_s:g} must be shorter than CRONHOOK_LEASE_S less "
                "CRONHOOK_MAX_TARGET_TIMEOUT_S and CRONHOOK_LEASE_MARGIN_S, the time a claimed job's POST may "
                "still start"
            )
        if not partition_lease_survives_renewals(self.partition_lease_s, self.partition_renew_s):
            raise ValueError(
                f"CRONHOOK_PARTITION_LEASE_S={self.partition_lease_s:g} must be at least "
                f"{MIN_RENEWALS_PER_PARTITION_LEASE} x CRONHOOK_PARTITION_RENEW_S ({self.partition_renew_s:g}), "
                "so that one slow or failed renewal does not cost a replica its partitions"
            )
        if self.default_target_timeout_s > self.max_target_timeout_s:
            raise ValueError("CRONHOOK_DEFAULT_TARGET_TIMEOUT_S must be <= CRONHOOK_MAX_TARGET_TIMEOUT_S")
        if self.default_backoff_max_s < self.default_backoff_base_s:
            raise ValueError("CRONHOOK_DEFAULT_BACKOFF_MAX_S must be >= CRONHOOK_DEFAULT_BACKOFF_BASE_S")
        return self
