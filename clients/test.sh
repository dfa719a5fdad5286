#!/usr/bin/env bash
# Builds each client package from a clean copy of the sources (tracked and
# new files, nothing git ignores: no stubs, node_modules or vendor/),
# installs it in a fresh environment the ecosystem's way, then runs the
# cross-language conformance scenario (clients/conformance/driver.py) with
# the installed packages. The driver ends with "N passed, M failed" and
# exits non-zero on any failure.
#
#   Python  pip wheel (stubs compiled at build time) -> pip install into a new venv
#   Node    npm pack (proto + generated .d.ts bundled) -> npm install into a temp app; tsc checks a TS consumer
#   Go      go generate + vendor/ from Debian's grpc-go -> go vet, go build (offline)
#   Ruby    gem build (stubs generated) -> gem install --local into a temp GEM_HOME
#   Rust    cargo build of tumbler-client's conformance steps (the workspace's crate, --locked)
#   Connect npm ci of @connectrpc/connect-node, buf + protoc-gen-es generate from proto/,
#           then clients/connect-node/check.mjs against `tumbler dev` (Connect, gRPC-Web)
#   Perl    perl Makefile.PL && make && prove -b t (Tumbler::Client over Connect JSON,
#           core modules only; IPC::ConcurrencyLimit::Lock::Tumbler) against `tumbler dev`,
#           then make install into a temp INSTALL_BASE for the conformance steps
#   Java    clients/java/build.sh test: javac and jar with the JDK alone (no Maven, no network), then
#           its JUnit 5 tests (Debian's junit5, one JVM) against real redis-server and tumbler serve;
#           the conformance steps run with the jars it built
#   Sidekiq gem build tumbler-sidekiq -> gem install --local into the same GEM_HOME, then
#           the Ruby tests that need real servers (clients/ruby-sidekiq/test/run.sh:
#           Tumbler::QueuedLocks, and tumbler-sidekiq with real redis-server,
#           tumbler serve and `sidekiq -r test/app.rb` processes; minitest)
#   Celery  pip wheel tumbler-celery -> pip install into the Python venv (celery[redis] and
#           pytest from PyPI), then its pytest suite: a real `celery worker` (prefork) and a
#           real Sidekiq process (the gems above) against redis-server and tumbler serve
#
# Installs what is missing first: Debian packages (Go, Ruby, protoc, Redis),
# PyPI and npm packages by name. Builds the server only if
# target/debug/tumbler is missing.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD

need_root() { if [ "$(id -u)" -eq 0 ]; then "$@"; else sudo "$@"; fi; }

debs=(redis-server protobuf-compiler
      golang-go golang-google-grpc-dev golang-github-golang-protobuf-1-5-dev protoc-gen-go protoc-gen-go-grpc
      ruby ruby-grpc ruby-google-protobuf ruby-grpc-tools
      ruby-sidekiq ruby-redis ruby-activesupport ruby-minitest
      openjdk-17-jdk-headless junit5 libcpanel-json-xs-perl)
missing=()
for p in "${debs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  if ! command -v apt-get >/dev/null 2>&1; then
    echo "missing: ${missing[*]} (Debian package names); install them with your package manager" >&2
    exit 1
  fi
  echo "==> installing Debian packages: ${missing[*]}"
  need_root apt-get update -qq
  need_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq -o DPkg::Lock::Timeout=300 "${missing[@]}" >/dev/null
fi

if [ ! -x target/debug/tumbler ]; then
  echo "==> building the server (cargo build --bin tumbler)"
  cargo build --locked --bin tumbler
fi

work=$(mktemp -d "${TMPDIR:-/tmp}/tumbler-clients.XXXXXX")
trap 'rm -rf "$work"' EXIT
src=$work/src
mkdir -p "$src" "$work/dist"
if git rev-parse --git-dir >/dev/null 2>&1; then
  git ls-files -co --exclude-standard -- clients proto | tar -cf - -T - | tar -xf - -C "$src"
else
  cp -r clients proto "$src/"
fi
# Each step says when it starts, in seconds since the start (where CI's
# time goes).
step() { echo "==> [${SECONDS}s] $*"; }

step "python: pip wheel from a clean copy, install into a fresh venv"
python3 -m venv "$work/venv"
"$work/venv/bin/pip" wheel -q --no-deps -w "$work/dist" "$src/clients/python"
"$work/venv/bin/pip" install -q "$work"/dist/tumbler_client-*.whl
"$work/venv/bin/python" -c 'import tumbler_client, sys; print("    installed", tumbler_client.__file__)'

step "node: npm pack (proto and types bundled), install into a fresh app"
(cd "$src/clients/node" && npm ci --no-audit --no-fund --loglevel=error &&
  npm pack --pack-destination "$work/dist" --loglevel=error >/dev/null)
mkdir -p "$work/node-app"
(cd "$work/node-app" && npm init -y >/dev/null &&
  npm install --no-audit --no-fund --loglevel=error "$work"/dist/tumbler-client-*.tgz >/dev/null)
cat > "$work/node-app/check.ts" <<'EOF'
import { Client, Lock, LockLostError, NotAcquiredError } from 'tumbler-client';
async function run(client: Client): Promise<string> {
  return client.withLock('reports', { waitMs: 1000, ttlMs: 3000 }, async (lock: Lock, signal: AbortSignal) => {
    if (signal.aborted) throw new LockLostError();
    return lock.fencingToken;
  }).catch((e: unknown) => (e instanceof NotAcquiredError && e.busy ? 'busy' : 'error'));
}
async function readWrite(client: Client): Promise<'read' | 'write' | null> {
  const lock: Lock = await client.acquire('catalog', { mode: 'write', waitMs: 1000, preferReaders: false });
  await lock.downgrade();
  return lock.mode;
}
async function weighted(client: Client): Promise<number[]> {
  const lock: Lock = await client.acquire('exports', { limit: 10, permits: 3 });
  const permits: number = lock.permits;
  return permits === 3 ? lock.slots : [];
}
export { run, readWrite, weighted };
EOF
(cd "$work/node-app" && node "$src/clients/node/node_modules/typescript/bin/tsc" --noEmit --strict \
  --module commonjs --moduleResolution node --target es2022 --lib es2022,dom check.ts)
echo "    installed $(cd "$work/node-app" && node -p 'require.resolve("tumbler-client")'); check.ts type-checks"
# The installed package's own tests: easy mistakes, and its Connect
# transport against a real tumbler serve and redis-server.
NODE_PATH="$work/node-app/node_modules" TUMBLER_BIN="$root/target/debug/tumbler" node --test "$src/clients/node/test/"

step "go: go generate, vendor/ from Debian's grpc-go, go vet, go build"
(cd "$src/clients/go" && go generate ./... && ./vendor-debian.sh && go vet ./... &&
  go build -o "$work/go-bin/" ./cmd/...)

step "ruby: gem build, gem install --local into a fresh GEM_HOME"
(cd "$src/clients/ruby" && gem build -q tumbler-client.gemspec >/dev/null &&
  GEM_HOME="$work/gems" gem install -q --local --no-document tumbler-client-*.gem >/dev/null)
GEM_HOME="$work/gems" ruby -e 'require "tumbler"; puts "    installed #{$LOADED_FEATURES.grep(/tumbler\/client/).first}"'

step "ruby-sidekiq: gem build tumbler-sidekiq, gem install --local into the same GEM_HOME"
(cd "$src/clients/ruby-sidekiq" && gem build -q tumbler-sidekiq.gemspec >/dev/null &&
  GEM_HOME="$work/gems" gem install -q --local --no-document tumbler-sidekiq-*.gem >/dev/null)
GEM_HOME="$work/gems" ruby -e 'require "tumbler/sidekiq"; puts "    installed #{$LOADED_FEATURES.grep(/tumbler\/sidekiq\.rb/).first} (sidekiq #{Sidekiq::VERSION})"'

step "ruby-sidekiq: Tumbler::QueuedLocks and tumbler-sidekiq against real servers and real Sidekiq processes"
GEM_HOME="$work/gems" TUMBLER_BIN="$root/target/debug/tumbler" TUMBLER_TEST_LOGS="$work/ruby-test-logs" \
  "$src/clients/ruby-sidekiq/test/run.sh" || {
    for f in "$work"/ruby-test-logs/*.log; do echo "---- ${f##*/} (last lines)"; tail -n 25 "$f"; done
    exit 1
  }

step "rust: cargo build tumbler-client and its conformance steps (--locked)"
# --workspace: the features the suite built with, so nothing is rebuilt.
cargo build --locked -q --workspace --example conformance_steps
echo "    built $root/target/debug/examples/conformance_steps"

step "connect-node: @connectrpc/connect-node against tumbler dev (Connect JSON and binary, Watch streaming, gRPC-Web)"
(cd "$src/clients/connect-node" && npm ci --no-audit --no-fund --loglevel=error &&
  npm run --silent generate && TUMBLER_BIN="$root/target/debug/tumbler" node check.mjs)

step "perl: perl Makefile.PL && make && prove -b t && make install (Tumbler::Client, Tumbler::Lock, the IPC::ConcurrencyLimit lock class against tumbler dev)"
(cd "$src/clients/perl" && perl Makefile.PL INSTALL_BASE="$work/perl5" >/dev/null && make -s >/dev/null &&
  TUMBLER_BIN="$root/target/debug/tumbler" prove -b t && make -s install >/dev/null)
echo "    installed $(PERL5LIB="$work/perl5/lib/perl5" perl -MTumbler::Client -e 'print $INC{"Tumbler/Client.pm"}')"

step "java: clients/java/build.sh test (javac and jar, the JDK alone; JUnit 5 against real redis-server and tumbler serve)"
OUT="$work/java" TUMBLER_BIN="$root/target/debug/tumbler" "$src/clients/java/build.sh" test

step "python-celery: pip wheel tumbler-celery, install into the Python venv; pytest with a real Celery worker and a real Sidekiq"
"$work/venv/bin/pip" wheel -q --no-deps -w "$work/dist" "$src/clients/python-celery"
"$work/venv/bin/pip" install -q "$work"/dist/tumbler_celery-*.whl "celery[redis]>=5.3,<6" "pytest>=7"
GEM_HOME="$work/gems" TUMBLER_BIN="$root/target/debug/tumbler" TUMBLER_TEST_LOGS="$work/celery-test-logs" \
  "$work/venv/bin/python" -m pytest -q -p no:cacheprovider "$src/clients/python-celery/tests" || {
    for f in "$work"/celery-test-logs/*.log; do echo "---- ${f##*/} (last lines)"; tail -n 25 "$f"; done
    exit 1
  }

step "python: the Connect transport of the installed tumbler-client (tests/test_transport.py against a real tumbler serve)"
TUMBLER_BIN="$root/target/debug/tumbler" "$work/venv/bin/python" "$src/clients/python/tests/test_transport.py"

echo "==> python $("$work/venv/bin/python" -c 'import grpc; print("grpcio", grpc.__version__)'), node $(node --version), $(go version | cut -d' ' -f3), ruby $(ruby -e 'require "grpc"; print RUBY_VERSION, " grpc ", GRPC::VERSION')"
export TUMBLER_PYTHON=$work/venv/bin/python TUMBLER_GO_BIN=$work/go-bin TUMBLER_GO_MODULE=$src/clients/go \
  TUMBLER_RUST_STEPS=$root/target/debug/examples/conformance_steps \
  TUMBLER_NODE_APP=$work/node-app NODE_PATH=$work/node-app/node_modules GEM_HOME=$work/gems \
  TUMBLER_PERL5LIB=$work/perl5/lib/perl5 \
  TUMBLER_JAVA_CP=$work/java/tumbler-client.jar:$work/java/tumbler-conformance.jar
step "conformance: the cross-language scenario with the installed packages"
"$work/venv/bin/python" "$src/clients/conformance/driver.py" --server "$root/target/debug/tumbler" "$@"
step "the client bench's smoke size"
TUMBLER_BIN="$root/target/debug/tumbler" "$root/bench/clients/run.sh" --quick  # the client bench's smoke size (docs/benchmarks/notebook.md, "Clients: the price of moving over")
