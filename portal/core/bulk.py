"""Write many rows in a fixed number of statements (the control tick's writes at 5,000 nodes)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from django.db import connection, models

PG_TYPES = {"FloatField": "float8", "BooleanField": "bool", "BigAutoField": "bigint", "AutoField": "int",
            "IntegerField": "int", "BigIntegerField": "bigint", "PositiveIntegerField": "int",
            "ForeignKey": "bigint", "OneToOneField": "bigint", "DateTimeField": "timestamptz",
            "CharField": "text", "TextField": "text"}


def update_columns(model: type[models.Model], key: str, keys: Sequence[Any], values: dict[str, Sequence[Any]]) -> int:
    """``UPDATE model SET col = v.col … WHERE model.key = v.key`` for every (key, values) row, in one statement on
    PostgreSQL (``FROM unnest(…)``) and in one ``bulk_update`` elsewhere. Returns the rows matched."""
    if not keys:
        return 0
    meta = model._meta
    columns = {name: meta.get_field(name) for name in values}
    key_field = meta.pk if key == "pk" else meta.get_field(key)
    if connection.vendor != "postgresql":
        objects = list(model._default_manager.filter(**{f"{key}__in": list(keys)}))
        by_key = {getattr(obj, key_field.attname): obj for obj in objects}
        for i, k in enumerate(keys):
            obj = by_key.get(k)
            if obj is not None:
                for name, column in values.items():
                    setattr(obj, name, column[i])
        model._default_manager.bulk_update(list(by_key.values()), list(values), batch_size=500)
        return len(by_key)
    names = ["k", *(f"c{i}" for i in range(len(columns)))]
    types = [PG_TYPES[key_field.get_internal_type()], *(PG_TYPES[f.get_internal_type()] for f in columns.values())]
    sets = ", ".join(f'"{field.column}" = v.c{i}' for i, field in enumerate(columns.values()))
    unnest = ", ".join(f"%s::{t}[]" for t in types)
    sql = (f'UPDATE "{meta.db_table}" AS t SET {sets} FROM unnest({unnest}) AS v({", ".join(names)}) '
           f'WHERE t."{key_field.column}" = v.k')
    with connection.cursor() as cur:
        cur.execute(sql, [list(keys), *(list(values[name]) for name in columns)])
        return cur.rowcount
