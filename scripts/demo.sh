#!/usr/bin/env bash
# The quick-start demo: a toy charges API on 127.0.0.1:9000 and idemgate in front of it
# on 127.0.0.1:8080 (config/demo.yaml), running until Ctrl-C.
#
#   ./scripts/demo.sh               start both, print example requests, wait for Ctrl-C
#   DEMO_SMOKE=1 ./scripts/demo.sh  start both, check one retry is replayed, stop, exit 0/1
#   ./scripts/demo.sh story         start both, tell the demo story (examples/demo_client.rs):
#                                   a retried payment straight to the backend and through
#                                   idemgate, with the charge counts; stop, exit 0/1
#   ./scripts/demo.sh file [story]  the same on the durable file store (config/demo-file.yaml)
#                                   in a directory of the user's, printed: keys survive a
#                                   restart of the demo. IDEMGATE_DEMO_STORE chooses another
#   ./scripts/demo.sh postgres [story]
#                                   the same on PostgreSQL (config/demo-postgres.yaml): a
#                                   throwaway cluster, initdb'd in a temporary directory
#                                   under cargo's target directory and started on a free
#                                   loopback port (as root, run as the `postgres` user),
#                                   stopped and removed however the demo ends. Needs
#                                   PostgreSQL's server binaries (/usr/lib/postgresql/*/bin,
#                                   or PG_BIN naming their directory)
#
# Needs cargo, curl and bash. Both processes are stopped however the script ends; their
# logs are kept in the directory the script prints, under cargo's target directory.
set -euo pipefail

PROXY=127.0.0.1:8080
BACKEND=127.0.0.1:9000
# Start-up is polled every 0.1 s this many times (10 s) before giving up.
READY_TRIES=100

cd "$(dirname "${BASH_SOURCE[0]}")/.."

say() { printf '%s\n' "$*" >&2; }
die() {
    say "demo: $*"
    exit 1
}

command -v cargo >/dev/null || die "cargo is needed (https://rustup.rs)"
command -v curl >/dev/null || die "curl is needed"

# A port that already answers would make the readiness check pass against the wrong
# server, so refuse to start instead.
port_in_use() {
    (exec 3<>"/dev/tcp/${1%:*}/${1##*:}") 2>/dev/null
}
for addr in "$PROXY" "$BACKEND"; do
    if port_in_use "$addr"; then
        die "$addr is already in use; stop whatever listens there and try again"
    fi
done

STORE=memory
MODE=""
usage="usage: $0 [file|postgres] [story]"
for arg in "$@"; do
    case "$arg" in
        file | postgres)
            [ "$STORE" = memory ] || die "$usage"
            STORE=$arg
            ;;
        story) MODE=story ;;
        *) die "$usage" ;;
    esac
done

# PostgreSQL's server binaries, found before the build so that a missing server is said
# at once: PG_BIN, else the newest /usr/lib/postgresql/*/bin (Debian's), else PATH.
pg_bin=""
if [ "$STORE" = postgres ]; then
    if [ -n "${PG_BIN:-}" ]; then
        pg_bin=$PG_BIN
    else
        pg_bin=$(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -n 1)
        if [ -z "$pg_bin" ] && command -v pg_ctl >/dev/null; then
            pg_bin=$(dirname "$(command -v pg_ctl)")
        fi
    fi
    [ -x "$pg_bin/initdb" ] && [ -x "$pg_bin/pg_ctl" ] ||
        die "PostgreSQL's server binaries (initdb, pg_ctl) are needed: apt-get install postgresql, or set PG_BIN"
    if [ "$(id -u)" -eq 0 ]; then
        # initdb refuses to run as root: the throwaway cluster runs as `postgres`.
        id postgres >/dev/null 2>&1 || die "as root, the demo runs PostgreSQL as the user postgres, which does not exist"
        command -v runuser >/dev/null || die "as root, runuser (util-linux) is needed to run PostgreSQL as postgres"
    fi
fi

say "demo: building (cargo build --release --bin idemgate --example toy_backend --example demo_client)"
cargo build --release --bin idemgate --example toy_backend --example demo_client
# Ask cargo where it built: CARGO_TARGET_DIR or a config file may move `target/`.
target_dir=$(cargo metadata --format-version 1 --no-deps |
    sed -n 's/.*"target_directory":"\([^"]*\)".*/\1/p')
[ -n "$target_dir" ] || die "cannot find cargo's target directory"

# Everything the demo writes stays in the user's build directory: the logs of the last
# run, which the script announces and keeps, and the file store's keys, which must
# outlive the demo for a restart to replay them.
demo_dir="$target_dir/demo"
log_dir="$demo_dir/logs"
mkdir -p "$log_dir"
if [ "$STORE" = file ]; then
    config=config/demo-file.yaml
    IDEMGATE_DEMO_STORE=${IDEMGATE_DEMO_STORE:-$demo_dir/file-store}
    export IDEMGATE_DEMO_STORE
    say "demo: file store in $IDEMGATE_DEMO_STORE (remove it to start afresh)"
elif [ "$STORE" = postgres ]; then
    config=config/demo-postgres.yaml
else
    config=config/demo.yaml
fi
backend_pid=""
proxy_pid=""
# The throwaway PostgreSQL cluster's directory, once made; removed by cleanup.
pg_dir=""
pg_log=""

# Runs a PostgreSQL program as the user the cluster belongs to.
as_pg() {
    if [ "$(id -u)" -eq 0 ]; then
        runuser -u postgres -- "$@"
    else
        "$@"
    fi
}

# Stops what this script started: SIGTERM lets each finish its in-flight requests; the
# PostgreSQL cluster goes last (idemgate may still be recording) and is removed.
# shellcheck disable=SC2317  # called from the traps below
cleanup() {
    local pid
    trap - EXIT INT TERM
    for pid in $proxy_pid $backend_pid; do
        kill -TERM "$pid" 2>/dev/null || true
    done
    for pid in $proxy_pid $backend_pid; do
        wait "$pid" 2>/dev/null || true
    done
    if [ -n "$pg_dir" ]; then
        if [ -f "$pg_dir/data/postmaster.pid" ]; then
            as_pg "$pg_bin/pg_ctl" -D "$pg_dir/data" -m fast -w stop >/dev/null 2>&1 || true
        fi
        # The server's log is kept with the others; the cluster goes.
        cp "$pg_log" "$log_dir/postgres.log" 2>/dev/null || true
        rm -rf "$pg_dir"
    fi
}
trap cleanup EXIT
trap 'say "demo: stopping"; cleanup; exit 130' INT
trap 'say "demo: stopping"; cleanup; exit 143' TERM

# The throwaway cluster: initdb in a temporary directory (under the demo's, when the
# postgres user can reach it there), then a server on a free loopback port, tried
# afresh on another port if the one found free was taken meanwhile. Trust
# authentication is safe only because it listens on 127.0.0.1 and lives for the demo.
if [ "$STORE" = postgres ]; then
    pg_dir=$(mktemp -d "$demo_dir/postgres.XXXXXX")
    if [ "$(id -u)" -eq 0 ]; then
        chown postgres "$pg_dir"
        if ! runuser -u postgres -- test -w "$pg_dir"; then
            rm -rf "$pg_dir"
            pg_dir=$(mktemp -d "${TMPDIR:-/tmp}/idemgate-demo-postgres.XXXXXX")
            chown postgres "$pg_dir"
        fi
    fi
    pg_log="$pg_dir/postgres.log"
    say "demo: initdb $pg_dir/data ($pg_bin)"
    if ! as_pg "$pg_bin/initdb" -D "$pg_dir/data" -U postgres -A trust -E UTF8 --locale=C \
        --no-sync >"$log_dir/initdb.log" 2>&1; then
        tail -n 20 "$log_dir/initdb.log" >&2 || true
        die "initdb failed ($log_dir/initdb.log)"
    fi
    pg_port=""
    for _ in 1 2 3 4 5; do
        port=$((20000 + RANDOM % 40000))
        if port_in_use "127.0.0.1:$port"; then
            continue
        fi
        if as_pg "$pg_bin/pg_ctl" -D "$pg_dir/data" -l "$pg_log" -w -t 30 \
            -o "-p $port -c listen_addresses=127.0.0.1 -c unix_socket_directories=''" \
            start >/dev/null 2>&1; then
            pg_port=$port
            break
        fi
    done
    if [ -z "$pg_port" ]; then
        tail -n 20 "$pg_log" >&2 || true
        die "PostgreSQL did not start ($pg_log)"
    fi
    IDEMGATE_DEMO_PGURL="postgres://postgres@127.0.0.1:$pg_port/postgres?sslmode=disable"
    export IDEMGATE_DEMO_PGURL
    say "demo: PostgreSQL on 127.0.0.1:$pg_port, data in $pg_dir (removed when the demo stops)"
    say "demo: it has no standby, so idemgate warns that synchronous_standby_names is empty"
fi

"$target_dir/release/examples/toy_backend" --listen "$BACKEND" 2>"$log_dir/backend.log" &
backend_pid=$!
"$target_dir/release/idemgate" --config "$config" 2>"$log_dir/idemgate.log" &
proxy_pid=$!

show_logs() {
    say "--- toy backend ($log_dir/backend.log)"
    tail -n 20 "$log_dir/backend.log" >&2 || true
    say "--- idemgate ($log_dir/idemgate.log)"
    tail -n 20 "$log_dir/idemgate.log" >&2 || true
    if [ -n "$pg_log" ]; then
        say "--- PostgreSQL ($pg_log)"
        tail -n 20 "$pg_log" >&2 || true
    fi
}

# Ready when a GET through the proxy reaches the backend: that needs both listening.
ready=""
for _ in $(seq "$READY_TRIES"); do
    for pid in $backend_pid $proxy_pid; do
        if ! kill -0 "$pid" 2>/dev/null; then
            show_logs
            die "a process exited during start-up"
        fi
    done
    if curl -fsS -o /dev/null --max-time 1 "http://$PROXY/healthz" 2>/dev/null; then
        ready=1
        break
    fi
    sleep 0.1
done
if [ -z "$ready" ]; then
    show_logs
    die "not ready after $((READY_TRIES / 10)) s"
fi

say "demo: toy backend on http://$BACKEND, idemgate on http://$PROXY ($STORE store; logs in $log_dir)"

# One POST /charges with key $1; prints the status line, the replay header (if any)
# and the body, and leaves them in $status, $replayed and $body for the smoke check.
post_charge() {
    local out
    out=$(curl -sS -i --max-time 10 -X POST "http://$PROXY/charges" \
        -H "Idempotency-Key: $1" -H 'Content-Type: application/json' \
        -d '{"amount": 1200}' | tr -d '\r') || die "POST /charges through $PROXY failed"
    status=$(printf '%s\n' "$out" | sed -n '1s/^HTTP\/[0-9.]* \([0-9]*\).*/\1/p')
    replayed=$(printf '%s\n' "$out" |
        sed -n 's/^[Ii]dempotent-[Rr]eplayed: *\(.*\)$/\1/p')
    body=$(printf '%s\n' "$out" | sed '1,/^$/d')
    printf '  -> %s%s %s\n' "$status" "${replayed:+ (Idempotent-Replayed: $replayed)}" "$body"
}

if [ "$MODE" = story ]; then
    say "demo: the story, told twice"
    if "$target_dir/release/examples/demo_client" --proxy "http://$PROXY" --backend "http://$BACKEND"; then
        exit 0
    fi
    show_logs
    exit 1
fi

if [ "${DEMO_SMOKE:-}" = 1 ]; then
    key="demo-smoke-$$-$RANDOM"
    say "demo: smoke test: POST /charges twice with Idempotency-Key: $key"
    post_charge "$key"
    first_status=$status first_replayed=$replayed first_body=$body
    post_charge "$key"
    stats=$(curl -fsS --max-time 5 "http://$BACKEND/stats")
    printf '  backend /stats -> %s\n' "$stats"

    failures=()
    [ "$first_status" = 201 ] || failures+=("first POST answered $first_status, expected 201")
    [ -z "$first_replayed" ] || failures+=("first POST carries Idempotent-Replayed")
    [ "$status" = 201 ] || failures+=("second POST answered $status, expected 201")
    [ "$replayed" = true ] || failures+=("second POST lacks Idempotent-Replayed: true")
    [ "$body" = "$first_body" ] || failures+=("second POST's body differs from the first's")
    [[ "$stats" =~ \"charges_created\":1[^0-9] ]] ||
        failures+=("backend did not create exactly one charge: $stats")
    if [ ${#failures[@]} -gt 0 ]; then
        printf 'demo: smoke test FAILED:\n' >&2
        printf '  - %s\n' "${failures[@]}" >&2
        show_logs
        exit 1
    fi
    say "demo: smoke test passed: the retry was replayed and the backend charged once"
    exit 0
fi

cat <<EOF

Try it (in another terminal):

  # Create a charge. Run it twice: the second answer is the same charge, replayed,
  # with "Idempotent-Replayed: true", and the backend did not run it again.
  curl -i -X POST http://$PROXY/charges \\
    -H 'Idempotency-Key: order-42' -H 'Content-Type: application/json' \\
    -d '{"amount": 1200}'

  # How many charges the backend really created.
  curl -s http://$BACKEND/stats

  # Same key, different body: 422 key-reused, nothing executed.
  curl -i -X POST http://$PROXY/charges \\
    -H 'Idempotency-Key: order-42' -H 'Content-Type: application/json' \\
    -d '{"amount": 9900}'

  # No key on a guarded route ($config sets required: true): 400 missing-key.
  curl -i -X POST http://$PROXY/charges -d '{"amount": 1200}'
EOF
if [ "$STORE" = file ]; then
    cat <<EOF

  # The keys are on disk: stop the demo (Ctrl-C), start it again, and send the first
  # request again. It is replayed, though the new backend has created no charge.
EOF
fi
if [ "$STORE" = postgres ]; then
    cat <<EOF

  # The records are rows of idemgate_records, one per key, its id a hash of the key
  # and scope (never the key itself). This cluster is removed when the demo stops.
  psql '$IDEMGATE_DEMO_PGURL' -c 'SELECT id, length(value), expires_at, owner IS NULL AS completed FROM idemgate_records'

PostgreSQL's log: $pg_log (kept as $log_dir/postgres.log when the demo stops)
EOF
fi
cat <<EOF

Logs (kept after the demo stops): $log_dir/idemgate.log and $log_dir/backend.log
Press Ctrl-C to stop both.
EOF

# Ctrl-C runs the INT trap; this loop only notices a process that died on its own.
# (A liveness poll rather than `wait -n`, which macOS's bash 3.2 lacks.)
while kill -0 "$backend_pid" 2>/dev/null && kill -0 "$proxy_pid" 2>/dev/null; do
    sleep 1
done
show_logs
die "a process exited on its own"
