# frozen_string_literal: true

# The keeper's releases alone, Batch against the HTTP/1.1 pipeline, taking
# turns: N grants (taken beforehand) are handed to a Keeper by 10 threads
# as jobs would hand them at their end (one every PAUSE_MS per thread),
# then flushed. Per release: wall time, this process's CPU, tumbler's and
# Redis's CPU (user + system, /proc), and the requests the keeper sent.
#
#   ruby clients/ruby-sidekiq/bench/keeper.rb [N=4000] [ROUNDS=3] [PAUSE_MS=2]
require 'etc'
require 'logger'
require 'net/http'
require 'tumbler'
require 'tumbler/sidekiq'
require_relative '../../ruby/test/support/servers'
require_relative 'measure'

N = Integer(ARGV[0] || 4000)
ROUNDS = Integer(ARGV[1] || 3)
PAUSE = Float(ARGV[2] || 2) / 1000

# The keeper's releases as they went before Batch (measure.rb).
class PipelineClient < SimpleDelegator
  include PipelineReleases
end

redis_pid, redis_port = TumblerTest.start_redis
http_port = TumblerTest.free_port
tumbler_pid, tumbler_port = TumblerTest.start_tumbler(redis_port, http_port: http_port)
load_before = File.read('/proc/loadavg').split[0, 3].join(' ')
rows = Hash.new { |h, k| h[k] = [] }
begin
  ROUNDS.times do |round|
    %w[batch pipeline].each do |way|
      client = Tumbler::Client.new("127.0.0.1:#{tumbler_port}", namespace: 'keeper-bench')
      locks = client.try_acquire_each(Array.new(N) { |i| "k#{round}-#{way}-#{i}" }, holder: "h-#{way}", ttl_ms: 600_000)
      raise 'not all acquired' unless locks.all?(Tumbler::Lock)

      keeper = Tumbler::Sidekiq::Keeper.new(way == 'batch' ? client : PipelineClient.new(client), Logger.new(nil))
      before = rpc_counts(http_port)
      t_cpu = cpu_s(tumbler_pid)
      r_cpu = cpu_s(redis_pid)
      c0 = Process.clock_gettime(Process::CLOCK_PROCESS_CPUTIME_ID)
      t0 = TumblerTest.mono
      locks.each_slice(N / 10).map do |mine|
        Thread.new do
          mine.each do |l|
            keeper.release_later(l.name, l.holder, l.fencing_token)
            sleep PAUSE
          end
        end
      end.each(&:join)
      keeper.flush(60)
      wall = TumblerTest.mono - t0
      cpu = Process.clock_gettime(Process::CLOCK_PROCESS_CPUTIME_ID) - c0
      t_cpu = cpu_s(tumbler_pid) - t_cpu
      r_cpu = cpu_s(redis_pid) - r_cpu
      sent = rpc_counts(http_port).to_h { |m, v| [m, v - before[m]] }.reject { |_, v| v.zero? }
      keeper.stop(5)
      left = locks.count { |l| !client.inspect_lock(l.name).holders.empty? } if round.zero?
      raise "#{way}: #{left} locks left" if left&.positive?

      r = { wall: wall / N * 1e6, cpu: cpu / N * 1e6, tumbler: t_cpu / N * 1e6, redis: r_cpu / N * 1e6,
            per_request: N.to_f / sent.values.sum }
      rows[way] << r
      warn format('round %d %-8s wall %6.1f µs/release  CPU µs/release: process %5.1f (sleeping threads included)  ' \
                  'tumbler %5.1f  Redis %5.1f   requests %s (%.1f releases each)',
                  round + 1, way, r[:wall], r[:cpu], r[:tumbler], r[:redis], sent.inspect, r[:per_request])
      client.close
    end
  end
ensure
  TumblerTest.stop(tumbler_pid)
  TumblerTest.stop(redis_pid)
end
median = ->(xs) { xs.sort[xs.size / 2] }
puts
puts "#{N} releases handed to a Keeper by 10 threads (one each #{PAUSE * 1000} ms per thread), median of #{ROUNDS} rounds; " \
     "load average #{load_before} before, #{File.read('/proc/loadavg').split[0, 3].join(' ')} after"
puts
puts '| keeper sends | releases per request (as tumbler counts requests: a pipelined Release is one) | CPU µs/release: process | tumbler | Redis | all three |'
puts '| --- | ---: | ---: | ---: | ---: | ---: |'
rows.each do |way, rs|
  m = %i[cpu tumbler redis per_request].to_h { |k| [k, median.(rs.map { |r| r[k] })] }
  puts format('| %s | %.1f | %.1f | %.1f | %.1f | %.1f |', way == 'batch' ? 'one Batch' : 'HTTP/1.1 pipeline',
              m[:per_request], m[:cpu], m[:tumbler], m[:redis], m[:cpu] + m[:tumbler] + m[:redis])
end
