"""The fair queue (design §16.6): quotas, fair share, priorities, arrays and dependencies around placement."""
