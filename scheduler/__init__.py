"""ReclaimNet scheduler core: P1, P2, P3 and their estimators (design §2-§5).

A pure library: numpy/scipy only, no Django, no network, no files. Inputs and outputs are frozen
dataclasses of numpy arrays; validation of untrusted input lives in `scheduler.contract`. Import the
submodules directly: `scheduler.p1`, `scheduler.p2`, `scheduler.p3`, `scheduler.topology`,
`scheduler.estimators`, `scheduler.contract`, `scheduler.queue` (the fair queue, design §16).
"""
