"""Policy definitions for the simulator: which parts of ReclaimNet (design §2-§4) are on.

A policy is a frozen `Policy` of switches; the engine reads them and calls the production code in
`scheduler.p1`, `scheduler.p2`, `scheduler.p3` where a switch says so. Nothing here re-implements P1/P2/P3.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from scheduler.estimators import PLAN_HAZARD_QUANTILE
from scheduler.queue import DEFAULT_WEIGHTS, PriorityWeights

# interval modes: "p1" (Eq. 9 with λ at `plan_hazard_quantile` plus short-notice reclaims, B⁻), "fixed"
# (fixed_interval_s), "static" (Lemma 1 at trace-wide means), "tv" (Lemma 1 at trace-wide hour-of-day means: Theorem 2's state-independent policy),
# "informed" (P1 at the true λ(t) and bandwidth), "truth" (Lemma 1 at the true λ(t), B(t): Theorem 2's state-dependent reference),
# "static-budget" (Lemma 1 at trace-wide means, then Eq. 9's clip: the loss budgets ReclaimNet honours),
# "oracle" (no periodic checkpoints: one just-in-time checkpoint before each known reclaim), "local"
# (P1 at the local disk speed, no pre-sync: the checkpoint never leaves the node).
# destination modes: "p2", "first_fit", "random", "oracle", "same_node".
# traffic modes: "p3" (admission + shaping, pre-sync as CS1), "tcp" (proportional share with research).


@dataclass(frozen=True)
class Policy:
    """Switches of one simulated policy (one of the evaluated policies)."""

    name: str
    interval: str = "p1"
    fixed_interval_s: float = 600.0
    bandwidth_split: str = "p1"  # "p1" (Theorem 1/Lemma 2) or "equal"
    destination: str = "p2"
    traffic: str = "p3"
    final_checkpoint: bool = True  # use the notice window for a final checkpoint + planned migration
    requeue_delay_s: float = 0.0
    migrate: bool = True
    # Eq. 9 plans with L_max · scale: 0.5 bounds Δ by L_max itself (every emergency loses ≤ Δ + C/b)
    # instead of 2·L_max (an expected loss of L_max); evaluation-only, not a design §7 name
    loss_budget_scale: float = 1.0
    # research reserve β of P3 (design §4): 0.3, or if set, max(0.3, this quantile of research's share of the
    # link over all links and 10-minute samples of the first (calibration) week): a campus sizing its
    # reserve from its own logs
    reserve_quantile: float | None = None
    # the reserve under P3 traffic when `reserve_quantile` is None (design §4.1): "calibrated" = per link, every day,
    # max(p95 of research's share over the last 7 days, β), the portal's rule; "fixed" = β on every link
    reserve: str = "calibrated"
    # the queue (design §16.5): "fifo" = today's order (requeued first, then submission) placing whatever fits,
    # "fair" = scheduler.queue (fair share, quotas, EASY backfill); name a policy "NAME+fair" to switch it
    queue: str = "fifo"
    queue_weights: PriorityWeights = DEFAULT_WEIGHTS
    # checkpoints (design §2 "Asynchronous snapshots"): "sync" = the job stalls for the whole write, C/b;
    # "async" = it stalls for stall_fraction·C/b (the copy to host memory), the copy off the node runs in the
    # background while it trains (durable only when that ends) and the interval is never shorter than the copy.
    # Name a policy "NAME+async" (or pass --ckpt-mode async) to switch it.
    ckpt_mode: str = "sync"
    stall_fraction: float = 0.1
    # work-conserving reserve (design §4.2, HTB ceil; `scheduler.reserve.checkpoint_ceil_bytes_per_s`): under P3
    # traffic, pre-sync writes may borrow the part of research's reserve that research leaves idle this control
    # period (ceil B⁻ − min(R, β·B⁻) − admitted migrations) and P1 plans with that rate; admitted migrations borrow
    # it too (the agent gives every non-research class the same ceil). False = the fixed (1 − β)·B⁻ ceiling of
    # before. TCP policies model no reserve and ignore it.
    reserve_borrow: bool = True
    # the hazard P1 plans Δ at (design §2 "Estimators", `scheduler.estimators.PLAN_HAZARD_QUANTILE`): None = the
    # posterior mean λ̂; a number q = the posterior q-quantile (0.95 = λ⁺, what P1 planned at before)
    plan_hazard_quantile: float | None = PLAN_HAZARD_QUANTILE
    # design §2 "Estimators": P1's hazard also counts scheduled reclaims whose notice is shorter than the job's final
    # checkpoint needs (C/b + T_r at the final-checkpoint test's rate); False = emergencies only (before)
    short_notice_hazard: bool = True
    # where a checkpoint is durable (design §21.1 "The paper's way"): "replica" = the pre-sync replica on the next
    # node of the job's building (design §2), what ReclaimNet and the same-machinery baselines use; "shared" = one
    # shared store across the campus core, as Slurm with DMTCP checkpoints on shared storage: no pre-sync replica in
    # the building, so every restart after a reclaim reads its checkpoint across the core
    checkpoint_store: str = "replica"


RECLAIMNET = Policy("reclaimnet")

_NAMED: dict[str, Policy] = {
    "reclaimnet": RECLAIMNET,
    "slurm-pr": Policy("slurm-pr", interval="fixed", fixed_interval_s=600.0, bandwidth_split="equal",
                       destination="first_fit", traffic="tcp", final_checkpoint=False, requeue_delay_s=60.0),
    "no-migration": Policy("no-migration", interval="local", bandwidth_split="equal", destination="same_node",
                           traffic="tcp", final_checkpoint=False, migrate=False),
    "static": Policy("static", interval="static", bandwidth_split="equal", destination="first_fit",
                     traffic="tcp"),
    "random-dst": Policy("random-dst", destination="random"),
    "no-admission": Policy("no-admission", traffic="tcp"),
    "tv-fixed": Policy("tv-fixed", interval="tv"),
    "oracle": Policy("oracle", interval="oracle", destination="oracle", traffic="p3"),
    # not in design §7: ReclaimNet with P1 fed the true λ(t) and available bandwidth (P2/P3 unchanged),
    # to separate the cost of estimating λ and B from the mechanism itself
    "informed": Policy("informed", interval="informed"),
    # not in design §7: ReclaimNet reading the loss budget as a bound on every emergency, not its mean
    "reclaimnet-strict": Policy("reclaimnet-strict", loss_budget_scale=0.5),
    # not in design §7: ReclaimNet with the research reserve sized from the calibration week's research share
    "reclaimnet-reserve": Policy("reclaimnet-reserve", reserve_quantile=0.95),
    # not in design §7: static Young/Daly held to the same loss budgets (Eq. 9's clip), to separate what the
    # budgets cost from what P1's adaptivity buys; first fit, under the same research reserve as ReclaimNet (P3
    # traffic with the calibrated reserve; design §21.1)
    "static-budget": Policy("static-budget", interval="static-budget", bandwidth_split="equal",
                            destination="first_fit", traffic="p3"),
    # the paper's B3 (design §21.1): a fixed 10-minute interval, no hazard or bandwidth adaptation, and the same
    # migration machinery as ReclaimNet (P2 destination, P3 traffic, final checkpoint): `fixed:600` by name
    "static-10min": Policy("static-10min", interval="fixed", fixed_interval_s=600.0),
    # the paper's baselines as the paper ran them (design §21.1 "The paper's way"), beside the same-machinery rows
    # above: Slurm preempt + requeue from the last checkpoint on shared storage (no pre-sync replica), DMTCP every
    # 10 min, the notice ignored, requeued after 60 s on the first free node, no admission; and a fixed 10-min
    # interval with no admission (TCP sharing with research), P2 and the final checkpoint kept
    "slurm-pr-paper": Policy("slurm-pr-paper", interval="fixed", fixed_interval_s=600.0, bandwidth_split="equal",
                             destination="first_fit", traffic="tcp", final_checkpoint=False, requeue_delay_s=60.0,
                             checkpoint_store="shared"),
    "static-10min-paper": Policy("static-10min-paper", interval="fixed", fixed_interval_s=600.0, traffic="tcp"),
    # not in design §7: ReclaimNet with the research reserve a fixed cap (no HTB borrowing, design §4.2): what
    # ReclaimNet did before the work-conserving reserve, kept to measure what borrowing buys
    "reclaimnet-fixed-reserve": Policy("reclaimnet-fixed-reserve", reserve_borrow=False),
    # not in design §7: ReclaimNet with research's reserve β = 0.3 on every link, never calibrated (design §4.1): what
    # ReclaimNet's default reserve was before the portal's daily calibration became the simulator's too
    "reclaimnet-beta": Policy("reclaimnet-beta", reserve="fixed"),
}

POLICY_NAMES: tuple[str, ...] = (*_NAMED, "fixed:SECONDS")


def ablation(p1: bool, p2: bool, p3: bool) -> Policy:
    """One of the 8 on/off combinations: off P1 = static Young/Daly + equal split, off P2 = first fit,
    off P3 = TCP proportional share."""
    name = "abl-" + "".join("1" if x else "0" for x in (p1, p2, p3))
    return Policy(name, interval="p1" if p1 else "static", bandwidth_split="p1" if p1 else "equal",
                  destination="p2" if p2 else "first_fit", traffic="p3" if p3 else "tcp")


ABLATIONS: tuple[Policy, ...] = tuple(ablation(a, b, c) for a in (True, False) for b in (True, False)
                                      for c in (True, False))


CKPT_MODES = ("sync", "async")


def with_ckpt_mode(policy: Policy, mode: str, stall_fraction: float | None = None) -> Policy:
    """``policy`` with synchronous or asynchronous checkpoints (design §2 "Asynchronous snapshots"); an
    asynchronous variant is named ``NAME+async`` so both can be reported side by side. ValueError if unknown."""
    if mode not in CKPT_MODES:
        raise ValueError(f"unknown checkpoint mode {mode!r}; one of {', '.join(CKPT_MODES)}")
    frac = policy.stall_fraction if stall_fraction is None else float(stall_fraction)
    if not 0.0 <= frac <= 1.0:
        raise ValueError(f"stall fraction must be from 0 to 1, got {frac!r}")
    if mode == "sync":
        return policy
    name = policy.name if policy.name.endswith("+async") else f"{policy.name}+async"
    return replace(policy, name=name, ckpt_mode="async", stall_fraction=frac)


def get_policy(name: str) -> Policy:
    """Policy by its design §7 name (also ``fixed:SECONDS``, ``abl-XYZ``, ``NAME+fair``: that policy with
    the fair queue of design §16.5, and ``NAME+async``: with asynchronous snapshot checkpoints, design §2);
    ValueError if unknown."""
    if name.endswith("+fair"):
        return replace(get_policy(name[: -len("+fair")]), name=name, queue="fair")
    if name.endswith("+async"):
        return with_ckpt_mode(get_policy(name[: -len("+async")]), "async")
    if name in _NAMED:
        return _NAMED[name]
    if name.startswith("fixed:"):
        try:
            sec = float(name.split(":", 1)[1])
        except ValueError:
            raise ValueError(f"bad fixed interval in {name!r}") from None
        if not sec > 0:
            raise ValueError(f"fixed interval must be > 0 in {name!r}")
        return replace(RECLAIMNET, name=name, interval="fixed", fixed_interval_s=sec)
    for p in ABLATIONS:
        if p.name == name:
            return p
    raise ValueError(f"unknown policy {name!r}; one of {', '.join(POLICY_NAMES)} abl-XYZ or NAME+fair")
