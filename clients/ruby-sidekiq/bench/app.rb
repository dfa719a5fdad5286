# frozen_string_literal: true

# The benchmark's Sidekiq app. BENCH_GEM=1 loads tumbler-sidekiq (its
# middleware takes an until_executed lock per job); without it, Sidekiq
# alone runs the very same job class (Sidekiq ignores the lock: option).
# BENCH_RELIABLE=1 also installs the gem's ReliableFetch.
require 'sidekiq'
Redis.silence_deprecations = true if Redis.respond_to?(:silence_deprecations=)

REDIS_URL = ENV.fetch('REDIS_URL')
Sidekiq.configure_client { |c| c.redis = { url: REDIS_URL, size: 5 } }
Sidekiq.configure_server { |c| c.redis = { url: REDIS_URL } }
Sidekiq.logger.level = Logger::WARN

if ENV['BENCH_GEM'] == '1'
  require 'tumbler/sidekiq'
  Tumbler::Sidekiq.configure(address: ENV.fetch('TUMBLER_ADDR'), namespace: 'bench',
                             reliable_fetch: ENV['BENCH_RELIABLE'] == '1')
end

# A no-op job: it only notes when it ran (first start, last end, count),
# one pipelined round trip to Sidekiq's Redis, the same in every arm.
class BenchJob
  include Sidekiq::Worker
  sidekiq_options lock: :until_executed, retry: false

  def perform(tag, _n)
    now = Time.now.to_f
    Sidekiq.redis do |r|
      r.pipelined do |p|
        p.zadd("bench:t0:#{tag}", now, 'first', lt: true)
        p.zadd("bench:t1:#{tag}", now, 'last', gt: true)
        p.incr("bench:done:#{tag}")
      end
    end
  end
end
