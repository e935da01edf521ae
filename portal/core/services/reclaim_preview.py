"""What a reclaim with a given notice would cost each hosted job (SPEC §1: show C/B + T_r before reclaim).

Contract (used by the provider reclaim dialog and ``/api/nodes/{id}/reclaim-preview/``):

``preview_reclaim(node, notice_s) -> dict`` with
``{"notice_s", "shortest_loss_free_notice_s", "jobs": [{"job_id", "name", "ckpt_bytes", "bandwidth_bytes_per_s",
"restart_s", "leave_s", "loss_free", "work_lost_s"}]}``.
"""
