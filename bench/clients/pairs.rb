# ruby pairs.rb TARGET ADDR CALLERS PAIRS SECS
#
# The Ruby arms of bench/clients/run.sh: acquire+release pairs, try-once,
# each caller on its own lock name. TARGET `tumbler` (the tumbler-client gem
# with its default transport, Connect over kept-alive HTTP/1.1, one
# Tumbler::Client shared by CALLERS threads), `tumbler-grpc` (the same with
# transport: :grpc, the grpc gem) or `redis`
# (ruby-redis, as Sidekiq apps use it: a ConnectionPool of CALLERS Redis
# connections; SET key token NX PX ttl, then compare-and-delete by EVALSHA,
# loading the script on NOSCRIPT). A warm-up of 20 pairs per caller, then
# up to PAIRS pairs in all, cut at SECS seconds. Prints "pairs=N secs=S";
# a pair not granted and released fails the run.
require 'securerandom'

TTL_MS = 10_000
UNLOCK = "if redis.call('get',KEYS[1])==ARGV[1] then return redis.call('del',KEYS[1]) end return 0"

target, addr, callers, pairs, secs = ARGV[0], ARGV[1], Integer(ARGV[2]), Integer(ARGV[3]), Float(ARGV[4])
host, port = addr.split(':')
Thread.abort_on_exception = false

def now = Process.clock_gettime(Process::CLOCK_MONOTONIC)

def run_callers(callers, total, deadline, &pair)
  done = Array.new(callers, 0)
  threads = Array.new(callers) do |i|
    n = total / callers + (i < total % callers ? 1 : 0)
    Thread.new do
      name = "bench-ruby-#{Process.pid}-#{i}"
      n.times do
        break if deadline && now >= deadline
        pair.call(name)
        done[i] += 1
      end
    end
  end
  threads.each(&:join) # re-raises a caller's error
  done.sum
end

def measure(callers, pairs, secs, &pair)
  run_callers(callers, 20 * callers, nil, &pair)
  start = now
  done = run_callers(callers, pairs, start + secs, &pair)
  [done, now - start]
end

case target
when 'tumbler', 'tumbler-grpc'
  require 'tumbler'
  client = Tumbler::Client.new(addr, transport: target == 'tumbler' ? :auto : :grpc)
  result = measure(callers, pairs, secs) do |name|
    lock = client.acquire(name, ttl_ms: TTL_MS)
    raise "release #{name}: not held" unless lock.release
  end
when 'redis'
  require 'redis'
  require 'connection_pool'
  pool = ConnectionPool.new(size: callers) { Redis.new(host: host, port: Integer(port)) }
  sha = pool.with { |r| r.script(:load, UNLOCK) }
  result = measure(callers, pairs, secs) do |name|
    token = SecureRandom.hex(16)
    pool.with do |r|
      raise "SET #{name}: not acquired" unless r.set(name, token, nx: true, px: TTL_MS)
      deleted = begin
        r.evalsha(sha, keys: [name], argv: [token])
      rescue Redis::CommandError => e
        raise unless e.message.start_with?('NOSCRIPT')
        r.eval(UNLOCK, keys: [name], argv: [token])
      end
      raise "unlock #{name}: not held" unless deleted == 1
    end
  end
else
  abort "unknown target #{target}"
end
puts format('pairs=%d secs=%.6f', *result)
