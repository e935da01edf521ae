"""ReclaimNet portal settings, read from the environment (see README "Configuration").

Embedded default: SQLite file, in-memory channel layer, Celery tasks run in-process.
Production / test suite: ``DATABASE_URL=postgres://…``, ``REDIS_URL=redis://…``, ``SECRET_KEY`` required.
"""

from __future__ import annotations

import secrets
from pathlib import Path

import dj_database_url
from django.core.exceptions import ImproperlyConfigured

from portal.env import env_bool, env_float, env_list, env_str

BASE_DIR = Path(__file__).resolve().parent.parent

DEBUG = env_bool("DEBUG", default=False)
SECRET_KEY = env_str("SECRET_KEY")
if not SECRET_KEY:
    if DEBUG or env_bool("RECLAIMNET_TESTING"):
        # Development and tests: a fresh random key per process (sessions do not survive a restart).
        # `make demo` writes one to .demo/secret_key and passes it as SECRET_KEY_FILE.
        SECRET_KEY = secrets.token_urlsafe(50)
    else:
        raise ImproperlyConfigured("SECRET_KEY (or SECRET_KEY_FILE) is required (or set DEBUG=1 for development)")

ALLOWED_HOSTS = env_list("ALLOWED_HOSTS", ["127.0.0.1", "localhost", "testserver", "[::1]"])
CSRF_TRUSTED_ORIGINS = env_list("CSRF_TRUSTED_ORIGINS", ["http://127.0.0.1:8000", "http://localhost:8000"])

INSTALLED_APPS = [
    "daphne",
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "whitenoise.runserver_nostatic",
    "django.contrib.staticfiles",
    "rest_framework",
    "rest_framework.authtoken",
    "drf_spectacular",
    "channels",
    "django_htmx",
    "portal.core",
    "portal.control",
    "portal.web",
]

MIDDLEWARE = [
    "django.middleware.security.SecurityMiddleware",
    "portal.core.middleware.BodySizeLimitMiddleware",
    "whitenoise.middleware.WhiteNoiseMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
    "django_htmx.middleware.HtmxMiddleware",
]

ROOT_URLCONF = "portal.urls"
ASGI_APPLICATION = "portal.asgi.application"
WSGI_APPLICATION = None

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [BASE_DIR / "portal" / "templates"],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
            ],
        },
    },
]

DATABASE_URL = env_str("DATABASE_URL") or f"sqlite:///{BASE_DIR / 'db.sqlite3'}"
DATABASES = {"default": dj_database_url.parse(DATABASE_URL, conn_max_age=60)}
if DATABASES["default"]["ENGINE"] == "django.db.backends.sqlite3":
    # The embedded default takes concurrent writes (docs/design.md §8): WAL lets readers run beside the one
    # writer; IMMEDIATE takes the write lock at BEGIN, so two transactions never deadlock upgrading a read lock
    # (SQLite answers that with an immediate "database is locked", whatever the timeout); writers queue for up
    # to ``timeout`` seconds instead of failing.
    DATABASES["default"].setdefault("OPTIONS", {}).update({
        "timeout": 20,
        "transaction_mode": "IMMEDIATE",
        "init_command": "PRAGMA journal_mode=WAL; PRAGMA synchronous=NORMAL;",
    })
    DATABASES["default"]["CONN_MAX_AGE"] = 0
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

if env_bool("RECLAIMNET_TESTING"):
    # PBKDF2 at its production work factor costs ~0.3 s per password; tests hash with MD5 (never in production).
    PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]
AUTH_PASSWORD_VALIDATORS = [
    {"NAME": "django.contrib.auth.password_validation.MinimumLengthValidator"},
]
LOGIN_URL = "/accounts/login/"
LOGIN_REDIRECT_URL = "/"
LOGOUT_REDIRECT_URL = "/accounts/login/"

LANGUAGE_CODE = "en-us"
TIME_ZONE = "UTC"
USE_I18N = False
USE_TZ = True

STATIC_URL = "/static/"
STATIC_ROOT = BASE_DIR / "staticfiles"
STATICFILES_DIRS = [BASE_DIR / "frontend" / "static"] if (BASE_DIR / "frontend" / "static").exists() else []
STORAGES = {
    "default": {"BACKEND": "django.core.files.storage.FileSystemStorage"},
    "staticfiles": {"BACKEND": "whitenoise.storage.CompressedStaticFilesStorage"},
}

# --- REST API ---------------------------------------------------------------------------------------------
REST_FRAMEWORK = {
    "DEFAULT_AUTHENTICATION_CLASSES": [
        "rest_framework.authentication.TokenAuthentication",
        "rest_framework.authentication.SessionAuthentication",
    ],
    "DEFAULT_PERMISSION_CLASSES": ["rest_framework.permissions.IsAuthenticated"],
    "DEFAULT_SCHEMA_CLASS": "portal.core.api.schema.ReclaimNetAutoSchema",
    "DEFAULT_PAGINATION_CLASS": "portal.core.api.pagination.BoundedLimitOffsetPagination",
    "PAGE_SIZE": 100,
}
SPECTACULAR_SETTINGS = {
    "TITLE": "ReclaimNet portal API",
    "DESCRIPTION": "Campus GPU lending with reclaim-aware checkpointing, placement and migration traffic control.",
    "VERSION": "0.1.0",
    "SERVE_INCLUDE_SCHEMA": False,
    "SERVE_PERMISSIONS": ["rest_framework.permissions.IsAuthenticated"],
    # NodeState and JobState are both "state": name their enums explicitly (drf-spectacular#68).
    "ENUM_NAME_OVERRIDES": {
        "NodeStateEnum": "portal.core.lifecycle.nodes.NodeState",
        "JobStateEnum": "portal.core.lifecycle.jobs.JobState",
        "ReclaimKindEnum": "portal.core.models.reclaims.ReclaimKind",
        "ReclaimOutcomeEnum": "portal.core.models.reclaims.ReclaimOutcome",
        "MigrationModeEnum": "portal.core.models.reclaims.MigrationMode",
        "PriorityClassEnum": "portal.core.models.jobs.PriorityClass",
    },
}
# Prometheus scrapers authenticate with "Authorization: Bearer <METRICS_TOKEN>" (staff sessions also work).
METRICS_TOKEN = env_str("METRICS_TOKEN")

# --- Channels and Celery ------------------------------------------------------------------------------------
REDIS_URL = env_str("REDIS_URL")
if REDIS_URL:
    CHANNEL_LAYERS = {
        # The layer blocks up to 5 s reading a channel (BZPOPMIN); redis-py's default 5 s socket timeout raced
        # it and dropped every agent's websocket about every 40 s. A read timeout well above the blocking
        # read, a short connect timeout, and health checks on idle connections.
        "default": {"BACKEND": "channels_redis.core.RedisChannelLayer", "CONFIG": {"hosts": [{
            "address": REDIS_URL, "socket_timeout": 30, "socket_connect_timeout": 5,
            "health_check_interval": 15, "retry_on_timeout": True,
        }]}}
    }
    CELERY_BROKER_URL = REDIS_URL
    CELERY_TASK_ALWAYS_EAGER = False
else:
    CHANNEL_LAYERS = {"default": {"BACKEND": "channels.layers.InMemoryChannelLayer"}}
    CELERY_BROKER_URL = "memory://"
    CELERY_TASK_ALWAYS_EAGER = True
CELERY_TASK_EAGER_PROPAGATES = True
CELERY_TASK_SERIALIZER = "json"
CELERY_RESULT_SERIALIZER = "json"
CELERY_ACCEPT_CONTENT = ["json"]
CELERY_TASK_ACKS_LATE = True
CELERY_TASK_REJECT_ON_WORKER_LOST = True
CELERY_WORKER_PREFETCH_MULTIPLIER = 1
CELERY_BROKER_CONNECTION_RETRY_ON_STARTUP = True
# Beat also runs the outbox relay (portal/beat.py): requests and consumers never talk to the broker.
CELERY_BEAT_SCHEDULER = "portal.beat:RelayingScheduler"
# "celery" (REDIS_URL set) or "loop" (embedded default) unless set: "inline" relays in the committing thread.
RECLAIMNET_OUTBOX_RELAY = env_str("RECLAIMNET_OUTBOX_RELAY", "")

# --- ReclaimNet control-plane parameters (design §2–§4) --------------------------------------------------------
RECLAIMNET = {
    "CONTROL_PERIOD_S": env_float("RECLAIMNET_CONTROL_PERIOD_S", 10.0),
    "HEARTBEAT_INTERVAL_S": env_float("RECLAIMNET_HEARTBEAT_INTERVAL_S", 2.0),
    "HEARTBEAT_TIMEOUT_S": env_float("RECLAIMNET_HEARTBEAT_TIMEOUT_S", 10.0),
    # How stale the estimators' stored snapshot may get; each tick replays at most this much history.
    "ESTIMATOR_SNAPSHOT_PERIOD_S": env_float("RECLAIMNET_ESTIMATOR_SNAPSHOT_PERIOD_S", 60.0),
    # Bounded tables (docs/design.md §9.8): decision logs are kept this long.
    "DECISION_LOG_KEEP_DAYS": env_float("RECLAIMNET_DECISION_LOG_KEEP_DAYS", 30.0),
    "CHECKPOINT_BUDGET_FRACTION": env_float("RECLAIMNET_CHECKPOINT_BUDGET_FRACTION", 0.3),
    "BETA": 0.2,
    "ALPHA": 1.0,
    "K_MIN": 2,
    "RESERVE_FRACTION": 0.3,
    # B_min of design §4: research keeps max(β·B, B_min) of every controlled link.
    "RESERVE_MIN_BYTES_PER_S": env_float("RECLAIMNET_RESERVE_MIN_BYTES_PER_S", 0.0),
}

# Celery beat runs P1 and the rest of the control tick every control period (design §2). A tick that could not
# run within its period is dropped, not queued: the next one re-reads everything.
CELERY_BEAT_SCHEDULE = {
    "control-tick": {
        "task": "control.tick",
        "schedule": RECLAIMNET["CONTROL_PERIOD_S"],
        "options": {"expires": RECLAIMNET["CONTROL_PERIOD_S"]},
    },
    "control-housekeeping": {  # roll up bandwidth samples, prune old decision logs (docs/design.md §9.8)
        "task": "control.housekeeping",
        "schedule": 600.0,
        "options": {"expires": 600.0},
    },
    "control-reconcile": {  # redo steps whose task was lost (docs/design.md §9.6)
        "task": "control.reconcile",
        "schedule": env_float("RECLAIMNET_RECONCILE_PERIOD_S", 5.0),
        "options": {"expires": env_float("RECLAIMNET_RECONCILE_PERIOD_S", 5.0)},
    },
}

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "formatters": {"plain": {"format": "%(asctime)s %(levelname)s %(name)s: %(message)s"}},
    "handlers": {"console": {"class": "logging.StreamHandler", "formatter": "plain"}},
    "root": {"handlers": ["console"], "level": env_str("LOG_LEVEL", "INFO")},
    "loggers": {"django.db.backends": {"level": "WARNING"}, "daphne": {"level": "WARNING"}},
}

SESSION_COOKIE_HTTPONLY = True
CSRF_COOKIE_HTTPONLY = False
X_FRAME_OPTIONS = "DENY"
SECURE_CONTENT_TYPE_NOSNIFF = True
