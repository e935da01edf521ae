"""Property tests: whatever JSON arrives, the API answers 2xx/400/409 — never a 500 — and 400s name the field."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.portal.conftest import World

JSON_SCALARS = st.one_of(
    st.none(), st.booleans(), st.integers(min_value=-(2**70), max_value=2**70),
    st.floats(allow_nan=False, allow_infinity=False), st.text(max_size=40),
)
JSON_VALUES = st.recursive(JSON_SCALARS, lambda inner: st.lists(inner, max_size=3)
                           | st.dictionaries(st.text(max_size=8), inner, max_size=3), max_leaves=6)
FUZZ = settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])


@pytest.mark.django_db
@FUZZ
@given(value=JSON_VALUES)
def test_reclaim_notice_never_500(value: Any, world: World, client_for: Any) -> None:
    response = client_for("provider").post(f"/api/nodes/{world.other_node.pk}/reclaim/", {"notice_s": value},
                                           format="json")
    assert response.status_code == 403  # not their node: refused before the body is even read
    response = client_for("admin").post(f"/api/nodes/{world.node.pk}/reclaim/", {"notice_s": value},
                                        format="json")
    assert response.status_code in (201, 400, 409)
    if response.status_code == 400:
        assert "notice_s" in response.json()


@pytest.mark.django_db
@FUZZ
@given(field=st.sampled_from(["name", "gpu_count", "vram_gb_per_gpu", "min_capability", "expected_runtime_s",
                              "ckpt_bytes_estimate", "loss_budget_s", "restart_s", "priority_class", "command"]),
       value=JSON_VALUES)
def test_job_submit_never_500(field: str, value: Any, world: World, client_for: Any) -> None:
    body = {"name": "j", "command": "python x.py", "gpu_count": 1, "expected_runtime_s": 60,
            "ckpt_bytes_estimate": 1000, field: value}
    response = client_for("researcher").post("/api/jobs/", body, format="json")
    assert response.status_code in (201, 400)
    if response.status_code == 400:
        assert field in response.json()
