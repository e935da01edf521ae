"""``GET /api/ladder/``: the published ladder (design §15) — each priority class's loan, idle rule, notice, grace
and what it may borrow, the classes the idle watchdog never touches and how a reclaim proceeds. Any signed-in
user may read it; it is the page ``/ladder/`` as JSON (both from ``portal.control.ladder.ladder_facts``)."""

from __future__ import annotations

from drf_spectacular.utils import extend_schema
from rest_framework import serializers
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from portal.control.ladder import ladder_facts


class ClassTermsSerializer(serializers.Serializer):
    priority_class = serializers.ChoiceField(choices=["interactive", "standard", "best_effort"])
    label = serializers.CharField()
    rank = serializers.IntegerField(help_text="order on the ladder, 0 first")
    summary = serializers.CharField()
    max_gpus_per_job = serializers.IntegerField(allow_null=True, help_text="GPUs one job may borrow; null: no limit")
    max_loan_s = serializers.FloatField(allow_null=True,
                                        help_text="seconds a job may hold its GPUs per loan; null: no limit")
    loan_end = serializers.ChoiceField(choices=["suspend", "requeue"],
                                       help_text="where a job goes when its loan ends")
    idle_watch = serializers.BooleanField(help_text="false: the idle watchdog never touches this class")
    idle_limit_s = serializers.FloatField(allow_null=True,
                                          help_text="seconds with no GPU use and no progress before the warning; "
                                                    "null when the watchdog never touches the class")
    notice_s = serializers.FloatField(help_text="seconds between the warning and the release")
    grace_s = serializers.FloatField(help_text="seconds a released job gets to write its final checkpoint")


class ReclaimStepSerializer(serializers.Serializer):
    step = serializers.ChoiceField(choices=["warn", "drain", "force"])
    text = serializers.CharField()


class LadderSerializer(serializers.Serializer):
    classes = ClassTermsSerializer(many=True)
    watchdog_never = serializers.ListField(child=serializers.CharField(),
                                           help_text="classes whose jobs the idle watchdog never releases")
    idle_util_pct = serializers.FloatField(help_text="below this mean GPU utilisation a job's GPUs show no use")
    reclaim_sequence = ReclaimStepSerializer(many=True)
    reclaim_order = serializers.CharField(help_text="which jobs leave a reclaimed node, and in what order")


class LadderView(APIView):
    """The ladder: what each priority class may borrow and for how long (design §15)."""

    @extend_schema(responses=LadderSerializer)
    def get(self, request: Request) -> Response:
        return Response(ladder_facts())
