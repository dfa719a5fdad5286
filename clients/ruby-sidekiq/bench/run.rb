# frozen_string_literal: true

# The tumbler-sidekiq benchmark: the same 2,000 no-op jobs through a real
# Sidekiq (concurrency 10) in four arms, in the same run, round after round:
#
#   sidekiq      Sidekiq alone (BasicFetch), no uniqueness
#   plain_redis  the same uniqueness (until executed) with a plain Redis lock
#                on Sidekiq's own Redis (SET NX PX at push, compare-and-delete
#                after the run): the floor of what sidekiq-unique-jobs does
#   until_exec   tumbler-sidekiq, lock: :until_executed (BasicFetch)
#   +reliable    tumbler-sidekiq, lock: :until_executed, with its ReliableFetch
#   one_call     the bound, not a lock: the push makes one synchronous
#                tumbler call (a try-once Acquire through the gem's client
#                and transport) and the run none, the least a gem with the
#                targets' one call at push can do (bench/app.rb)
#   until_pipe   (BENCH_KEEPER_AB=1 only) until_exec with the keeper's
#                releases sent as an HTTP/1.1 pipeline of Releases, as
#                before they went in one Batch request; it runs before
#                until_exec in every other round
#
# "end to end" is the push (one thread, as an app pushes) plus the run;
# ratios are against Sidekiq alone's, and the overheads against the
# plain Redis lock's.
#
# For each: pushing (perform_async, one process, one thread) and processing
# (first job's start to last job's end, stamped by the jobs), and the lock
# calls per job, counted by tumbler itself (tumbler_rpc_requests_total on
# its /metrics). Starts its own redis-server and `tumbler serve`.
#
#   ruby clients/ruby-sidekiq/bench/run.rb [JOBS=2000] [ROUNDS=2]
require 'etc'
require 'json'
require 'net/http'
require 'redis'
require 'tumbler'
require_relative '../../ruby/test/support/servers'
require_relative 'measure'

N = Integer(ARGV[0] || 2000)
ROUNDS = Integer(ARGV[1] || 2)
HERE = __dir__
ARMS = {
  'sidekiq' => {},
  'plain_redis' => { 'BENCH_PLAIN' => '1' },
  'until_exec' => { 'BENCH_GEM' => '1' },
  '+reliable' => { 'BENCH_GEM' => '1', 'BENCH_RELIABLE' => '1' },
  'one_call' => { 'BENCH_ONE_CALL' => '1' }
}.merge(ENV['BENCH_KEEPER_AB'] == '1' ? { 'until_pipe' => { 'BENCH_GEM' => '1', 'BENCH_PIPELINE' => '1' } } : {}).freeze

redis_pid, redis_port = TumblerTest.start_redis
http_port = TumblerTest.free_port
tumbler_pid, tumbler_port = TumblerTest.start_tumbler(redis_port, http_port: http_port)
env = { 'REDIS_URL' => "redis://127.0.0.1:#{redis_port}/1", 'TUMBLER_ADDR' => "127.0.0.1:#{tumbler_port}" }
redis = Redis.new(url: env['REDIS_URL'])
lister = Tumbler::Client.new("127.0.0.1:#{tumbler_port}", namespace: 'bench')
# Whether any lock is left in the bench's namespace (one listed at most).
any_lock_left = -> { !lister.call(:list) { Tumbler::V1::ListRequest.new(namespace: 'bench', page_size: 1) }.locks.empty? }

results = Hash.new { |h, k| h[k] = [] }
begin
  ROUNDS.times do |round|
    # With the keeper A/B, its two arms take turns at going first.
    order = ARMS.to_a
    if ARMS.key?('until_pipe') && round.odd?
      pipe = order.delete(order.assoc('until_pipe'))
      order.insert(order.index(order.assoc('until_exec')), pipe)
    end
    order.each do |arm, arm_env|
      tag = "#{arm.delete('+')}-#{round}"
      queue = "bench-#{tag}"
      before = rpc_counts(http_port)
      out = IO.popen(env.merge(arm_env), [RbConfig.ruby, File.join(HERE, 'push.rb'), tag, queue, N.to_s], &:read)
      pushed, push_s = out.split.then { |a, b| [Integer(a), Float(b)] }
      raise "#{arm}: pushed #{pushed} of #{N}" unless pushed == N

      tumbler_before = cpu_s(tumbler_pid)
      redis_before = cpu_s(redis_pid)

      pid, log = TumblerTest.spawn_logged("bench-sidekiq-#{tag}", env.merge(arm_env), RbConfig.ruby,
                                          Gem.bin_path('sidekiq', 'sidekiq'), '-r', File.join(HERE, 'app.rb'),
                                          '-q', queue, '-c', '10', '-t', '2')
      TumblerTest.wait_until("#{arm}: #{N} jobs done (log: #{log})", timeout: 300, every: 0.05) do
        redis.get("bench:done:#{tag}").to_i >= N
      end
      # The keeper sends a job's release after the job ends: the CPU is read
      # once every release is in, so each arm's CPU counts all its calls.
      TumblerTest.wait_until("#{arm}: every lock released", timeout: 60, every: 0.05) { !any_lock_left.call }
      sidekiq_cpu = cpu_s(pid)
      tumbler_cpu = cpu_s(tumbler_pid) - tumbler_before
      redis_cpu = cpu_s(redis_pid) - redis_before
      servers_cpu = tumbler_cpu + redis_cpu
      TumblerTest.stop(pid)
      t0 = redis.zscore("bench:t0:#{tag}", 'first')
      t1 = redis.zscore("bench:t1:#{tag}", 'last')
      after = rpc_counts(http_port)
      # (push.rb's warm-up makes one Inspect per arm, and the wait for the releases Lists: left out)
      calls = after.to_h { |m, v| [m, (v - before[m]) / N.to_f] }.reject { |m, v| v.zero? || %w[Inspect List].include?(m) }
      results[arm] << { push_us: push_s / N * 1e6, run_s: t1 - t0, jobs_per_s: N / (t1 - t0), calls: calls,
                        cpu_us: (sidekiq_cpu + servers_cpu) / N * 1e6, sidekiq_cpu_us: sidekiq_cpu / N * 1e6,
                        tumbler_cpu_us: tumbler_cpu / N * 1e6, redis_cpu_us: redis_cpu / N * 1e6 }
      r = results[arm].last
      warn format('round %d %-11s push %6.0f µs/job   run %5.2f s  %6.0f jobs/s   CPU %5.0f µs/job (%.0f / %.0f / %.0f)   lock calls/job %s',
                  round + 1, arm, r[:push_us], r[:run_s], r[:jobs_per_s], r[:cpu_us],
                  r[:sidekiq_cpu_us], r[:tumbler_cpu_us], r[:redis_cpu_us],
                  calls.map { |m, v| "#{m} #{v.round(2)}" }.join(', '))
    end
  end
  leftover = lister.call(:list) { Tumbler::V1::ListRequest.new(namespace: 'bench', page_size: 1000) }.locks.size
ensure
  TumblerTest.stop(tumbler_pid)
  TumblerTest.stop(redis_pid)
end

median = ->(xs) { xs.sort[xs.size / 2] }
base = median.(results['sidekiq'].map { |r| r[:run_s] }) / N
base_push = median.(results['sidekiq'].map { |r| r[:push_us] })
puts
sidekiq_version = Gem::Specification.find_by_name('sidekiq').version
puts "#{N} no-op jobs, Sidekiq #{sidekiq_version}, concurrency 10, median of #{ROUNDS} rounds; " \
     "tumbler #{TumblerTest.tumbler_bin}; load average at the end #{File.read('/proc/loadavg').split[0, 3].join(' ')}"
puts
per_job = lambda do |rs|
  run_s = median.(rs.map { |r| r[:run_s] })
  push = median.(rs.map { |r| r[:push_us] })
  { run_s: run_s, push: push, run_overhead: (run_s / N - base) * 1e6, push_overhead: push - base_push,
    e2e_s: run_s + (push * N / 1e6), cpu: median.(rs.map { |r| r[:cpu_us] }),
    split: %i[sidekiq_cpu_us tumbler_cpu_us redis_cpu_us].map { |k| median.(rs.map { |r| r[k] }).round }.join(' / ') }
end
sidekiq = per_job.(results['sidekiq'])
plain = results.key?('plain_redis') ? per_job.(results['plain_redis']) : nil
puts '| arm | push µs/job | jobs/s | run ÷ Sidekiq | end to end ÷ Sidekiq | overhead µs/job (push + run) | ÷ plain Redis lock | run CPU µs/job | Sidekiq / tumbler / Redis | lock calls/job |'
puts '| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- |'
results.each do |arm, rs|
  r = per_job.(rs)
  calls = rs.last[:calls].map { |m, v| "#{m} #{v.round(2)}" }.join(', ')
  overhead = r[:push_overhead] + r[:run_overhead]
  vs_plain = plain && arm != 'sidekiq' ? format('%.2f', overhead / (plain[:push_overhead] + plain[:run_overhead])) : '–'
  puts format('| %s | %.0f | %.0f | %.2f | %.2f | %+.0f (%+.0f + %+.0f) | %s | %.0f | %s | %s |', arm, r[:push], N / r[:run_s],
              sidekiq[:run_s] / r[:run_s], sidekiq[:e2e_s] / r[:e2e_s], overhead, r[:push_overhead],
              r[:run_overhead], vs_plain, r[:cpu], r[:split], calls.empty? ? '0' : calls)
end
puts
if results.key?('one_call')
  puts "one_call is the bound, not a lock: one synchronous tumbler call per push and none per run. No gem whose push " \
       "makes that call reaches a higher end to end on this machine than its #{format('%.2f', sidekiq[:e2e_s] / per_job.(results['one_call'])[:e2e_s])}."
end
puts 'run CPU: the Sidekiq process (its start included), tumbler and Redis together, from its start until every job ran and every lock was released (user + system, /proc); then each (medians).'
puts "locks left in tumbler's namespace after the run (every job released its lock): #{leftover}"
