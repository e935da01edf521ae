"""`python -m scheduler p1|p2|p3`: one JSON request on stdin, one JSON response on stdout (design §5).

Invalid input exits 2 with `{"error": "..."}` naming the field and prints nothing else; an internal
failure exits 1 with `{"error": "internal: ..."}` (never a traceback).
"""

from __future__ import annotations

import json
import sys
from typing import Any, NoReturn, TextIO

from scheduler.contract import KINDS, ContractError, decide


def _reject_constant(name: str) -> NoReturn:
    raise ContractError("request", f"{name} is not valid JSON (numbers must be finite)")


def _fail(out: TextIO, code: int, message: str) -> int:
    out.write(json.dumps({"error": message}) + "\n")
    return code


def main(argv: list[str] | None = None, stdin: TextIO | None = None, stdout: TextIO | None = None) -> int:
    """Run one decision; returns the exit status (0 ok, 2 invalid request, 1 internal error)."""
    args = sys.argv[1:] if argv is None else argv
    inp = sys.stdin if stdin is None else stdin
    out = sys.stdout if stdout is None else stdout
    if len(args) != 1 or args[0] not in KINDS:
        return _fail(out, 2, f"kind: usage: python -m scheduler {{{'|'.join(KINDS)}}} < request.json")
    # Step 1: parse. Every failure here is the caller's input.
    try:
        request: Any = json.loads(inp.read(), parse_constant=_reject_constant)
    except ContractError as exc:
        return _fail(out, 2, str(exc))
    except json.JSONDecodeError as exc:
        return _fail(out, 2, f"request: invalid JSON ({exc.msg} at line {exc.lineno} column {exc.colno})")
    except UnicodeDecodeError:
        return _fail(out, 2, "request: stdin is not UTF-8 text")
    except RecursionError:
        return _fail(out, 2, "request: JSON nested too deeply")
    except ValueError as exc:  # e.g. an integer literal longer than Python's digit limit
        return _fail(out, 2, f"request: invalid JSON ({exc})")
    # Step 2: validate and decide.
    try:
        response = decide(args[0], request)
        body = json.dumps(response, allow_nan=False)
    except ContractError as exc:
        return _fail(out, 2, str(exc))
    except Exception as exc:  # a bug, not bad input: still one JSON line, no traceback
        return _fail(out, 1, f"internal: {type(exc).__name__}: {exc}")
    out.write(body + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
