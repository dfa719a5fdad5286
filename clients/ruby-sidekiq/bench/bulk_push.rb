# frozen_string_literal: true

# ruby bulk_push.rb MODE TAG QUEUE N — pushes N BenchJobs (distinct
# arguments: every one unique) and prints "pushed seconds cpu_seconds"
# (wall time and this process's CPU, user + system, of the pushes alone).
# MODE: bulk (one Sidekiq::Client.push_bulk) or single (N perform_async).
# With BENCH_GEM=1 the gem's middleware is installed (bench/app.rb).
require_relative 'app'
mode, tag, queue, n = ARGV[0], ARGV[1], ARGV[2], Integer(ARGV[3])
Sidekiq.redis(&:ping) # warm-up: connections, and the tumbler connection with the gem
Tumbler::Sidekiq.client.inspect_lock('warm-up') if defined?(Tumbler::Sidekiq)
args = Array.new(n) { |i| [tag, i] }
cpu = -> { Process.clock_gettime(Process::CLOCK_PROCESS_CPUTIME_ID) }
mono = -> { Process.clock_gettime(Process::CLOCK_MONOTONIC) }
c0 = cpu.call
t0 = mono.call
pushed = case mode
         when 'bulk' then Sidekiq::Client.push_bulk('class' => BenchJob, 'queue' => queue, 'args' => args).size
         when 'single'
           setter = BenchJob.set(queue: queue)
           args.count { |a| setter.perform_async(*a) }
         else raise ArgumentError, "mode #{mode}: bulk or single"
         end
puts "#{pushed} #{mono.call - t0} #{cpu.call - c0}"
