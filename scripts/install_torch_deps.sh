#!/usr/bin/env bash
# Idempotent: the optional extra "torch" (pyproject.toml: torch==2.13.0 CPU build, transformers, accelerate) into
# the venv, for the PyTorch / Hugging Face job tests (design §17, tests/torch). Already importable at the pinned
# torch version: does nothing and says so. Called by `make test`.
# Never installs an unpinned torch (that pulls a multi-GB CUDA build): the pin comes from the extra.
# pip failing: prints why and exits 1, unless RECLAIMNET_TORCH_OPTIONAL=1, which then exits 0 (and the
# tests/torch tests skip, saying why).
set -euo pipefail
cd "$(dirname "$0")/.."
PY="${PY:-.venv/bin/python}"
say() { echo "install_torch_deps: $*"; }

want_torch="$(sed -n 's/^torch = \["torch==\([0-9.]*\)".*/\1/p' pyproject.toml)"
[ -n "$want_torch" ] || { say "no pinned torch in pyproject.toml's torch extra"; exit 1; }

if "$PY" - "$want_torch" <<'PYEOF' 2>/dev/null
import sys
import accelerate, torch, transformers  # noqa: F401
sys.exit(0 if torch.__version__.split("+")[0] == sys.argv[1] else 1)
PYEOF
then
    say "torch ${want_torch}, transformers, accelerate present, nothing to do"
    exit 0
fi
say "installing the torch extra (torch==${want_torch}, transformers, accelerate)"
constraints=()
if [ -f constraints.txt ]; then constraints=(-c constraints.txt); fi
if ! "$PY" -m pip install -q -e '.[torch]' "${constraints[@]}"; then
    say "pip install failed"
    if [ "${RECLAIMNET_TORCH_OPTIONAL:-0}" = 1 ]; then exit 0; fi
    exit 1
fi
say "installed"
