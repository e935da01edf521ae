"""Trace-driven campus simulator for ReclaimNet (design §6-§7).

- `trace`: the design §7 trace format (JSON file or CSV folder), validation naming the field;
- `tracegen`: the synthetic two-month, 54-node campus matching design §6 (`python -m scheduler.sim.tracegen`);
- `adapters`: external traces (bamboo spot, skypilot availability, alibaba job mix) mapped onto the campus;
- `engine` (+ `cycles`, `network`): the event-driven simulator calling the production P1/P2/P3/estimators;
- `policies`: reclaimnet, slurm-pr, no-migration, static, random-dst, no-admission, tv-fixed, oracle,
  fixed:SECONDS and the 8 P1/P2/P3 ablations, each also as NAME+fair (the fair queue of design §16);
  `metrics`: the design §7 numbers; `report`: the markdown report; `queuebench`: the fair queue on a busy campus.

CLI: ``python -m scheduler.sim --trace FILE --policy NAME --json``.
"""
