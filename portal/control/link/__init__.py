"""The agent link (design §9): authenticate agents, validate and record what they report, send them commands."""
