#!/usr/bin/env bash
# Failover at scale (issue 42): three idemgate replicas on a store whose master or primary
# is killed (kill -9) again and again under a load of keyed requests, and what that cost,
# from the upstream's own ledger. The work is the test chaos_scale::from_the_command_line
# (tests/it/chaos_scale/); this builds and runs it with the flags below, on 127.0.0.1
# only, and stops everything it started (its own process group) however it ends.
#
#   scripts/chaos.sh --topology cluster|sentinel|postgres [--min-replicas N]
#                    [--async-standby] [--keys N] [--failovers N] [--seed N] [--quick]
#
# --quick is the CI-sized run (300 keys, 2 failovers); otherwise 10,000 keys and 5
# failovers unless --keys/--failovers say otherwise. Prints a table, then one JSON line
# last (keys, executed_twice, no_answer, records_lost, failovers, window_s, ...). The
# whole output of the test goes to target/tmp/chaos-TOPOLOGY.log.
set -euo pipefail
cd "$(dirname "$0")/.."

usage() { sed -n '2,15p' "$0" | sed 's/^# \{0,1\}//' >&2; exit 2; }
topology="" min_replicas="" async="0" keys="" failovers="" seed="" quick="0"
while [ $# -gt 0 ]; do
  case "$1" in
    --topology) topology="${2:-}"; shift 2 ;;
    --min-replicas) min_replicas="${2:-}"; shift 2 ;;
    --async-standby) async="1"; shift ;;
    --keys) keys="${2:-}"; shift 2 ;;
    --failovers) failovers="${2:-}"; shift 2 ;;
    --seed) seed="${2:-}"; shift 2 ;;
    --quick) quick="1"; shift ;;
    -h|--help) usage ;;
    *) echo "unknown argument: $1" >&2; usage ;;
  esac
done
case "$topology" in cluster|sentinel|postgres) ;; *) usage ;; esac
if [ "$topology" = cluster ] && [ "${min_replicas:-0}" != 0 ]; then
  echo "idemgate refuses store.min_replicas with a Redis Cluster (docs/configuration.md)" >&2
  exit 2
fi
if [ "$async" = 1 ] && [ "$topology" != postgres ]; then
  echo "--async-standby is for --topology postgres" >&2
  exit 2
fi

cargo test --features chaos-cli --test it --no-run --quiet
export IDEMGATE_CHAOS_TOPOLOGY="$topology" IDEMGATE_CHAOS_ASYNC_STANDBY="$async" \
  IDEMGATE_CHAOS_QUICK="$quick"
[ -n "$min_replicas" ] && export IDEMGATE_CHAOS_MIN_REPLICAS="$min_replicas"
[ -n "$keys" ] && export IDEMGATE_CHAOS_KEYS="$keys"
[ -n "$failovers" ] && export IDEMGATE_CHAOS_FAILOVERS="$failovers"
[ -n "$seed" ] && export IDEMGATE_CHAOS_SEED="$seed"

mkdir -p target/tmp
log="target/tmp/chaos-$topology.log"
# The run bounds itself (20 minutes, 100 s with --quick); this is the backstop.
if [ "$quick" = 1 ]; then limit=300; else limit=1800; fi
# Its own process group: the test's redis-server, postgres and idemgate children are in
# it, and go with it.
setsid timeout --signal=TERM --kill-after=10 "$limit" \
  cargo test --features chaos-cli --test it -- --exact --nocapture chaos_scale::from_the_command_line \
  >"$log" 2>&1 &
pid=$!
stop() { kill -TERM -- "-$pid" 2>/dev/null || true; }
trap stop EXIT INT TERM
status=0
wait "$pid" || status=$?
trap - EXIT INT TERM
stop
if ! grep -q '^chaos-scale| {' "$log"; then
  tail -n 60 "$log" >&2
  echo "the run failed (status $status); its output: $log" >&2
  exit 1
fi
sed -n 's/^chaos-scale| //p' "$log" | grep -v '^{' || true
sed -n 's/^chaos-scale| //p' "$log" | grep '^{' | tail -n 1
exit "$status"
