"""Operations on the data model: each takes ids or instances, validates, runs in a transaction, audits.

This docstring is the public contract that the API, the web pages and the control plane code against.
Import from the submodule (``from portal.core.services import nodes as node_services``).

Conventions for every function below:

- ``actor`` is the ``User`` doing it. ``actor=None`` means "the system" (control plane, management commands):
  no permission check, audited with no actor. Human callers must always pass the user.
- Bad input raises ``django.core.exceptions.ValidationError`` with a dict ``{field: [message]}``
  (``exc.message_dict``), so forms can ``form.add_error(None, exc)`` and the API answers 400 naming the field.
- A user acting on an object they may not act on raises ``django.core.exceptions.PermissionDenied``
  (rules in ``portal.core.permissions``).
- A state change the lifecycle refuses raises ``portal.core.lifecycle.InvalidTransition`` (or
  ``ConcurrentTransition`` if another worker won the race); nothing is changed in either case.
- Everything runs in ``transaction.atomic``, writes one ``AuditLog`` row, and queues control-plane work with
  ``portal.core.outbox.enqueue`` in the same transaction (the outbox hands it over after commit; nothing here
  calls a Celery task or talks to the broker).

``portal.core.services.nodes`` (design §1 providers, nodes, lending windows)
    register_node(actor, *, provider, building, name, gpus, gpu_floor=0, access_link_bytes_per_s=125e6,
                  lending_windows=()) -> tuple[Node, str]
        Creates the node (state ``registered``), its GPUs (``gpus`` = list of dicts, one per GPU:
        ``{"model", "vram_gb"?, "compute_capability"?, "driver_version"?, "cuda_version"?, "uuid"?}``; model
        from ``gpu_catalogue``, missing VRAM/capability from its defaults) and its access link to the building
        switch. Returns the node and the raw one-time agent token (only its SHA-256 is stored).
    update_node(node, actor, *, name=..., gpu_floor=..., access_link_bytes_per_s=..., owner_use_policy=...) -> Node
    set_lending_windows(node, actor, windows) -> list[LendingWindow]
        Replaces all windows (``[{"weekday": 0-6, "start_time": time, "end_time": time}]``); [] = always lent.
    rotate_agent_token(node, actor) -> str           new raw token; the old one stops working at once.
    revoke_agent_token(node, actor) -> None          no token works until the next rotation.
    node_for_agent_token(raw_token) -> Node | None   agent authentication (revoked or unknown -> None).
    lend_again(node, actor) -> Node                  reclaimed -> offline; clears the kill-switch;
                                                     queues control.node_lent_again(node.id).
    retire_node(node, actor) -> Node

``portal.core.services.reclaims`` (design §1 reclaim kinds, warn -> drain -> force)
    request_reclaim(node, actor, notice_s, *, killswitch=False, reason="") -> ReclaimEvent
        notice_s > 0: scheduled (online node -> draining; a node with nothing to drain -> reclaimed);
        notice_s == 0: emergency (-> reclaimed); killswitch=True: kill-switch (-> reclaimed and
        ``Node.killswitch_engaged = True``; allowed on an already reclaimed node, which only engages the flag).
        Creates the ReclaimEvent (deadline = now + notice). Queues
        control.run_reclaim(reclaim.id).
    emergency_reclaim(node, actor) -> ReclaimEvent   request_reclaim(node, actor, 0)
    engage_killswitch(node, actor) -> ReclaimEvent   request_reclaim(node, actor, 0, killswitch=True)

``portal.core.services.jobs`` (design §1 jobs; identity: usage is charged to ``group``)
    submit_job(actor, *, group, name, gpu_count, expected_runtime_s, ckpt_bytes_estimate, command="",
               image="", vram_gb_per_gpu=0, min_capability=0, framework="", loss_budget_s=None,
               restart_s=30, priority_class="standard") -> Job
        State ``queued``; queues control.place_job(job.id).
    cancel_job(job, actor) -> Job
        Lifecycle cancel; closes the open placement (``end_reason="cancelled"``, so the control plane finds
        the node to stop it on as the job's latest placement); queues control.stop_cancelled_job(job.id).

``portal.core.services.gpu_catalogue``
    GPU_CATALOGUE: dict[str, GpuSpec]                canonical model name -> GpuSpec(vram_gb, capability)
    lookup_gpu(model) -> GpuSpec | None              tolerant of "NVIDIA GeForce RTX 3090", "A100-SXM4-80GB"

``portal.control.reclaim.plan`` (design §9.2 plan, then apply; the preview is the planner's answer, writing nothing)
    preview(node, notice_s) -> dict                  per job: outcome, destination, expected loss; the
                                                     shortest loss-free notice.
``portal.core.campus`` (design §9.1 the campus read model)
    topology() -> {"links": [...], "nodes": [...]}   design §5 p2 shape, ids are names.

``portal.core.services.summary``
    utilization_summary() -> dict                    nodes/jobs by state, GPUs, reclaims by kind, migrations,
                                                     work lost (the /api/summary/ body and the metrics source).

``portal.core.services.audit``
    audit(actor, action, obj, **detail) -> AuditLog  for callers outside these services (e.g. the control plane).
"""
