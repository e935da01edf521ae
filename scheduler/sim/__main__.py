"""CLI (design §7): ``python -m scheduler.sim --trace FILE --policy NAME --json``.

A trace with gang or elastic jobs (``members``/``min_members``, design §21.6) runs on `scheduler.sim.gangs` with
one of its policies (reclaimnet, reclaimnet-rigid, gang-requeue, slurm-gang) and prints its summary.

Bad input exits 2 with one JSON object ``{"error": "..."}`` naming the field, nothing else printed.
"""

from __future__ import annotations

import argparse
import json
import sys

from scheduler.sim.adapters import load_any
from scheduler.sim.engine import simulate
from scheduler.sim.gangs import GANG_POLICIES, simulate_gangs
from scheduler.sim.metrics import summarise
from scheduler.sim.policies import get_policy, with_ckpt_mode
from scheduler.sim.trace import Trace, TraceError, gang_columns


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # argparse would print usage and exit 2 with text
        raise TraceError("arguments", message)


def main(argv: list[str] | None = None) -> int:
    ap = _Parser(prog="python -m scheduler.sim", description="ReclaimNet campus simulator (design §7)")
    ap.add_argument("--trace", required=True, help="design §7 JSON file or CSV folder, or ext:NAME")
    ap.add_argument("--policy", required=True)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json", action="store_true", help="print one JSON object (the default output)")
    ap.add_argument("--ckpt-mode", default="sync", help="sync | async: checkpoints stall the job for the whole "
                    "write, or only for a snapshot (design §2 \"Asynchronous snapshots\")")
    ap.add_argument("--stall-fraction", type=float, default=None,
                    help="async: the snapshot's stall as a fraction of the write (default: the policy's, 0.1)")
    try:
        args = ap.parse_args(argv)
        trace = load_any(args.trace)
        members, low = gang_columns(trace)
        if (members > 1).any() or (low < members).any():
            return _gangs(trace, args.policy, args.ckpt_mode)
        try:
            policy = get_policy(args.policy)
        except ValueError as e:
            raise TraceError("policy", str(e)) from None
        try:
            policy = with_ckpt_mode(policy, args.ckpt_mode, args.stall_fraction)
        except ValueError as e:
            raise TraceError("ckpt_mode" if "mode" in str(e) else "stall_fraction", str(e)) from None
    except TraceError as e:
        print(json.dumps({"error": str(e), "field": e.field}))
        return 2
    result = summarise(simulate(trace, policy, seed=args.seed), trace.horizon_s)
    keys = ("work_lost_gpu_h", "downtime_median_s", "downtime_p99_s", "migration_success",
            "traffic_degradation", "gpu_utilization", "jobs_done")
    out = {k: result[k] for k in keys}
    print(json.dumps(out) if args.json else json.dumps(result, indent=2))
    return 0


def _gangs(trace: Trace, policy: str, ckpt_mode: str) -> int:
    """A trace with gangs: the gang simulator's policies only, synchronous coordinated saves."""
    if policy not in GANG_POLICIES:
        raise TraceError("policy", f"a trace with gang or elastic jobs runs one of {', '.join(GANG_POLICIES)}, "
                                   f"not {policy!r}")
    if ckpt_mode != "sync":
        raise TraceError("ckpt_mode", "gangs save synchronously (coordinated); async applies to one-node traces")
    print(json.dumps(simulate_gangs(trace, policy).summary()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
