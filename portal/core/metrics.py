"""Prometheus metrics at ``/metrics`` (design §6 quantities: nodes, jobs, reclaims, migrations, work lost).

Values are read from the database at scrape time by a custom collector, so every portal process reports the
same numbers and nothing has to be kept in process memory. They are ``utilization_summary()``'s, the campus read
model's counts the admin dashboard shows too, and the GPU gauges' HELP is the definition the dashboard shows on
hover (``summary.DEFINITIONS``, docs/design.md §9.1).

Access: a signed-in staff user (session), or ``Authorization: Bearer <METRICS_TOKEN>`` when the
``METRICS_TOKEN`` environment variable (or ``settings.METRICS_TOKEN``) is set. Anyone else gets 401/403. The
counts are campus-wide and reveal lab activity, so the endpoint is not public.
"""

from __future__ import annotations

import secrets
from collections.abc import Iterator

from django.conf import settings
from django.http import HttpRequest, HttpResponse
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from portal.control.models import LinkCounter
from portal.core.services.summary import DEFINITIONS, shared_utilization_summary
from portal.env import env_str


class CampusCollector:
    """Collects the campus summary on every scrape."""

    def collect(self) -> Iterator[Metric]:
        summary = shared_utilization_summary()
        nodes = GaugeMetricFamily("reclaimnet_nodes", "Nodes by lifecycle state", labels=["state"])
        for state, count in summary["nodes_by_state"].items():
            nodes.add_metric([state], count)
        yield nodes
        jobs = GaugeMetricFamily("reclaimnet_jobs", "Jobs by lifecycle state", labels=["state"])
        for state, count in summary["jobs_by_state"].items():
            jobs.add_metric([state], count)
        yield jobs
        reclaims = CounterMetricFamily("reclaimnet_reclaims", "Reclaim events by kind", labels=["kind"])
        for kind, count in summary["reclaims_by_kind"].items():
            reclaims.add_metric([kind], count)
        yield reclaims
        migrations = CounterMetricFamily("reclaimnet_migrations", "Migrations by mode", labels=["mode"])
        migrations.add_metric(["planned"], summary["migrations"]["planned"])
        migrations.add_metric(["degraded"], summary["migrations"]["degraded"])
        yield migrations
        outcomes = CounterMetricFamily("reclaimnet_migration_outcomes", "Finished migrations", labels=["success"])
        outcomes.add_metric(["true"], summary["migrations"]["succeeded"])
        outcomes.add_metric(["false"], summary["migrations"]["failed"])
        yield outcomes
        yield CounterMetricFamily(
            "reclaimnet_work_lost_seconds", "Job work lost to reclaims (seconds)", value=summary["work_lost_s"]
        )
        yield CounterMetricFamily(
            "reclaimnet_work_lost_gpu_hours", DEFINITIONS["work_lost_gpu_hours"],
            value=summary["work_lost_gpu_hours"],
        )
        link = CounterMetricFamily(
            "reclaimnet_agent_link_events", "Agent-link events: unauthenticated websocket attempts (auth_refused), "
            "messages dropped over the per-session rate, sessions closed for flooding", labels=["event"])
        for name, value in LinkCounter.objects.order_by("name").values_list("name", "value"):
            link.add_metric([name], value)
        yield link
        yield GaugeMetricFamily("reclaimnet_gpus", DEFINITIONS["gpus_total"], value=summary["gpus_total"])
        yield GaugeMetricFamily("reclaimnet_gpus_lendable", DEFINITIONS["gpus_lent"],
                                value=summary["gpus_lendable_online"])
        yield GaugeMetricFamily("reclaimnet_gpus_busy", DEFINITIONS["gpus_busy"], value=summary["gpus_busy"])
        yield GaugeMetricFamily("reclaimnet_gpu_utilization", DEFINITIONS["gpu_utilization"],
                                value=summary["gpu_utilization"])


def metrics_token() -> str:
    return getattr(settings, "METRICS_TOKEN", None) or env_str("METRICS_TOKEN") or ""


def _authorized(request: HttpRequest) -> bool:
    user = getattr(request, "user", None)
    if user is not None and user.is_authenticated and user.is_active and user.is_staff:
        return True
    expected = metrics_token()
    header = request.headers.get("Authorization", "")
    if expected and header.startswith("Bearer "):
        return secrets.compare_digest(header.removeprefix("Bearer ").strip().encode(), expected.encode())
    return False


def metrics_view(request: HttpRequest) -> HttpResponse:
    """``GET /metrics`` in the Prometheus text format (staff session or bearer ``METRICS_TOKEN``)."""
    if request.method not in ("GET", "HEAD"):
        return HttpResponse(status=405, headers={"Allow": "GET, HEAD"})
    if not _authorized(request):
        status = 403 if getattr(request, "user", None) is not None and request.user.is_authenticated else 401
        return HttpResponse("metrics need a staff session or the METRICS_TOKEN bearer token\n", status=status,
                            content_type="text/plain", headers={"WWW-Authenticate": 'Bearer realm="metrics"'})
    registry = CollectorRegistry(auto_describe=False)
    registry.register(CampusCollector())  # type: ignore[arg-type]
    return HttpResponse(generate_latest(registry), content_type=CONTENT_TYPE_LATEST)
