"""The simulator's job states (design §2-§4): one code per state, shared by `engine`, `control` and `placement`."""

FUTURE, QUEUED, RUNNING, MOVING, RESTART, DONE, WAITNODE = range(7)
