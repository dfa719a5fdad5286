#!/usr/bin/env bash
# Runs the Ruby tests that need real servers, in one minitest run:
#   clients/ruby/test/queued_locks_test.rb   Tumbler::QueuedLocks against two tumbler replicas
#   clients/ruby-sidekiq/test/*_test.rb      tumbler-sidekiq with real `sidekiq -r test/app.rb` processes
# Each suite starts its own redis-server and `tumbler serve` on free loopback
# ports and stops them (and every Sidekiq it started) by pid.
#
# With the gems installed (clients/test.sh: GEM_HOME holds tumbler-client and
# tumbler-sidekiq) the installed gems are tested; otherwise the sources are
# (the stubs are generated first). Needs Debian's ruby-sidekiq, ruby-redis,
# ruby-activesupport, ruby-minitest, ruby-grpc; TUMBLER_BIN (default
# target/debug/tumbler). Arguments go to minitest (e.g. -n /sigkill/).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
clients=$(cd "$here/../.." && pwd)
root=$(cd "$clients/.." && pwd)
export TUMBLER_BIN=${TUMBLER_BIN:-$root/target/debug/tumbler}
if ! ruby -e 'gem "tumbler-sidekiq"; gem "tumbler-client"' 2>/dev/null; then
  # (again when the proto changed since: stubs without a new RPC would fail its tests)
  stubs="$clients/ruby/lib/tumbler/v1/lock_services_pb.rb"
  [ -f "$stubs" ] && [ "$stubs" -nt "$root/proto/tumbler/v1/lock.proto" ] || "$clients/ruby/generate.sh"
  export RUBYLIB="$clients/ruby/lib:$clients/ruby-sidekiq/lib${RUBYLIB:+:$RUBYLIB}"
fi
cd "$clients/ruby-sidekiq"
exec ruby -e 'dirs = []
dirs << ARGV.shift until ARGV.empty? || ARGV.first == "--"
ARGV.shift
dirs.each { |d| Dir[File.join(d, "*_test.rb")].sort.each { |f| require f } }' \
  "$clients/ruby/test" "$here" -- -v "$@" < /dev/null
