"""The researcher's and provider's terminal: a Python client over the portal's REST API and the ``reclaimnet``
command line (design §13). Standard library only, plus PyYAML for job specs; no Django."""

from reclaimnet.client import (
    ApiError,
    AuthError,
    ChecksumMismatch,
    Client,
    Conflict,
    NotFound,
    Refused,
    ServerError,
    Unreachable,
)

__all__ = ["ApiError", "AuthError", "ChecksumMismatch", "Client", "Conflict", "NotFound", "Refused",
           "ServerError", "Unreachable"]
