# One image for every emq-django process of the example project (docker-compose.yml).
FROM python:3.11-slim

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1

WORKDIR /app

# Only what the image needs: no .venv, db.sqlite3 or logs from the build context.
COPY pyproject.toml README.md manage.py ./
COPY emq_django ./emq_django
COPY project ./project
COPY templates ./templates
RUN pip install -e '.[postgres]'

# The broker's journal and the CURVE keys live in named volumes mounted on these
# directories; a new volume takes their owner, so the emq user can write there.
RUN useradd --create-home --uid 1000 emq && chown -R emq /app \
    && mkdir -p /var/lib/emq /var/lib/emq-keys \
    && chown emq /var/lib/emq && chown emq /var/lib/emq-keys && chmod 700 /var/lib/emq-keys
USER emq

# The broker's ports are for the containers of its network: docker-compose.yml
# publishes none of them on the host (only the admin, on the host's loopback).
EXPOSE 8000 47290 47291 47293
CMD ["python", "manage.py", "runserver", "0.0.0.0:8000"]
