"""Plain words for lifecycle states and refusals, for the messages people read (pages, 409 answers).

One place turns a state value into words, so no message shows an enum's repr ("NodeState.DRAINING") or a raw
value where a sentence belongs. Keyed by the stored values (plain strings; a TextChoices member compares equal),
so this module imports no model and the lifecycle modules may use it.
"""

from __future__ import annotations

# What "the node is …" / "the job is …" says for each state (design §1's lifecycles).
NODE_STATES: dict[str, str] = {
    "registered": "registered and waiting for its agent to connect",
    "online": "online and lent",
    "offline": "offline (its agent is not connected)",
    "draining": "being drained for a reclaim with notice",
    "reclaimed": "already reclaimed",
    "retired": "retired",
}
JOB_STATES: dict[str, str] = {
    "queued": "queued, waiting for a GPU",
    "running": "running",
    "migrating": "moving to another node",
    "completed": "completed",
    "failed": "failed",
    "cancelled": "cancelled",
    "suspended": "suspended (released while idle or at the end of its loan; its owner can resume it)",
}
# What the refused action would have done, by the state it asked for ("cannot …").
NODE_TARGETS: dict[str, str] = {
    "registered": "be registered again",
    "online": "come online",
    "offline": "be lent again",
    "draining": "be reclaimed with notice",
    "reclaimed": "be reclaimed",
    "retired": "be retired",
}
JOB_TARGETS: dict[str, str] = {
    "queued": "go back to the queue",
    "running": "start",
    "migrating": "move to another node",
    "completed": "complete",
    "failed": "be marked failed",
    "cancelled": "be cancelled",
    "suspended": "be suspended",
}
# What the person can do instead, by (current state, refused target); a target of None matches any.
NODE_HINTS: dict[tuple[str, str | None], str] = {
    ("draining", None): "An emergency reclaim or the kill-switch takes it back now.",
    ("reclaimed", None): "It is its lab's again; use “Lend again” to lend it.",
    ("retired", None): "A retired node can no longer be lent or reclaimed.",
    ("online", "offline"): "Only a reclaimed node can be lent again.",
    ("offline", "offline"): "Only a reclaimed node can be lent again.",
    ("registered", "offline"): "Only a reclaimed node can be lent again.",
}
JOB_HINTS: dict[tuple[str, str | None], str] = {
    ("completed", None): "It has finished; nothing is left to stop.",
    ("failed", None): "It has finished; nothing is left to stop.",
    ("cancelled", None): "It has finished; nothing is left to stop.",
    ("suspended", "running"): "Resume it first: it goes back to the queue and starts from its checkpoint.",
}

_STATES = {"node": NODE_STATES, "job": JOB_STATES}
_TARGETS = {"node": NODE_TARGETS, "job": JOB_TARGETS}
_HINTS = {"node": NODE_HINTS, "job": JOB_HINTS}


def _value(state: object) -> str:
    """The stored value of a state, whether given as a plain string or an enum member."""
    return str(getattr(state, "value", state))


def state_words(machine: str, state: object) -> str:
    """"being drained for a reclaim with notice" for ("node", "draining"); the value with "_" as spaces for a
    state this module does not know (a new state never shows as an enum repr)."""
    value = _value(state)
    return _STATES.get(machine, {}).get(value, value.replace("_", " "))


def refusal(machine: str, current: object, target: object, subject: str | None = None) -> str:
    """The sentence a person reads when the lifecycle refuses a change, e.g. "The node is being drained for a
    reclaim with notice, so it cannot be reclaimed with notice. An emergency reclaim or the kill-switch takes
    it back now." ``machine`` is "node" or "job" (others read "the reclaim", "the transfer", …); ``subject``
    names the object instead ("vision-01 is being drained …")."""
    what = subject or "The " + machine.replace("_", " ")
    target_value = _value(target)
    action = _TARGETS.get(machine, {}).get(target_value, "become " + target_value.replace("_", " "))
    sentence = f"{what} is {state_words(machine, current)}, so it cannot {action}."
    hints = _HINTS.get(machine, {})
    hint = hints.get((_value(current), target_value)) or hints.get((_value(current), None))
    return f"{sentence} {hint}" if hint else sentence


# Why a job resumed from an earlier checkpoint instead of leaving with a final one (Migration.degraded_reason).
DEGRADED_REASONS: dict[str, str] = {
    "emergency": "emergency reclaim, no notice",
    "killswitch": "kill-switch, no notice",
    "heartbeat_lost": "the node stopped answering",
    "deadline": "the notice ran out before a final checkpoint",
    "notice": "the notice was too short to send a final checkpoint",
    "cap": "the final checkpoint could not be sent fast enough",
    "capacity": "the network had no room to send a final checkpoint",
    "transfer failed": "sending the final checkpoint failed",
    "agent restarted": "the node's agent restarted",
    "requeued": "it waited in the queue for a node",
}


def degraded_reason_words(reason: object) -> str:
    """Plain words for a ``Migration.degraded_reason`` value ("" stays "")."""
    value = _value(reason or "")
    return DEGRADED_REASONS.get(value, value.replace("_", " "))
