"""The scheduler's configuration: its settings (copied from Settings, with the same
defaults when a test or bench builds one by hand) and the rules that tie them together,
checked once at start-up.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from app.domain.egress import EgressPolicy
from app.settings import Settings, copy_settings, default_of, lease_outlasts_http_deadline


@dataclass(frozen=True)
class SchedulerConfig:
    replica_id: str
    batch_size: int = default_of("batch_size")
    concurrency: int = default_of("concurrency")
    poll_interval_s: float = default_of("poll_interval_s")
    claim_ahead_s: float = default_of("claim_ahead_s")
    lease_s: float = default_of("lease_s")
    max_target_timeout_s: float = default_of("max_target_timeout_s")
    lease_margin_s: float = default_of("lease_margin_s")
    partition_lease_s: float = default_of("partition_lease_s")
    partition_renew_s: float = default_of("partition_renew_s")
    priority_aging_s: float = default_of("priority_aging_s")
    tenant_max_share: float = default_of("tenant_max_share")
    target_default_max_in_flight: int = default_of("target_default_max_in_flight")
    # Default: deliver to globally routable addresses only.
    egress: EgressPolicy = field(default_factory=EgressPolicy)
    # Async deliveries' completion URLs start with this (CRONHOOK_PUBLIC_URL).
    completion_base_url: str = "http://127.0.0.1:8080"

    def __post_init__(self) -> None:
        if not lease_outlasts_http_deadline(self.lease_s, self.max_target_timeout_s, self.lease_margin_s):
            raise ValueError("lease_s must exceed max_target_timeout_s + lease_margin_s")
        if self.batch_size < 1 or self.concurrency < 1 or self.poll_interval_s <= 0:
            raise ValueError("batch_size, concurrency and poll_interval_s must be positive")
        if not 0 <= self.claim_ahead_s < self.post_start_window_s:
            # A job claimed ahead waits that long before its POST may start.
            raise ValueError("claim_ahead_s must be shorter than lease_s - max_target_timeout_s - lease_margin_s")
        if not 0 < self.tenant_max_share <= 1 or self.target_default_max_in_flight < 1:
            raise ValueError("tenant_max_share must be in (0, 1] and target_default_max_in_flight positive")

    @property
    def post_start_window_s(self) -> float:
        """How long after the claim a POST may still start and finish within the lease."""
        return self.lease_s - self.max_target_timeout_s - self.lease_margin_s

    @classmethod
    def from_settings(cls, settings: Settings) -> SchedulerConfig:
        return copy_settings(cls, settings, egress="egress_policy")
