# frozen_string_literal: true

# The benchmark's Sidekiq app. BENCH_GEM=1 loads tumbler-sidekiq (its
# middleware takes an until_executed lock per job); without it, Sidekiq
# alone runs the very same job class (Sidekiq ignores the lock: option).
# BENCH_RELIABLE=1 also installs the gem's ReliableFetch.
# BENCH_PIPELINE=1 sends the keeper's releases by the HTTP/1.1 pipeline (below).
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
  # BENCH_PIPELINE=1: the keeper's releases as they went before Batch, for
  # comparison: an HTTP/1.1 pipeline of Release requests on one connection.
  if ENV['BENCH_PIPELINE'] == '1'
    require_relative 'measure'
    Tumbler::Client.prepend(PipelineReleases)
  end
end

# BENCH_PLAIN=1: the same uniqueness (until_executed) with a plain Redis
# lock on Sidekiq's own Redis, the least sidekiq-unique-jobs does: SET NX
# PX when the job is pushed, compare-and-delete when it has run.
if ENV['BENCH_PLAIN'] == '1'
  require 'digest'
  module PlainUnique
    UNLOCK = "if redis.call('get', KEYS[1]) == ARGV[1] then return redis.call('del', KEYS[1]) end return 0"
    UNLOCK_SHA = Digest::SHA1.hexdigest(UNLOCK)

    def self.key(item) = "plainlock:#{item['class']}:#{Digest::SHA1.hexdigest(Sidekiq.dump_json(item['args']))}"

    class Client
      def call(_worker, item, _queue, _pool = nil)
        locked = Sidekiq.redis { |r| r.set(PlainUnique.key(item), item['jid'], nx: true, px: 86_400_000) }
        yield if locked
      end
    end

    class Server
      def call(_worker, item, _queue)
        yield
        Sidekiq.redis do |r|
          r.evalsha(UNLOCK_SHA, [PlainUnique.key(item)], [item['jid']])
        rescue Redis::CommandError
          r.eval(UNLOCK, [PlainUnique.key(item)], [item['jid']])
        end
      end
    end
  end
  Sidekiq.configure_client { |c| c.client_middleware { |m| m.add(PlainUnique::Client) } }
  Sidekiq.configure_server do |c|
    c.client_middleware { |m| m.add(PlainUnique::Client) }
    c.server_middleware { |m| m.add(PlainUnique::Server) }
  end
end

# BENCH_ONE_CALL=1: the bound of the targets' design, not a lock. The push
# makes the one synchronous tumbler call the gem's design asks for (a
# try-once Acquire, through the same Tumbler::Client and transport the gem
# uses, on a name of its own with a 2 s lease) and the run makes none. No
# gem can push for less with that call, nor run for less: its end to end
# is the most any such gem can reach on this machine.
if ENV['BENCH_ONE_CALL'] == '1'
  require 'tumbler'
  module OneCall
    def self.client = (@client ||= Tumbler::Client.new(ENV.fetch('TUMBLER_ADDR'), namespace: 'bench'))

    class Client
      def call(_worker, item, _queue, _pool = nil)
        yield if OneCall.client.acquire("one:#{item['jid']}", holder: item['jid'], ttl_ms: 2_000)
      end
    end
  end
  Sidekiq.configure_client { |c| c.client_middleware { |m| m.add(OneCall::Client) } }
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
