"""Edge enforcement for the node agent (design §4 "Enforcement").

Typical use::

    plan = LinkPlan.from_spec(capacity_bytes_per_s=125_000_000)        # 1 Gbit/s, B_res = 0.3 B
    with make_enforcer("eth0", plan) as enf:                            # backend chosen by what the kernel allows
        enf.set_flows([FlowSpec("10.0.0.7", 7000, FlowClass.MIGRATION, 12_500_000)])
        enf.set_killswitch(KillSwitchMode.NO_NEW)
        telemetry = enf.read_counters()                                 # includes telemetry["backend"]
"""

from .api import (
    DSCP_BY_CLASS,
    EnforcementError,
    Enforcer,
    FlowClass,
    FlowSpec,
    KillSwitchMode,
    LinkPlan,
    flow_key,
    flow_label,
)
from .bccshim import BccUnavailableError
from .choose import BACKENDS, choose_backend, link_speed_bytes_per_s, make_enforcer, probe_bpf
from .tc import cleanup_stale

__all__ = [
    "BACKENDS",
    "DSCP_BY_CLASS",
    "BccUnavailableError",
    "EnforcementError",
    "Enforcer",
    "FlowClass",
    "FlowSpec",
    "KillSwitchMode",
    "LinkPlan",
    "choose_backend",
    "cleanup_stale",
    "flow_key",
    "flow_label",
    "link_speed_bytes_per_s",
    "make_enforcer",
    "probe_bpf",
]
