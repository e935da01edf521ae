# Asynchronous snapshot checkpoints (design §2 "Asynchronous snapshots", §17.6): `make bench-ckpt` checkpoints a
# ~1 GB PyTorch training state (a model and its Adam moments) through jobkit into a temporary directory on disk,
# synchronously and as an asynchronous snapshot, and counts a small CPU training loop's steps while the background
# write runs against an idle run. Installs the torch extra first (`torch-deps`). Last line:
# `bench-ckpt: sync stall X s, async stall Y s, ratio R`.
#
# `make gpu-check` (scripts/gpu_check.py, design §17.7): on a machine with an NVIDIA GPU, the agent's NVML inventory
# (MIG, processes, utilisation), a CUDA job checkpointed and restored bitwise through jobkit, and bench-ckpt on CUDA,
# in at most 8 minutes. Without a GPU it says so in one line and exits 0.
.PHONY: bench-ckpt gpu-check

bench-ckpt: venv torch-deps
	$(PY) scripts/bench_ckpt.py

gpu-check: venv torch-deps
	timeout 480 $(PY) scripts/gpu_check.py
