# ruby breakdown.rb WHAT ADDR PAIRS [TRANSPORT]
#
# Where a call of the tumbler-client gem goes, beside bound.rb's bare round
# trips (issue 50 item 4). One caller, sequential acquire+release pairs as
# run.sh makes them (try-once, lease 10 s), a warm-up of 200 pairs, then
# PAIRS. TRANSPORT: auto (default: Connect for a plaintext client) or grpc.
# WHAT:
#
#   own      the client's own Ruby per call: the same pairs with the
#            transport replaced by one that answers at once with a canned
#            reply (request building, holder ids, deadline arithmetic, the
#            retry loop, Lock objects, reading the reply); ADDR is not contacted
#   client   the real pairs: µs per call, CPU (user+system) per call of
#            this process, and objects allocated per call
#
# Prints "WHAT TRANSPORT: N µs per call, ...".
require 'tumbler'

what, addr, n, transport = ARGV[0], ARGV[1], Integer(ARGV[2]), (ARGV[3] || 'auto').to_sym
client = Tumbler::Client.new(addr, transport: transport)
name = "profile-rb-#{Process.pid}"
V1 = Tumbler::V1

if what == 'own'
  grant = V1::Grant.new(holder: 'h', fencing_token: 1, slot: 1, ttl_ms: 10_000, kind: 'default', permits: 1)
  acquired = V1::AcquireResponse.encode(V1::AcquireResponse.new(status: :ACQUIRE_STATUS_ACQUIRED, grant: grant, holders: 1))
  released = V1::ReleaseResponse.encode(V1::ReleaseResponse.new(status: :RELEASE_STATUS_RELEASED))
  canned = Object.new
  canned.define_singleton_method(:acquire) do |req, **|
    req.class.encode(req) # as a transport would
    V1::AcquireResponse.decode(acquired)
  end
  canned.define_singleton_method(:release) do |req, **|
    req.class.encode(req)
    V1::ReleaseResponse.decode(released)
  end
  canned.define_singleton_method(:invoke) { |method, req, _deadline, _metadata| public_send(method, req) }
  client.instance_variable_set(:@unary, canned)
  client.instance_variable_set(:@connect, canned) if client.instance_variable_get(:@connect)
elsif what != 'client'
  abort "unknown #{what}"
end

pair = lambda do
  lock = client.acquire(name, ttl_ms: 10_000)
  raise 'not held' unless lock.release
end
200.times { pair.call }
GC.start
objects0 = GC.stat(:total_allocated_objects)
cpu0 = Process.times
t0 = Process.clock_gettime(Process::CLOCK_MONOTONIC)
n.times { pair.call }
secs = Process.clock_gettime(Process::CLOCK_MONOTONIC) - t0
cpu1 = Process.times
objects = GC.stat(:total_allocated_objects) - objects0
cpu = (cpu1.utime - cpu0.utime) + (cpu1.stime - cpu0.stime)
puts format('%s %s: %.0f µs per call, %.0f µs CPU per call, %d objects per call', what, transport,
            secs / n / 2 * 1e6, cpu / n / 2 * 1e6, objects / n / 2)
