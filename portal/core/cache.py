"""Django's Redis cache with one connection pool per process (docs/design.md §10).

Django keeps its cache objects per request context, and each ``RedisCache`` builds its own connection pool and
a new ``redis.Redis`` client for every command. So every request that touched the cache (an API token checked
against the bad-token lockout, a signed-in session) opened a new TCP connection to Redis, and redis-py read its
own package metadata from disk to name itself to the server: about 2 ms of CPU per request under ``make load``.
Here the pool and the client are made once per process (per server address) and shared by every thread.
"""

from __future__ import annotations

import os
import threading
from typing import Any

from django.core.cache.backends.redis import RedisCache as DjangoRedisCache
from django.core.cache.backends.redis import RedisCacheClient

_lock = threading.Lock()
_clients: dict[tuple[int, str], Any] = {}  # (pid, server) -> redis.Redis over one shared pool


class SharedPoolRedisCacheClient(RedisCacheClient):
    """A ``RedisCacheClient`` whose pools and clients are shared by every instance in this process."""

    def get_client(self, key: Any = None, *, write: bool = False) -> Any:
        index = self._get_connection_pool_index(write)
        ident = (os.getpid(), self._servers[index])  # a forked child builds its own
        client = _clients.get(ident)
        if client is None:
            with _lock:
                client = _clients.get(ident)
                if client is None:
                    pool = self._pool_class.from_url(self._servers[index], **self._pool_options)
                    client = _clients[ident] = self._client(connection_pool=pool)
        return client


class RedisCache(DjangoRedisCache):
    """``django.core.cache.backends.redis.RedisCache`` over :class:`SharedPoolRedisCacheClient`."""

    def __init__(self, server: str, params: dict[str, Any]) -> None:
        super().__init__(server, params)
        self._class = SharedPoolRedisCacheClient
