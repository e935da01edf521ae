# Asynchronous snapshot checkpoints (design §2 "Asynchronous snapshots", §17.6): `make bench-ckpt` checkpoints a
# ~1 GB PyTorch training state (a model and its Adam moments) through jobkit into a temporary directory on disk,
# synchronously and as an asynchronous snapshot, and counts a small CPU training loop's steps while the background
# write runs against an idle run. Needs the torch extra. Last line:
# `bench-ckpt: sync stall X s, async stall Y s, ratio R`.
.PHONY: bench-ckpt

bench-ckpt: venv
	$(PY) scripts/bench_ckpt.py
