"""The agent's checkpoint data plane commands (design §1-§4): expect a replica, send one at P3's rate, change that
rate in place, report what arrived or was refused, drop replicas the portal no longer needs. A mixin of
:class:`nodeagent.agent.Agent`, which owns the state used here (``receiver``, ``sending``, ``data_dir``, ``edge``,
``faults``, ``held``, ``jobs``) and the link (``send``, ``_spawn``, ``sync_held``); the portal's side is
``portal/control/link/protocol.py``."""

from __future__ import annotations

import contextlib
import json
import logging
import time
from typing import Any

from nodeagent import jobkit
from nodeagent.transfer import Expected, SendControl, send_checkpoint, store_dir, token_hash

log = logging.getLogger("nodeagent")


class CheckpointCommands:
    """``expect_checkpoint``, ``send_checkpoint``, ``set_rate``, ``drop_checkpoints`` and the receiver's callbacks."""

    # set by Agent.__init__ (declared for the type checker)
    receiver: Any
    sending: dict[str, SendControl]
    data_dir: Any
    edge: Any
    faults: Any
    held: dict[str, dict[int, str]]
    jobs: dict[str, Any]

    async def _cmd_expect_checkpoint(self, msg: dict[str, Any]) -> None:
        self.receiver.expect(Expected(
            transfer_id=str(msg["transfer_id"]), token_hash=token_hash(str(msg["token"])),
            job_id=str(msg["job_id"]), sequence=int(msg["sequence"]), sha256=str(msg["sha256"]),
            size_bytes=int(msg["size_bytes"]), expires_at=time.time() + float(msg.get("expires_in_s", 600)),
        ))

    async def _cmd_send_checkpoint(self, msg: dict[str, Any]) -> None:
        self._spawn(self._send_checkpoint(msg))

    async def _send_checkpoint(self, msg: dict[str, Any]) -> None:
        job_id, sequence = str(msg["job_id"]), int(msg["sequence"])
        try:
            ckpt = store_dir(self.data_dir, job_id)
        except ValueError as exc:  # runs as its own task: report the failure, never leave it unobserved
            log.warning("send_checkpoint refused: %s", exc)
            ckpt = None
        manifest = next((m for m in jobkit.list_manifests(ckpt) if m.sequence == sequence), None) if ckpt else None
        if manifest is None or ckpt is None or (ckpt / manifest.file).is_symlink():
            await self.send({"type": "transfer_sent", "transfer_id": msg["transfer_id"], "ok": False,
                             "attempts": 0, "elapsed_s": 0.0, "errors": ["checkpoint not on this node"]})
            return
        tid = str(msg["transfer_id"])
        flow_class = str(msg.get("flow_class", "migration"))
        control = self.sending.setdefault(tid, SendControl(msg.get("rate_bytes_per_s"), flow_class))
        try:
            result = await send_checkpoint(
                host=str(msg["dest_host"]), port=int(msg["dest_port"]), transfer_id=tid,
                token=str(msg["token"]), ckpt_path=ckpt / manifest.file,
                manifest=json.loads(manifest.to_json()), rate_bytes_per_s=control.rate_bytes_per_s,
                flow_class=flow_class, edge=self.edge, faults=self.faults, control=control,
            )
        finally:
            self.sending.pop(tid, None)
        await self.send({"type": "transfer_sent", "transfer_id": msg["transfer_id"], "ok": result.ok,
                         "attempts": result.attempts, "elapsed_s": result.elapsed_s, "errors": result.errors[-5:]})

    async def _cmd_set_rate(self, msg: dict[str, Any]) -> None:
        """P3 re-planned a transfer this node is sending (design §4): apply the new rate to it in place."""
        control = self.sending.get(str(msg.get("transfer_id")))
        rate = msg.get("rate_bytes_per_s")
        if control is None or not isinstance(rate, int | float) or isinstance(rate, bool) or not rate > 0:
            log.info("set_rate for %s ignored (not sending it, or no valid rate)", msg.get("transfer_id"))
            return
        control.set_rate(self.edge, float(rate))

    async def _on_received(self, transfer_id: str, manifest: dict[str, Any]) -> None:
        with contextlib.suppress(KeyError, TypeError, ValueError):
            self.held.setdefault(str(manifest["job_id"]), {})[int(manifest["sequence"])] = str(manifest["sha256"])
        await self.send({"type": "transfer_received", "transfer_id": transfer_id, "sha256": manifest["sha256"],
                         "size_bytes": int(manifest["size_bytes"])})

    async def _on_rejected(self, transfer_id: str, reason: str) -> None:
        await self.send({"type": "transfer_rejected", "transfer_id": transfer_id, "reason": reason})

    async def _cmd_drop_checkpoints(self, msg: dict[str, Any]) -> None:
        """The portal no longer needs replicas of a job below ``keep_from`` (pre-sync garbage collection)."""
        ckpt = store_dir(self.data_dir, str(msg["job_id"]))
        for m in jobkit.list_manifests(ckpt):
            if m.sequence < int(msg.get("keep_from", 0)) and str(msg["job_id"]) not in self.jobs:
                jobkit.remove_checkpoint(ckpt, m.sequence)
        jobkit.remove_orphan_temporaries(ckpt)  # a dead writer's leftovers go with the pruned checkpoints
        await self.sync_held()
