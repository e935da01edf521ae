"""``/api/notify/…``: preferences, webhooks (CRUD, "send test") and the delivery log (docs/design.md §12).

A user sees and changes only their own preferences; sees their own webhooks and those of their research groups
and labs (members manage a group's webhooks; admins all); sees the deliveries addressed to them or to a webhook
they see. Anything else answers 404. A webhook's secret is answered once, by the request that created it."""

from __future__ import annotations

from typing import Any

from django.db import transaction
from django.db.models import Q, QuerySet
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiParameter, extend_schema, extend_schema_view
from rest_framework import mixins, serializers, status, viewsets
from rest_framework.decorators import action
from rest_framework.exceptions import NotFound
from rest_framework.request import Request
from rest_framework.response import Response

from portal.core import events
from portal.core.models import Provider, ResearchGroup
from portal.core.permissions import is_admin
from portal.notify import dispatch, preferences, signing, targets
from portal.notify.models import Attempt, Channel, Delivery, DeliveryStatus, EmailMode, Preference, Webhook

# --- preferences -----------------------------------------------------------------------------------------------


class PreferenceSerializer(serializers.Serializer):
    event = serializers.CharField(read_only=True, help_text="A catalogue event name, e.g. job.warned.")
    audience = serializers.CharField(read_only=True, help_text="researchers, provider or admins.")
    level = serializers.CharField(read_only=True)
    summary = serializers.CharField(read_only=True)
    toast = serializers.BooleanField(required=False, help_text="Shown as a toast on portal pages.")
    email = serializers.ChoiceField(choices=EmailMode.choices, required=False,
                                    help_text="off, now (a mail at once) or digest (in the periodic digest mail).")
    webhook = serializers.BooleanField(required=False, help_text="Posted to your own webhooks.")
    explicit = serializers.BooleanField(read_only=True, help_text="False: the defaults for this event apply.")


def _preference_row(kind: events.EventType, choice: preferences.Choice, explicit: bool) -> dict[str, Any]:
    return {"event": kind.name, "audience": kind.audience, "level": kind.level, "summary": kind.summary,
            "toast": choice.toast, "email": choice.email, "webhook": choice.webhook, "explicit": explicit}


class PreferenceViewSet(viewsets.ViewSet):
    """Which events reach you, by which channel: the events of the audiences you belong to (research groups,
    labs, admins). Absent choices follow the defaults (design §12)."""

    lookup_field = "event"
    lookup_value_regex = r"[a-z_]+\.[a-z_]+"
    serializer_class = PreferenceSerializer

    def _kind(self, event: str) -> events.EventType:
        if event not in events.CATALOGUE:
            raise NotFound(f"No event {event!r} in the catalogue.")
        return events.CATALOGUE[event]

    @extend_schema(responses=PreferenceSerializer(many=True))
    def list(self, request: Request) -> Response:
        return Response([_preference_row(*row) for row in preferences.table_for(request.user)])

    @extend_schema(parameters=[OpenApiParameter("event", OpenApiTypes.STR, OpenApiParameter.PATH)],
                   responses=PreferenceSerializer)
    def retrieve(self, request: Request, event: str) -> Response:
        kind = self._kind(event)
        row = Preference.objects.filter(user=request.user, event=event).first()
        return Response(_preference_row(kind, preferences.choice_of(row, event), row is not None))

    @extend_schema(parameters=[OpenApiParameter("event", OpenApiTypes.STR, OpenApiParameter.PATH)],
                   request=PreferenceSerializer, responses=PreferenceSerializer)
    def update(self, request: Request, event: str) -> Response:
        kind = self._kind(event)
        data = PreferenceSerializer(data=request.data, partial=True)
        data.is_valid(raise_exception=True)
        with transaction.atomic():
            row = Preference.objects.select_for_update().filter(user=request.user, event=event).first()
            current = preferences.choice_of(row, event)
            values = {"toast": current.toast, "email": current.email, "webhook": current.webhook,
                      **data.validated_data}
            row, _ = Preference.objects.update_or_create(user=request.user, event=event, defaults=values)
        return Response(_preference_row(kind, preferences.choice_of(row, event), True))

    @extend_schema(parameters=[OpenApiParameter("event", OpenApiTypes.STR, OpenApiParameter.PATH)],
                   request=PreferenceSerializer, responses=PreferenceSerializer)
    def partial_update(self, request: Request, event: str) -> Response:
        return self.update(request, event)

    @extend_schema(parameters=[OpenApiParameter("event", OpenApiTypes.STR, OpenApiParameter.PATH)],
                   responses={204: None})
    def destroy(self, request: Request, event: str) -> Response:
        """Back to the defaults for this event."""
        self._kind(event)
        Preference.objects.filter(user=request.user, event=event).delete()
        return Response(status=status.HTTP_204_NO_CONTENT)


# --- webhooks --------------------------------------------------------------------------------------------------

def check_url(url: str) -> str:
    """http(s) only, no credentials, and (unless an operator allows private targets) a host that resolves only
    to public addresses (``targets``; every delivery checks again)."""
    try:
        targets.check_registration(url)
    except targets.RefusedTargetError as exc:
        raise serializers.ValidationError(str(exc)) from None
    return url


class WebhookSerializer(serializers.ModelSerializer):
    scope = serializers.SerializerMethodField(help_text="user (yours), group (a research group's) or provider "
                                                        "(a lab's).")
    url = serializers.URLField(max_length=500, validators=[check_url])
    group = serializers.PrimaryKeyRelatedField(queryset=ResearchGroup.objects.all(), required=False,
                                               allow_null=True, help_text="A research group you are a member of.")
    provider = serializers.PrimaryKeyRelatedField(queryset=Provider.objects.all(), required=False,
                                                  allow_null=True, help_text="A lab you are a member of.")

    class Meta:
        model = Webhook
        fields = ["id", "name", "url", "scope", "group", "provider", "enabled", "created_at"]
        read_only_fields = ["id", "created_at"]

    def get_scope(self, hook: Webhook) -> str:
        return "group" if hook.group_id else "provider" if hook.provider_id else "user"

    def validate(self, attrs: dict[str, Any]) -> dict[str, Any]:
        if self.instance is not None:
            for name in ("group", "provider"):
                if name in attrs and attrs[name] != getattr(self.instance, name):
                    raise serializers.ValidationError({name: "A webhook's owner cannot change; create another."})
            return attrs
        if attrs.get("group") and attrs.get("provider"):
            raise serializers.ValidationError({"provider": "Give a group or a lab, not both."})
        user = self.context["request"].user
        groups, labs = preferences.can_manage_group_hooks(user)
        if attrs.get("group") and attrs["group"] not in groups:
            raise serializers.ValidationError({"group": "You are not a member of this research group."})
        if attrs.get("provider") and attrs["provider"] not in labs:
            raise serializers.ValidationError({"provider": "You are not a member of this lab."})
        return attrs


class WebhookCreatedSerializer(WebhookSerializer):
    secret = serializers.CharField(read_only=True, help_text="Shown once: sign-check requests with it.")

    class Meta(WebhookSerializer.Meta):
        fields = [*WebhookSerializer.Meta.fields, "secret"]


class TestQueuedSerializer(serializers.Serializer):
    delivery = serializers.IntegerField(help_text="The delivery to follow in the delivery log.")


def create_webhook(user: Any, *, url: str, name: str = "", group: ResearchGroup | None = None,
                   provider: Provider | None = None, enabled: bool = True) -> Webhook:
    """A new webhook with a fresh secret; owned by ``group`` or ``provider`` when given, else by ``user``."""
    return Webhook.objects.create(user=None if group or provider else user, group=group, provider=provider,
                                  name=name, url=url, enabled=enabled, secret=signing.new_secret(),
                                  created_by=user)


@extend_schema_view(create=extend_schema(responses={201: WebhookCreatedSerializer}))
class WebhookViewSet(viewsets.ModelViewSet):
    """Your webhooks and your groups' and labs' (admins: all). Requests are signed: HMAC-SHA256 over
    ``timestamp + "." + body`` in ``X-ReclaimNet-Signature: v1=<hex>``, the timestamp in
    ``X-ReclaimNet-Timestamp``."""

    serializer_class = WebhookSerializer
    queryset = Webhook.objects.none()  # the schema's path types; get_queryset scopes to the caller

    def get_queryset(self) -> QuerySet[Webhook]:
        return preferences.visible_webhooks(self.request.user).select_related("group", "provider").order_by("pk")

    def create(self, request: Request, *args: Any, **kwargs: Any) -> Response:
        data = WebhookSerializer(data=request.data, context={"request": request})
        data.is_valid(raise_exception=True)
        hook = create_webhook(request.user, **data.validated_data)
        return Response(WebhookCreatedSerializer(hook, context={"request": request}).data,
                        status=status.HTTP_201_CREATED)

    @extend_schema(request=None, responses={202: TestQueuedSerializer})
    @action(detail=True, methods=["post"])
    def test(self, request: Request, pk: str | None = None) -> Response:
        """Queue a test notification to this webhook; follow it in the delivery log."""
        hook = self.get_object()
        delivery = dispatch.send_test(hook, request.user, Channel.WEBHOOK)
        return Response({"delivery": delivery.pk}, status=status.HTTP_202_ACCEPTED)


# --- delivery log ----------------------------------------------------------------------------------------------

class AttemptSerializer(serializers.ModelSerializer):
    class Meta:
        model = Attempt
        fields = ["number", "at", "status_code", "error", "duration_ms"]


class DeliverySerializer(serializers.ModelSerializer):
    attempt_log = AttemptSerializer(many=True, read_only=True)

    class Meta:
        model = Delivery
        fields = ["id", "notice_id", "event", "level", "channel", "target", "webhook", "text", "status",
                  "attempts", "last_status_code", "last_error", "created_at", "sent_at", "attempt_log"]


class DeliveryQuerySerializer(serializers.Serializer):
    channel = serializers.ChoiceField(choices=Channel.choices, required=False)
    status = serializers.ChoiceField(choices=DeliveryStatus.choices, required=False)
    event = serializers.CharField(required=False, max_length=64, help_text="A catalogue event name.")


def visible_deliveries(user: Any) -> QuerySet[Delivery]:
    """Deliveries addressed to ``user`` or to a webhook ``user`` sees; admins all."""
    if is_admin(user):
        return Delivery.objects.all()
    hooks = preferences.visible_webhooks(user).values("pk")
    return Delivery.objects.filter(Q(user=user) | Q(webhook__in=hooks))


@extend_schema_view(list=extend_schema(parameters=[DeliveryQuerySerializer]))
class DeliveryViewSet(mixins.ListModelMixin, mixins.RetrieveModelMixin, viewsets.GenericViewSet):
    """The delivery log: each mail and webhook post, its attempts with status codes or errors, newest first."""

    serializer_class = DeliverySerializer
    queryset = Delivery.objects.none()  # the schema's path types; get_queryset scopes to the caller

    def get_queryset(self) -> QuerySet[Delivery]:
        queryset = visible_deliveries(self.request.user).prefetch_related("attempt_log").order_by("-pk")
        if self.action == "list":
            query = DeliveryQuerySerializer(data=self.request.query_params.dict())
            query.is_valid(raise_exception=True)
            for name, value in query.validated_data.items():
                queryset = queryset.filter(**{name: value})
        return queryset
