from django.apps import AppConfig


class CoreConfig(AppConfig):
    """The campus data model: topology, providers and nodes, researchers and jobs, reclaims and migrations."""

    name = "portal.core"
    label = "core"
    verbose_name = "ReclaimNet"
