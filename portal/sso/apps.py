from django.apps import AppConfig


class SsoConfig(AppConfig):
    """Campus sign-in (OpenID Connect) and the claim rules that map a campus identity to portal roles."""

    name = "portal.sso"
    label = "sso"
    verbose_name = "Campus sign-in"
    default_auto_field = "django.db.models.BigAutoField"
