"""The control loop (design §9.4, §9.5): the tick, the estimators, the embedded default's in-process loops."""
