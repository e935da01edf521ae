"""ReclaimNet portal settings, read from the environment (see README "Configuration").

Embedded default: SQLite file, in-memory channel layer, Celery tasks run in-process.
Production / test suite: ``DATABASE_URL=postgres://…``, ``REDIS_URL=redis://…``, ``SECRET_KEY`` required.
"""

from __future__ import annotations

import secrets
from pathlib import Path

import dj_database_url
from django.core.exceptions import ImproperlyConfigured
from kombu import Exchange, Queue

from portal.env import env_bool, env_float, env_int, env_list, env_str, process_kind

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
    "drf_spectacular_sidecar",  # Swagger UI and ReDoc served by the portal itself (no CDN, works offline)
    "channels",
    "django_htmx",
    "portal.core",
    "portal.control",
    "portal.web",
    "portal.notify",
    "portal.queue",
]

MIDDLEWARE = [
    "django.middleware.security.SecurityMiddleware",
    "portal.core.middleware.DatabaseBusyMiddleware",
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
DATABASES = {"default": dj_database_url.parse(DATABASE_URL, conn_max_age=0)}
RECLAIMNET_PROCESS_KIND = process_kind()
if DATABASES["default"]["ENGINE"] == "django.db.backends.postgresql":
    # Bounded connections (docs/design.md §10): every process takes its connections from one psycopg pool of
    # its own, sized by what the process does, so daphne + a worker per queue (2 children each) + beat stay far
    # below PostgreSQL's max_connections (100). A burst waits up to the pool timeout for a free connection, then
    # is answered 503 + Retry-After (portal.core.middleware.DatabaseBusyMiddleware). Every connection is named
    # after its process kind in pg_stat_activity.application_name.
    _POOL_MAX_SIZE = {"daphne": 16, "worker": 2, "beat": 2, "other": 8}
    DATABASES["default"]["CONN_MAX_AGE"] = 0  # required with a pool: "closing" returns the connection to it
    DATABASES["default"]["CONN_HEALTH_CHECKS"] = True  # the pool checks a connection before lending it
    if env_bool("RECLAIMNET_DB_POOL", default=True):
        _pool_max_size = env_int("RECLAIMNET_DB_POOL_MAX_SIZE", _POOL_MAX_SIZE[RECLAIMNET_PROCESS_KIND])
        DATABASES["default"].setdefault("OPTIONS", {})["pool"] = {
            "min_size": min(env_int("RECLAIMNET_DB_POOL_MIN_SIZE", 1), _pool_max_size),
            "max_size": _pool_max_size,
            "timeout": env_float("RECLAIMNET_DB_POOL_TIMEOUT_S", 10.0),  # how long a request queues for one
            "max_waiting": env_int("RECLAIMNET_DB_POOL_MAX_WAITING", 0),  # 0: no bound beyond the timeout
            "max_idle": env_float("RECLAIMNET_DB_POOL_MAX_IDLE_S", 300.0),  # idle connections above min_size
        }
    DATABASES["default"].setdefault("OPTIONS", {})["application_name"] = f"reclaimnet-{RECLAIMNET_PROCESS_KIND}"
# A request that found the database busy (pool exhausted, connection slots used up) is told to come back after.
RECLAIMNET_DB_BUSY_RETRY_AFTER_S = env_int("RECLAIMNET_DB_BUSY_RETRY_AFTER_S", 2)
# At most this many HTTP reads, and RECLAIMNET_HTTP_WRITE_CONCURRENCY writes, run in Django at once per server
# process (portal.asgi); the rest wait their turn, up to RECLAIMNET_HTTP_QUEUE_TIMEOUT_S, then are answered 503 +
# Retry-After. Their sum stays below the daphne pool's 16 connections: the rest is left to the websocket
# consumers (agents, live pages). 0: no bound.
RECLAIMNET_HTTP_CONCURRENCY = env_int("RECLAIMNET_HTTP_CONCURRENCY", 6)
RECLAIMNET_HTTP_WRITE_CONCURRENCY = env_int("RECLAIMNET_HTTP_WRITE_CONCURRENCY", 6)
# Reads go first (docs/design.md §10): while a read is inside or waiting, only this many writes are let in (a
# write that waited half the queue timeout is let in up to the write limit whatever the reads).
RECLAIMNET_HTTP_WRITE_CONCURRENCY_UNDER_READS = env_int("RECLAIMNET_HTTP_WRITE_CONCURRENCY_UNDER_READS", 1)
RECLAIMNET_HTTP_QUEUE_TIMEOUT_S = env_float("RECLAIMNET_HTTP_QUEUE_TIMEOUT_S", 30.0)
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
# frontend/static/ holds the vendored htmx and Chart.js (built by scripts/build_frontend.sh); our own scripts and
# styles are served straight from frontend/src/ as reclaimnet/…, so the repository keeps one copy of them.
_FRONTEND = BASE_DIR / "frontend"
STATICFILES_DIRS = ([_FRONTEND / "static"] if (_FRONTEND / "static").exists() else []) + (
    [("reclaimnet", _FRONTEND / "src")] if (_FRONTEND / "src").exists() else [])
STORAGES = {
    "default": {"BACKEND": "django.core.files.storage.FileSystemStorage"},
    "staticfiles": {"BACKEND": "whitenoise.storage.CompressedStaticFilesStorage"},
}

# --- Job results (docs/design.md §14) ------------------------------------------------------------------------
# Files a job's agent uploads (its output directory, its final checkpoint), kept through the ``results`` storage:
# atomic files under MEDIA_ROOT/results, or an S3-compatible bucket (pip install 'reclaimnet[s3]').
MEDIA_ROOT = Path(env_str("RECLAIMNET_MEDIA_ROOT", str(BASE_DIR / "media")) or BASE_DIR / "media")
RECLAIMNET_RESULTS_STAGING_DIR = Path(env_str("RECLAIMNET_RESULTS_STAGING_DIR", "") or MEDIA_ROOT / "results-staging")
RECLAIMNET_RESULTS_GROUP_CAP_BYTES = env_int("RECLAIMNET_RESULTS_GROUP_CAP_BYTES", 50 * 2**30)
RECLAIMNET_RESULTS_KEEP_DAYS = env_float("RECLAIMNET_RESULTS_KEEP_DAYS", 30.0)
# a node may upload a job's results while its placement is open and this long after it ended (design §14)
RECLAIMNET_RESULTS_UPLOAD_WINDOW_S = env_float("RECLAIMNET_RESULTS_UPLOAD_WINDOW_S", 6 * 3600.0)
RECLAIMNET_RESULTS_S3_BUCKET = env_str("RECLAIMNET_RESULTS_S3_BUCKET", "") or ""
if RECLAIMNET_RESULTS_S3_BUCKET:
    STORAGES["results"] = {"BACKEND": "storages.backends.s3.S3Storage", "OPTIONS": {
        "bucket_name": RECLAIMNET_RESULTS_S3_BUCKET,
        "endpoint_url": env_str("RECLAIMNET_RESULTS_S3_ENDPOINT_URL", "") or None,
        "access_key": env_str("RECLAIMNET_RESULTS_S3_ACCESS_KEY", "") or None,
        "secret_key": env_str("RECLAIMNET_RESULTS_S3_SECRET_KEY", "") or None,
        "region_name": env_str("RECLAIMNET_RESULTS_S3_REGION", "") or None,
        "location": env_str("RECLAIMNET_RESULTS_S3_PREFIX", "results") or "",
        "file_overwrite": True, "default_acl": None, "querystring_auth": True}}
else:
    STORAGES["results"] = {"BACKEND": "portal.core.results_storage.AtomicFileSystemStorage",
                           "OPTIONS": {"location": str(MEDIA_ROOT / "results")}}

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
    # The docs pages load Swagger UI and ReDoc from the portal's static files (drf-spectacular-sidecar), never a
    # CDN; no validator badge from swagger.io either (portal/core/security.py gives these pages their policy).
    "SWAGGER_UI_DIST": "SIDECAR",
    "SWAGGER_UI_FAVICON_HREF": "SIDECAR",
    "REDOC_DIST": "SIDECAR",
    "SWAGGER_UI_SETTINGS": {"deepLinking": True, "validatorUrl": None},
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
    CELERY_BROKER_TRANSPORT = "portal.celery:RedisTransport"  # survives a Redis restart (see there)
    # Sessions read from the shared cache (Redis), written through to the database: a signed-in page costs no
    # session query.
    SESSION_ENGINE = "django.contrib.sessions.backends.cached_db"
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
# A broker that goes away (Redis restarting) is waited for, never given up on: the worker reconnects with backoff
# and its unacknowledged messages go back to their queues (docs/design.md §10).
CELERY_BROKER_CONNECTION_RETRY = True
CELERY_BROKER_CONNECTION_MAX_RETRIES = None  # retry forever
CELERY_BROKER_CHANNEL_ERROR_RETRY = True
# With late acks a task running when the broker connection drops is redelivered anyway: cancel it, don't run it
# twice at once (Celery 6's default). Every task claims its step, so the redelivery does the work once.
CELERY_WORKER_CANCEL_LONG_RUNNING_TASKS_ON_CONNECTION_LOSS = True
# Bounded tasks, and a visibility timeout matched to the longest: a task still unacknowledged after
# ``visibility_timeout`` seconds belongs to a worker that died (SIGKILL, lost host), so Redis hands it to another.
# Control steps are also re-driven by the reconciler (beat, every few seconds, docs/design.md §9.6) within 30 s
# of their owner's death; the redelivery that follows finds its step done and does nothing.
CELERY_TASK_SOFT_TIME_LIMIT = env_float("RECLAIMNET_TASK_SOFT_TIME_LIMIT_S", 50.0)
CELERY_TASK_TIME_LIMIT = env_float("RECLAIMNET_TASK_TIME_LIMIT_S", 60.0)
RECLAIMNET_HOUSEKEEPING_TIME_LIMIT_S = env_float("RECLAIMNET_HOUSEKEEPING_TIME_LIMIT_S", 120.0)
CELERY_TASK_ANNOTATIONS = {"control.housekeeping": {
    "soft_time_limit": RECLAIMNET_HOUSEKEEPING_TIME_LIMIT_S - 10.0, "time_limit": RECLAIMNET_HOUSEKEEPING_TIME_LIMIT_S}}
CELERY_BROKER_TRANSPORT_OPTIONS = {
    # Longest hard limit plus one task's wait behind it (prefetch multiplier 1, late acks).
    "visibility_timeout": env_float("RECLAIMNET_BROKER_VISIBILITY_TIMEOUT_S", RECLAIMNET_HOUSEKEEPING_TIME_LIMIT_S + 60.0),
    # redis-py's 5 s default socket timeout is shorter than a blocking read may wait: reads time out only
    # after 30 s of silence, connects after 5 s, and idle connections are checked before use.
    "socket_timeout": 30.0, "socket_connect_timeout": 5.0, "health_check_interval": 15, "retry_on_timeout": True,
}
# Queues by urgency (docs/design.md §10): what a provider is waiting for (a reclaim and its steps) has a queue
# that nothing slow shares; the control tick, placements and housekeeping have their own. A worker started
# without ``-Q`` consumes all of them (development, tests); production runs one worker per queue (README).
# The outbox relay publishes by task name (``send_task``), so these routes apply to everything it relays.
RECLAIMNET_QUEUES = ("control", "tick", "placement", "housekeeping", "notifications", "evaluation", "default")
CELERY_TASK_QUEUES = [Queue(name, Exchange(name), routing_key=name) for name in RECLAIMNET_QUEUES]
CELERY_TASK_DEFAULT_QUEUE = "default"  # a task nobody routed (tests/e2e/test_queues.py forbids that)
CELERY_TASK_ROUTES = {
    **{name: {"queue": "control"} for name in (
        "control.run_reclaim", "control.enforce_deadline", "control.advance_migration", "control.recover_lost_jobs",
        "control.release_reclaims", "control.stop_cancelled_job", "control.node_lent_again", "control.reconcile")},
    "control.tick": {"queue": "tick"},
    "control.place_job": {"queue": "placement"},
    "control.place_queued": {"queue": "placement"},
    "control.presync_checkpoint": {"queue": "placement"},
    "control.housekeeping": {"queue": "housekeeping"},
    "control.calibrate_reserves": {"queue": "evaluation"},  # the research reserve, daily (docs/design.md §4)
    # Mail and webhooks (docs/design.md §12): a slow receiver only ever holds this queue's workers.
    **{name: {"queue": "notifications"} for name in (
        "notify.fan_out", "notify.deliver", "notify.send_digests", "notify.watch")},
}
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
    # Δ_min of design §2: no job checkpoints more often. The test suites compress time (1 s control periods,
    # jobs of seconds), so their default is no floor; the suites that test the floor set it.
    "MIN_CHECKPOINT_INTERVAL_S": env_float("RECLAIMNET_MIN_CHECKPOINT_INTERVAL_S",
                                           0.0 if env_bool("RECLAIMNET_TESTING") else 60.0),
    # Design §9.13: jobs start leaving a node this long before its lending window ends.
    "WINDOW_NOTICE_S": env_float("RECLAIMNET_WINDOW_NOTICE_S", 600.0),
    "ALPHA": 1.0,
    "K_MIN": 2,
    "RESERVE_FRACTION": 0.3,
    # B_min of design §4: research keeps max(β·B, B_min) of every controlled link.
    "RESERVE_MIN_BYTES_PER_S": env_float("RECLAIMNET_RESERVE_MIN_BYTES_PER_S", 0.0),
    # design §4 "Calibrated reserve": one class sample per node and link scope per this period
    "CLASS_SAMPLE_PERIOD_S": env_float("RECLAIMNET_CLASS_SAMPLE_PERIOD_S", 60.0),
    # Design §1 "Owner activity and MIG": a node's owner-use policy applies after this many heartbeats in a row
    # showing the lab's processes on lent GPUs; its ``reclaim`` gives this much notice.
    "OWNER_USE_HEARTBEATS": env_int("RECLAIMNET_OWNER_USE_HEARTBEATS", 3),
    "OWNER_USE_NOTICE_S": env_float("RECLAIMNET_OWNER_USE_NOTICE_S", 120.0),
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
    "notify-digest": {  # the digest mail of the events people chose to read in bulk (docs/design.md §12)
        "task": "notify.send_digests",
        "schedule": env_float("RECLAIMNET_NOTIFY_DIGEST_PERIOD_S", 3600.0),
        "options": {"expires": 600.0},
    },
    "notify-watch": {  # loss budgets turning at risk (docs/design.md §12)
        "task": "notify.watch",
        "schedule": 30.0,
        "options": {"expires": 30.0},
    },
    "control-calibrate-reserves": {  # B_min per link from 7 days of research traffic (docs/design.md §4)
        "task": "control.calibrate_reserves",
        "schedule": env_float("RECLAIMNET_RESERVE_CALIBRATION_PERIOD_S", 86400.0),
        "options": {"expires": 3600.0},
    },
    "control-reconcile": {  # redo steps whose task was lost (docs/design.md §9.6)
        "task": "control.reconcile",
        "schedule": env_float("RECLAIMNET_RECONCILE_PERIOD_S", 5.0),
        "options": {"expires": env_float("RECLAIMNET_RECONCILE_PERIOD_S", 5.0)},
    },
}

# --- Notifications: mail and webhooks (docs/design.md §12) ---------------------------------------------------
# Mail goes through SMTP when EMAIL_HOST is set; otherwise it is stored in the database and shown to admins on
# /notify/mail/ (the embedded demo has no mail server).
EMAIL_HOST = env_str("EMAIL_HOST", "") or ""
EMAIL_PORT = env_int("EMAIL_PORT", 25)
EMAIL_HOST_USER = env_str("EMAIL_HOST_USER", "") or ""
EMAIL_HOST_PASSWORD = env_str("EMAIL_HOST_PASSWORD", "") or ""
EMAIL_USE_TLS = env_bool("EMAIL_USE_TLS", False)
DEFAULT_FROM_EMAIL = env_str("DEFAULT_FROM_EMAIL", "ReclaimNet <reclaimnet@localhost>")
EMAIL_BACKEND = ("django.core.mail.backends.smtp.EmailBackend" if EMAIL_HOST
                 else "portal.notify.mail.DatabaseBackend")
RECLAIMNET_NOTIFY = {
    "SMTP_TIMEOUT_S": env_float("RECLAIMNET_NOTIFY_SMTP_TIMEOUT_S", 10.0),
    "WEBHOOK_TIMEOUT_S": env_float("RECLAIMNET_NOTIFY_WEBHOOK_TIMEOUT_S", 5.0),
    "MAX_ATTEMPTS": env_int("RECLAIMNET_NOTIFY_MAX_ATTEMPTS", 6),
    "RETRY_BASE_S": env_float("RECLAIMNET_NOTIFY_RETRY_BASE_S", 5.0),  # 5, 10, 20, 40, 80 s …
    "RETRY_MAX_S": env_float("RECLAIMNET_NOTIFY_RETRY_MAX_S", 900.0),
    "OWNER_USE_UTIL_PCT": env_float("RECLAIMNET_NOTIFY_OWNER_USE_UTIL_PCT", 50.0),
    "PUBLIC_URL": (env_str("RECLAIMNET_PUBLIC_URL", "") or "").rstrip("/"),  # links in mail; "" = paths only
    # Webhooks to loopback, private, link-local … addresses are refused unless allowed (design §12); the test
    # suite's receivers listen on 127.0.0.1 (tests/notify/test_targets.py proves the refusal with it off).
    "ALLOW_PRIVATE_WEBHOOKS": env_bool("RECLAIMNET_NOTIFY_ALLOW_PRIVATE_WEBHOOKS", env_bool("RECLAIMNET_TESTING")),
}
EMAIL_TIMEOUT = RECLAIMNET_NOTIFY["SMTP_TIMEOUT_S"]

# The admin dashboard's numbers are computed at most once per this many seconds for the whole deployment and
# shared through the cache (portal/web/dashboard.py build); a refresh under way may serve the previous result
# for up to RECLAIMNET_DASHBOARD_REFRESH_S more. 0 computes them on every request (the test suite's default:
# its tests change the campus and read the dashboard at once).
RECLAIMNET_DASHBOARD_MAX_AGE_S = env_float("RECLAIMNET_DASHBOARD_MAX_AGE_S",
                                           0.0 if env_bool("RECLAIMNET_TESTING") else 5.0)
RECLAIMNET_DASHBOARD_REFRESH_S = env_float("RECLAIMNET_DASHBOARD_REFRESH_S", 10.0)

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

# --- Security (docs/design.md §11) ---
# Secure by default: with DEBUG off the portal assumes HTTPS terminated by a reverse proxy that sets (overwrites)
# X-Forwarded-Proto, and sends secure cookies, HSTS and a Content-Security-Policy. Plain http (the embedded
# default on 127.0.0.1, the test suite's own servers) needs DEBUG=1, RECLAIMNET_TESTING=1 or
# RECLAIMNET_INSECURE_HTTP=1. Every setting below can also be set on its own from the environment.
_HTTPS = not (DEBUG or env_bool("RECLAIMNET_TESTING") or env_bool("RECLAIMNET_INSECURE_HTTP"))
SECURE_SSL_REDIRECT = env_bool("SECURE_SSL_REDIRECT", _HTTPS)
SECURE_REDIRECT_EXEMPT = env_list("SECURE_REDIRECT_EXEMPT", [])
_PROXY_SSL_HEADER = env_str("SECURE_PROXY_SSL_HEADER", "HTTP_X_FORWARDED_PROTO,https" if _HTTPS else "") or ""
SECURE_PROXY_SSL_HEADER = tuple(_PROXY_SSL_HEADER.split(",", 1)) if _PROXY_SSL_HEADER else None  # "" turns it off
SESSION_COOKIE_SECURE = env_bool("SESSION_COOKIE_SECURE", _HTTPS)
CSRF_COOKIE_SECURE = env_bool("CSRF_COOKIE_SECURE", _HTTPS)
SECURE_HSTS_SECONDS = int(env_float("SECURE_HSTS_SECONDS", 31_536_000 if _HTTPS else 0))
SECURE_HSTS_INCLUDE_SUBDOMAINS = env_bool("SECURE_HSTS_INCLUDE_SUBDOMAINS", True)  # names below the portal's host
SECURE_HSTS_PRELOAD = env_bool("SECURE_HSTS_PRELOAD", False)
# Preloading is a commitment an operator makes for a whole domain (hstspreload.org), not a default: without it
# `check --deploy` would only repeat that it is off.
SILENCED_SYSTEM_CHECKS = [] if SECURE_HSTS_PRELOAD else ["security.W021"]
SECURE_REFERRER_POLICY = env_str("SECURE_REFERRER_POLICY", "same-origin")
SECURE_CROSS_ORIGIN_OPENER_POLICY = env_str("SECURE_CROSS_ORIGIN_OPENER_POLICY", "same-origin")

# Content-Security-Policy (django-csp): scripts and styles from the portal only; style="" attributes allowed
# (they cannot run code); websockets to the portal itself. RECLAIMNET_CSP=report-only sends it as
# Content-Security-Policy-Report-Only, =off not at all; RECLAIMNET_CSP_REPORT_URI adds report-uri. The API
# docs pages get a policy of their own, with a nonce (portal/core/security.py).
_CSP_DIRECTIVES: dict[str, list[str]] = {
    "default-src": ["'self'"],
    "script-src": ["'self'"],
    "style-src": ["'self'"],
    "style-src-attr": ["'unsafe-inline'"],
    "img-src": ["'self'", "data:"],
    "connect-src": ["'self'"],
    "object-src": ["'none'"],
    "base-uri": ["'self'"],
    "form-action": ["'self'"],
    "frame-ancestors": ["'none'"],
}
if env_str("RECLAIMNET_CSP_REPORT_URI"):
    _CSP_DIRECTIVES["report-uri"] = [env_str("RECLAIMNET_CSP_REPORT_URI") or ""]
_CSP_MODE = (env_str("RECLAIMNET_CSP", "on") or "on").lower()
if _CSP_MODE not in {"on", "report-only", "off"}:
    raise ImproperlyConfigured(f"RECLAIMNET_CSP must be on, report-only or off, got {_CSP_MODE!r}")
CONTENT_SECURITY_POLICY = {"DIRECTIVES": _CSP_DIRECTIVES} if _CSP_MODE == "on" else None
CONTENT_SECURITY_POLICY_REPORT_ONLY = {"DIRECTIVES": _CSP_DIRECTIVES} if _CSP_MODE == "report-only" else None
MIDDLEWARE.insert(MIDDLEWARE.index("django.middleware.security.SecurityMiddleware") + 1,
                  "portal.core.security.PortalCSPMiddleware")

# The address a request came from, behind this many reverse proxies (X-Forwarded-For; 0: REMOTE_ADDR). The
# production default trusts the one proxy it already trusts for X-Forwarded-Proto; without it every client would
# share the proxy's address (and one attacker would lock everyone out).
RECLAIMNET_TRUSTED_PROXY_COUNT = int(env_float("RECLAIMNET_TRUSTED_PROXY_COUNT", 1 if SECURE_PROXY_SSL_HEADER else 0))

# Login lockout and bad-token throttling (portal/core/auth.py): RECLAIMNET_LOGIN_FAILURE_LIMIT failures within
# RECLAIMNET_LOGIN_COOLOFF_S lock the account and the address for that long. The test suite's default is high
# (its clients all come from 127.0.0.1); the lockout tests set 10 themselves.
RECLAIMNET_LOGIN_FAILURE_LIMIT = int(env_float("RECLAIMNET_LOGIN_FAILURE_LIMIT",
                                               1000 if env_bool("RECLAIMNET_TESTING") else 10))
RECLAIMNET_LOGIN_COOLOFF_S = env_float("RECLAIMNET_LOGIN_COOLOFF_S", 900.0)
INSTALLED_APPS += ["axes", "csp"]
MIDDLEWARE.append("axes.middleware.AxesMiddleware")  # last, as axes asks
AUTHENTICATION_BACKENDS = ["portal.core.auth.LockoutBackend", "django.contrib.auth.backends.ModelBackend"]
AXES_ENABLED = env_bool("RECLAIMNET_LOGIN_LOCKOUT", True)
AXES_HANDLER = "portal.core.auth.LockoutHandler"  # counters in the database, shared by every process
AXES_FAILURE_LIMIT = "portal.core.auth.failure_limit"
AXES_COOLOFF_TIME = "portal.core.auth.cooloff"
AXES_LOCKOUT_PARAMETERS = ["username", "ip_address"]  # either one over the limit locks
AXES_RESET_ON_SUCCESS = False  # one good login from an address must not wipe its failures on other accounts
AXES_RESET_COOL_OFF_ON_FAILURE_DURING_LOCKOUT = False  # the lockout ends when its answer said it would
AXES_LOCKOUT_CALLABLE = "portal.core.auth.lockout_response"
AXES_CLIENT_IP_CALLABLE = "portal.core.security.client_address"
AXES_DISABLE_ACCESS_LOG = True  # no row per successful login (tables that only grow)
REST_FRAMEWORK["DEFAULT_AUTHENTICATION_CLASSES"] = [
    "portal.core.auth.ThrottledTokenAuthentication" if name == "rest_framework.authentication.TokenAuthentication"
    else name for name in REST_FRAMEWORK["DEFAULT_AUTHENTICATION_CLASSES"]
]
# The bad-token counters live in Django's cache: Redis when REDIS_URL is set (shared by every process),
# process memory in the embedded default (one process).
CACHES = {"default": (
    {"BACKEND": "portal.core.cache.RedisCache", "LOCATION": REDIS_URL, "KEY_PREFIX": "rn-cache",  # one pool
     "OPTIONS": {"socket_timeout": 5, "socket_connect_timeout": 5}}
    if REDIS_URL else {"BACKEND": "django.core.cache.backends.locmem.LocMemCache"}
)}

# --- Campus sign-in: OpenID Connect beside local accounts (docs/design.md §20, portal/sso/) -----------------------
# Off unless RECLAIMNET_OIDC_* is configured (portal/sso/config.py reads and checks it: https only, a client id and
# secret, an issuer or the explicit endpoints). When on, the OIDC backend comes after the password backends.
from portal.sso.config import oidc_settings  # noqa: E402  (environment only: no models, no network)

INSTALLED_APPS += ["portal.sso"]
_OIDC_SETTINGS = oidc_settings()
globals().update(_OIDC_SETTINGS)
if _OIDC_SETTINGS["RECLAIMNET_OIDC_ENABLED"]:
    AUTHENTICATION_BACKENDS.append("portal.sso.backend.CampusOIDCBackend")
    _CSP_DIRECTIVES["form-action"] += _OIDC_SETTINGS["RECLAIMNET_OIDC_FORM_ACTION_ORIGINS"]  # sign-out redirect

# --- The what-if report (docs/design.md "The what-if report", portal/whatif/): evaluations on their own queue ------
INSTALLED_APPS += ["portal.whatif"]
CELERY_TASK_ROUTES["whatif.run_evaluation"] = {"queue": "evaluation"}  # never control (design §10)
SPECTACULAR_SETTINGS["ENUM_NAME_OVERRIDES"].update({  # "state" and "source" are taken by other enums
    "EvaluationStateEnum": "portal.whatif.models.EvaluationState",
    "TraceSourceEnum": "portal.whatif.models.TraceSource"})
RECLAIMNET_WHATIF_UPLOAD_MAX_BYTES = env_int("RECLAIMNET_WHATIF_UPLOAD_MAX_BYTES", 2_500_000)  # as sent (body limit)
RECLAIMNET_WHATIF_TRACE_MAX_BYTES = env_int("RECLAIMNET_WHATIF_TRACE_MAX_BYTES", 64 * 2**20)  # a zip, unzipped
RECLAIMNET_WHATIF_SOFT_TIME_LIMIT_S = env_float("RECLAIMNET_WHATIF_SOFT_TIME_LIMIT_S", 1800.0)
RECLAIMNET_WHATIF_TIME_LIMIT_S = env_float("RECLAIMNET_WHATIF_TIME_LIMIT_S", 1860.0)
