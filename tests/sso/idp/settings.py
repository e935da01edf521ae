"""Settings of the test identity provider (django-oauth-toolkit with OpenID Connect on). Everything it needs
comes from the environment the test sets: ``IDP_DB`` (its SQLite file), ``IDP_ISSUER``, ``IDP_RSA_KEY_FILE``."""

from __future__ import annotations

import os
import secrets
from pathlib import Path

SECRET_KEY = secrets.token_urlsafe(40)
DEBUG = False
ALLOWED_HOSTS = ["127.0.0.1", "localhost"]
INSTALLED_APPS = [
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "oauth2_provider",
]
MIDDLEWARE = [
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
]
ROOT_URLCONF = "tests.sso.idp.urls"
TEMPLATES = [{"BACKEND": "django.template.backends.django.DjangoTemplates",
              "DIRS": [Path(__file__).parent / "templates"], "APP_DIRS": True,
              "OPTIONS": {"context_processors": ["django.template.context_processors.request"]}}]
DATABASES = {"default": {"ENGINE": "django.db.backends.sqlite3", "NAME": os.environ["IDP_DB"]}}
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"
USE_TZ = True
PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]  # test users only
LOGIN_URL = "/accounts/login/"
# Both servers listen on 127.0.0.1 and cookies ignore the port: the provider's cookies get names of their own.
SESSION_COOKIE_NAME = "idp_sessionid"
CSRF_COOKIE_NAME = "idp_csrftoken"
OAUTH2_PROVIDER = {
    "OIDC_ENABLED": True,
    "OIDC_ISS_ENDPOINT": os.environ["IDP_ISSUER"],
    "OIDC_RSA_PRIVATE_KEY": Path(os.environ["IDP_RSA_KEY_FILE"]).read_text(),
    "OIDC_RP_INITIATED_LOGOUT_ENABLED": True,
    "OIDC_RP_INITIATED_LOGOUT_ALWAYS_PROMPT": False,  # the ID token hint names the signed-in user: no prompt
    "OAUTH2_VALIDATOR_CLASS": "tests.sso.idp.validator.CampusValidator",
    "SCOPES": {"openid": "OpenID Connect", "email": "E-mail", "profile": "Profile"},
    "PKCE_REQUIRED": True,
}
LOGGING = {"version": 1, "disable_existing_loggers": False,
           "handlers": {"console": {"class": "logging.StreamHandler"}},
           "root": {"handlers": ["console"], "level": "WARNING"}}
