"""``noop``: the backend of last resort (design §4). It enforces nothing and says so, loudly and repeatedly."""

from __future__ import annotations

import logging
from typing import Any

from .api import FlowSpec, KillSwitchMode, LinkPlan, flow_label
from .base import BaseEnforcer

log = logging.getLogger(__name__)


class NoopEnforcer(BaseEnforcer):
    """Records what was asked, enforces none of it (e.g. the agent is not root)."""

    backend_name = "noop"

    def __init__(self, ifname: str, plan: LinkPlan, *, netns: str | None = None, reason: str = "") -> None:
        self.reason = reason or "no kernel enforcement available"
        super().__init__(ifname, plan, netns=netns)

    def _install(self) -> None:
        log.error(
            "NOTHING IS ENFORCED on %s: %s. Migration rates, DSCP and the kill-switch are not applied.",
            self.ifname,
            self.reason,
        )

    def _add(self, spec: FlowSpec, minor: int) -> None:
        log.error(
            "NOT ENFORCED (%s): flow %s:%d at %d B/s",
            self.reason,
            spec.dst_ip,
            spec.dst_port,
            spec.rate_bytes_per_s,
        )

    def _update(self, old: FlowSpec, new: FlowSpec, minor: int) -> None:
        self._add(new, minor)

    def _remove(self, spec: FlowSpec, minor: int) -> None:
        return None

    def _set_ks(self, mode: KillSwitchMode, ports: set[int]) -> None:
        if mode != KillSwitchMode.OFF:
            log.error(
                "NOT ENFORCED (%s): kill-switch %s was requested but nothing drops", self.reason, mode.name
            )

    def _counters(self) -> dict[str, Any]:
        return {
            "enforced": False,
            "reason": self.reason,
            "flows": {flow_label(k): self._flow_entry(s) for k, s in self._flows.items()},
            "killswitch": {},
            "rx_dscp": {},
            "dscp_marking": False,
        }

    def _teardown(self) -> None:
        return None
