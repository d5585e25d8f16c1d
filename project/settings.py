"""Settings for the emq-django example project.

Everything can be overridden from the environment (or a `.env` file next to
manage.py) through django-environ. The defaults run on one machine: SQLite at
BASE_DIR/db.sqlite3 and EventMQ's loopback ports. The EMQ_* settings are read
by `emq_django` itself; see README.md.
"""

from pathlib import Path

import environ

BASE_DIR = Path(__file__).resolve().parent.parent

env = environ.Env()
if (BASE_DIR / ".env").is_file():
    env.read_env(BASE_DIR / ".env")

# An example project: the insecure defaults are for local use only.
SECRET_KEY = env.str("SECRET_KEY", default="django-insecure-emq-django-example-project")
DEBUG = env.bool("DEBUG", default=True)
ALLOWED_HOSTS = env.list("ALLOWED_HOSTS", default=["localhost", "127.0.0.1"])

INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "emq_django",
    "emq_django.analytics",
    "emq_django.results",
    "emq_django.backends",  # Django Tasks API: READY/RUNNING states (app label emq_tasks)
    "emq_django.scheduler",
    "emq_django.security",  # CURVE keys and roles (AuthorizedKey, manage.py emq_keys)
    "project.demo",
]

MIDDLEWARE = [
    "django.middleware.security.SecurityMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
]

ROOT_URLCONF = "project.urls"

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [BASE_DIR / "templates"],
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

WSGI_APPLICATION = "project.wsgi.application"
ASGI_APPLICATION = "project.asgi.application"

# SQLite by default; DATABASE_URL=postgres://user:pass@host:5432/name for PostgreSQL
# (pip install -e '.[postgres]').
DATABASES = {
    "default": env.db("DATABASE_URL", default=f"sqlite:///{BASE_DIR / 'db.sqlite3'}"),
}
if DATABASES["default"]["ENGINE"] == "django.db.backends.sqlite3":
    # Job managers' worker processes write results while the admin reads: WAL lets
    # readers and one writer work at once, and a busy writer waits instead of failing.
    DATABASES["default"].setdefault("OPTIONS", {}).update(
        {
            "init_command": "PRAGMA journal_mode=WAL; PRAGMA synchronous=NORMAL;",
            "transaction_mode": "IMMEDIATE",
            "timeout": 20,
        }
    )

# Job history: worker processes record every finished job in batches (README,
# "Admin dashboard and history"). EMQ_RECORDER= (empty) in the environment turns it off.
EMQ_RECORDER = env.str("EMQ_RECORDER", default="emq_django.results.recorder.DatabaseRecorder")

# The Django Tasks API (django.tasks on Django 6.0, the django-tasks package on 5.2):
# @task functions run on emq job managers (README, "Django Tasks API"). QUEUES: []
# lets a task name any emq queue.
TASKS = {"default": {"BACKEND": "emq_django.backends.EmqTaskBackend", "QUEUES": []}}

AUTH_PASSWORD_VALIDATORS = [
    {"NAME": "django.contrib.auth.password_validation.UserAttributeSimilarityValidator"},
    {"NAME": "django.contrib.auth.password_validation.MinimumLengthValidator"},
    {"NAME": "django.contrib.auth.password_validation.CommonPasswordValidator"},
    {"NAME": "django.contrib.auth.password_validation.NumericPasswordValidator"},
]

LANGUAGE_CODE = "en-us"
TIME_ZONE = "UTC"
USE_I18N = True
USE_TZ = True

STATIC_URL = "static/"
STATIC_ROOT = BASE_DIR / "staticfiles"

DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

LOG_LEVEL = env.str("LOG_LEVEL", default="INFO")

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "formatters": {
        "timestamped": {
            "format": "%(asctime)s %(levelname)-7s %(process)d %(name)s: %(message)s",
        },
    },
    "handlers": {
        "stderr": {
            "class": "logging.StreamHandler",
            "stream": "ext://sys.stderr",
            "formatter": "timestamped",
        },
    },
    "root": {"handlers": ["stderr"], "level": "WARNING"},
    "loggers": {
        "emq_django": {"handlers": ["stderr"], "level": LOG_LEVEL, "propagate": False},
        "project": {"handlers": ["stderr"], "level": LOG_LEVEL, "propagate": False},
    },
}
