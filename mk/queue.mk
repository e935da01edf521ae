# The fair queue (design §16.5): `make bench-queue` times one pass of scheduler/queue.py on 100 nodes and
# 2,000 waiting jobs, then simulates a busy campus of three groups with equal shares and unequal demand with
# the fair queue and with today's order (fifo). Last line:
# `queue: jain fair X fifo Y, p95 wait 4-GPU fair A h fifo B h`.
.PHONY: bench-queue

bench-queue: venv
	$(PY) scripts/bench_queue.py
