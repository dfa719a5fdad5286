# frozen_string_literal: true

# The push_bulk benchmark: N unique no-op jobs (default 1,000) pushed by one
# process, one thread, in four arms, round after round, each arm in a fresh
# process (bench/bulk_push.rb):
#
#   sidekiq_bulk   Sidekiq's own push_bulk, no uniqueness
#   gem_bulk       push_bulk through tumbler-sidekiq (until_executed): every
#                  push-time lock in one Batch request
#   gem_single     N perform_async through tumbler-sidekiq: one Acquire each
#   sidekiq_single N perform_async, Sidekiq alone
#
# For each: µs per job (wall), the pushing process's CPU per job, tumbler's
# and Redis's CPU per job (user + system, /proc) and the lock calls per job
# as tumbler counts them (/metrics). Then the keeper's way of giving locks
# back, measured alone: R locks (default 1,024) released in groups of G
# (default 64) by Client#release_many (one Batch request per group) and by
# the HTTP/1.1 pipeline it used before (ConnectStub#pipeline: G Release
# requests in one write on one connection), taking turns: µs and CPU per
# release of this process, tumbler and Redis.
#
#   ruby clients/ruby-sidekiq/bench/bulk.rb [N=1000] [ROUNDS=3] [R=1024] [G=64]
require 'etc'
require 'net/http'
require 'redis'
require 'tumbler'
require_relative '../../ruby/test/support/servers'
require_relative 'measure'

N = Integer(ARGV[0] || 1000)
ROUNDS = Integer(ARGV[1] || 3)
R = Integer(ARGV[2] || 1024)
G = Integer(ARGV[3] || 64)
HERE = __dir__
ARMS = {
  'sidekiq_bulk' => ['bulk', {}],
  'gem_bulk' => ['bulk', { 'BENCH_GEM' => '1' }],
  'gem_single' => ['single', { 'BENCH_GEM' => '1' }],
  'sidekiq_single' => ['single', {}]
}.freeze

def loadavg = File.read('/proc/loadavg').split[0, 3].join(' ')
def median(xs) = xs.sort[xs.size / 2]

redis_pid, redis_port = TumblerTest.start_redis
http_port = TumblerTest.free_port
tumbler_pid, tumbler_port = TumblerTest.start_tumbler(redis_port, http_port: http_port)
env = { 'REDIS_URL' => "redis://127.0.0.1:#{redis_port}/1", 'TUMBLER_ADDR' => "127.0.0.1:#{tumbler_port}" }
redis = Redis.new(url: env['REDIS_URL'])
load_before = loadavg
push = Hash.new { |h, k| h[k] = [] }
releases = Hash.new { |h, k| h[k] = [] }
begin
  ROUNDS.times do |round|
    ARMS.each do |arm, (mode, arm_env)|
      tag = "#{arm}-#{round}"
      queue = "bulk-#{tag}"
      before = rpc_counts(http_port)
      t_cpu = cpu_s(tumbler_pid)
      r_cpu = cpu_s(redis_pid)
      out = IO.popen(env.merge(arm_env), [RbConfig.ruby, File.join(HERE, 'bulk_push.rb'), mode, tag, queue, N.to_s], &:read)
      pushed, wall, cpu = out.split.then { |a, b, c| [Integer(a), Float(b), Float(c)] }
      raise "#{arm}: pushed #{pushed} of #{N}" unless pushed == N

      t_cpu = cpu_s(tumbler_pid) - t_cpu
      r_cpu = cpu_s(redis_pid) - r_cpu
      calls = rpc_counts(http_port).to_h { |m, v| [m, (v - before[m]) / N.to_f] }
                                   .reject { |m, v| v.zero? || m == 'Inspect' } # (the warm-up's)
      redis.del("queue:#{queue}")
      r = { us: wall / N * 1e6, cpu: cpu / N * 1e6, tumbler: t_cpu / N * 1e6, redis: r_cpu / N * 1e6, calls: calls }
      push[arm] << r
      warn format('round %d %-14s %7.1f µs/job  CPU µs/job: pusher %6.1f  tumbler %6.1f  Redis %5.1f  lock calls/job %s',
                  round + 1, arm, r[:us], r[:cpu], r[:tumbler], r[:redis],
                  calls.map { |m, v| "#{m} #{v.round(3)}" }.join(', '))
    end

    client = Tumbler::Client.new("127.0.0.1:#{tumbler_port}", namespace: 'bulk-releases')
    %w[batch pipeline].each do |way|
      names = Array.new(R) { |i| "r#{round}-#{way}-#{i}" }
      locks = client.try_acquire_each(names, holder: "h-#{way}", ttl_ms: 600_000)
      raise "#{way}: not all acquired" unless locks.all?(Tumbler::Lock)

      groups = locks.map { |l| [l.name, l.holder, l.fencing_token] }.each_slice(G).to_a
      requests = groups.map do |g|
        g.map { |n, h, t| Tumbler::V1::ReleaseRequest.new(namespace: client.namespace, name: n, holder: h, fencing_token: t) }
      end
      t_cpu = cpu_s(tumbler_pid)
      r_cpu = cpu_s(redis_pid)
      c0 = Process.clock_gettime(Process::CLOCK_PROCESS_CPUTIME_ID)
      t0 = TumblerTest.mono
      ok = if way == 'batch'
             groups.sum { |g| client.release_many(g).count(true) }
           else
             requests.sum do |reqs|
               client.unary.pipeline(:release, reqs, Tumbler::Client.now + 10, client.metadata)
                     .count { |resp| !resp.is_a?(GRPC::BadStatus) && resp.status == :RELEASE_STATUS_RELEASED }
             end
           end
      wall = TumblerTest.mono - t0
      cpu = Process.clock_gettime(Process::CLOCK_PROCESS_CPUTIME_ID) - c0
      raise "#{way}: released #{ok} of #{R}" unless ok == R

      r = { us: wall / R * 1e6, cpu: cpu / R * 1e6, tumbler: (cpu_s(tumbler_pid) - t_cpu) / R * 1e6,
            redis: (cpu_s(redis_pid) - r_cpu) / R * 1e6 }
      releases[way] << r
      warn format('round %d release_%-8s %6.1f µs/release  CPU µs/release: client %5.1f  tumbler %5.1f  Redis %5.1f',
                  round + 1, way, r[:us], r[:cpu], r[:tumbler], r[:redis])
    end
    client.close
  end
ensure
  TumblerTest.stop(tumbler_pid)
  TumblerTest.stop(redis_pid)
end

puts
puts "#{N} unique no-op jobs pushed by one thread, Sidekiq #{Gem::Specification.find_by_name('sidekiq').version}, " \
     "median of #{ROUNDS} rounds; tumbler #{TumblerTest.tumbler_bin}; load average #{load_before} before, #{loadavg} after"
puts
puts '| arm | µs/job (wall) | CPU µs/job: pusher | tumbler | Redis | all three | lock calls/job |'
puts '| --- | ---: | ---: | ---: | ---: | ---: | --- |'
push.each do |arm, rs|
  m = %i[us cpu tumbler redis].to_h { |k| [k, median(rs.map { |r| r[k] })] }
  calls = rs.last[:calls].map { |k, v| "#{k} #{v.round(3)}" }.join(', ')
  puts format('| %s | %.1f | %.1f | %.1f | %.1f | %.1f | %s |', arm, m[:us], m[:cpu], m[:tumbler], m[:redis],
              m[:cpu] + m[:tumbler] + m[:redis], calls.empty? ? '0' : calls)
end
puts
puts "#{R} releases in groups of #{G}, median of #{ROUNDS} rounds:"
puts
puts '| way | µs/release (wall) | CPU µs/release: client | tumbler | Redis | all three |'
puts '| --- | ---: | ---: | ---: | ---: | ---: |'
releases.each do |way, rs|
  m = %i[us cpu tumbler redis].to_h { |k| [k, median(rs.map { |r| r[k] })] }
  label = way == 'batch' ? "release_many: one Batch per #{G}" : "HTTP/1.1 pipeline: #{G} Releases per write"
  puts format('| %s | %.1f | %.1f | %.1f | %.1f | %.1f |', label, m[:us], m[:cpu], m[:tumbler], m[:redis],
              m[:cpu] + m[:tumbler] + m[:redis])
end
