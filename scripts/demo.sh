#!/usr/bin/env bash
# `make demo`: migrate, create the admin login, then run the broker, a job manager,
# the web server and a sample producer until Ctrl-C. Every process is stopped by
# its PID (and its process group, for the job manager's workers) on the way out.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

PY="${PYTHON:-.venv/bin/python}"
WEB_ADDR="${WEB_ADDR:-127.0.0.1:8000}"
# The EMQ_* environment variables move the demo to other ports (README, Settings).
BROKER_URL="${EMQ_BROKER_URL:-tcp://127.0.0.1:47291}"
export PYTHONUNBUFFERED=1
# The broker's trace log, for `manage.py emq_analyze` (the admin's metrics page).
export EMQ_TRACE_DIR="${EMQ_TRACE_DIR:-$PWD/var/trace}"
# The demo shows jobs' arguments in the admin (masked by default elsewhere).
export EMQ_RESULTS_SHOW_ARGS="${EMQ_RESULTS_SHOW_ARGS:-true}"

"$PY" manage.py migrate --noinput

# createsuperuser has no "if missing"; tell "already taken" apart from real errors.
if ! out=$(DJANGO_SUPERUSER_USERNAME=admin DJANGO_SUPERUSER_PASSWORD=admin \
    DJANGO_SUPERUSER_EMAIL=admin@example.com \
    "$PY" manage.py createsuperuser --noinput 2>&1); then
  if grep -q "already taken" <<<"$out"; then
    echo "Superuser admin already exists."
  else
    echo "$out" >&2
    exit 1
  fi
else
  echo "Created superuser admin (password admin)."
fi

pids=()
names=()

# Job control puts each process in its own process group (pgid = pid), so a Ctrl-C
# reaches only this script, which then stops them in order; it is switched off
# again so that bash does not print a notice for every process it stops.
start() {
  local name=$1
  shift
  set -m
  "$PY" manage.py "$@" &
  set +m
  pids+=("$!")
  names+=("$name")
  echo "started $name (pid $!)"
}

# SIGTERM one process, give it 5 s, then SIGKILL its whole group (workers included).
stop_one() {
  local pid=$1 name=$2 t
  kill -TERM "$pid" 2>/dev/null || true
  for ((t = 0; t < 50; t++)); do
    kill -0 "$pid" 2>/dev/null || break
    sleep 0.1
  done
  if kill -0 "$pid" 2>/dev/null; then
    echo "$name (pid $pid) did not stop in 5 s; killing it"
  fi
  kill -KILL -- "-$pid" 2>/dev/null || true
}

stopping=0
stop_all() {
  [ "$stopping" = 1 ] && return
  stopping=1
  # A second signal must not cut the stopping short: `make` passes its own
  # SIGTERM on to this script, which would otherwise exit here and leave the
  # processes below running.
  trap '' INT TERM
  echo
  echo "stopping demo processes..."
  local i
  # Newest first: producer, web, job manager, then the broker they talk to.
  for ((i = ${#pids[@]} - 1; i >= 0; i--)); do
    stop_one "${pids[i]}" "${names[i]}"
  done
  wait 2>/dev/null || true
}
trap stop_all EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

wait_for_port() {
  local port=$1 i
  for ((i = 0; i < 100; i++)); do
    if (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null; then
      return 0
    fi
    sleep 0.1
  done
  echo "nothing listens on 127.0.0.1:$port after 10 s" >&2
  return 1
}

start broker emq_broker
wait_for_port "${BROKER_URL##*:}"
start jobmanager emq_jobmanager --queues default:10,email:40 --concurrency 2
start scheduler emq_scheduler
start web runserver --noreload "$WEB_ADDR"
start producer emq_demo

cat <<TXT

  emq-django demo is running.
    Admin:  http://$WEB_ADDR/admin/   (login: admin / admin)
    Status: $PY manage.py emq_status
    Charts: $PY manage.py emq_analyze   (trace in $EMQ_TRACE_DIR), then
            http://$WEB_ADDR/admin/emq_analytics/metricsdashboard/
  Press Ctrl-C to stop.

TXT

# Return when any one process exits (or on Ctrl-C); the trap stops the rest.
set +e
wait -n "${pids[@]}"
status=$?
set -e
for i in "${!pids[@]}"; do
  if ! kill -0 "${pids[i]}" 2>/dev/null; then
    echo "${names[i]} (pid ${pids[i]}) exited; stopping the demo." >&2
  fi
done
exit "$status"
