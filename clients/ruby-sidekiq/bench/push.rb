# frozen_string_literal: true

# ruby push.rb TAG QUEUE N — pushes N BenchJobs (distinct arguments, so
# every one is unique) and prints the seconds it took.
require_relative 'app'
tag, queue, n = ARGV[0], ARGV[1], Integer(ARGV[2])
setter = BenchJob.set(queue: queue)
Sidekiq.redis(&:ping) # warm-up: connections, and the gRPC channel with the gem
Tumbler::Sidekiq.client.inspect_lock('warm-up') if defined?(Tumbler::Sidekiq)
OneCall.client.inspect_lock('warm-up') if defined?(OneCall)
started = Process.clock_gettime(Process::CLOCK_MONOTONIC)
pushed = n.times.count { |i| setter.perform_async(tag, i) }
elapsed = Process.clock_gettime(Process::CLOCK_MONOTONIC) - started
puts "#{pushed} #{elapsed}"
