# Kernel enforcement (design §4): benchmark and tests on real TCP between network namespaces (needs root).
# Included by the main Makefile (`-include mk/*.mk`), which defines VENV, PY and the `venv` target; the
# defaults below only matter when this file is used on its own.
VENV ?= .venv
PY ?= $(VENV)/bin/python

.PHONY: net-deps bench-net test-net

net-deps:
	scripts/install_kernel_deps.sh

# Set vs achieved wire rate (classifier+HTB, drop token bucket, plain HTB), kill-switch latency vs iptables.
bench-net: venv
	scripts/install_kernel_deps.sh
	$(PY) scripts/bench_net.py

test-net: venv net-deps
	$(VENV)/bin/pytest tests/net -p no:django -q  # these tests need no Django
