"""State machines: the only code that moves a job's or a node's state."""

from portal.core.lifecycle.base import ConcurrentTransition, InvalidTransition

__all__ = ["ConcurrentTransition", "InvalidTransition"]
