# frozen_string_literal: true

# The Sidekiq app of the tests: `sidekiq -r ./test/app.rb` runs it as a real
# Sidekiq server; the tests require it too and push its jobs as a client.
# Every job reports to Redis (lists ev:<tag>) when it starts and ends,
# with the fencing token and slot it sees and how many jobs of its tag
# ran at that moment (counted inside the jobs).
require 'json'
require 'active_support'
require 'active_support/core_ext/numeric/time'
require 'tumbler/sidekiq'

Redis.silence_deprecations = true if Redis.respond_to?(:silence_deprecations=) # Sidekiq 6.4's sadd on redis-rb 4.8

REDIS_URL = ENV.fetch('REDIS_URL')
Sidekiq.configure_client { |c| c.redis = { url: REDIS_URL, size: 5 } }
Sidekiq.configure_server do |c|
  c.redis = { url: REDIS_URL }
  c.options[:poll_interval_average] = 0.4 # the schedule and retries, checked often (default: 5 s)
  c.on(:startup) { Sidekiq.redis { |r| r.rpush('test:ready', Process.pid) } }
end
Tumbler::Sidekiq.configure(
  address: ENV.fetch('TUMBLER_ADDR'),
  namespace: ENV.fetch('TUMBLER_NAMESPACE', 'sidekiq-test'),
  execution_ttl: Float(ENV.fetch('TEST_EXECUTION_TTL', '3')),
  heartbeat_ttl: Float(ENV.fetch('TEST_HEARTBEAT_TTL', '2')),
  recover_interval: 0.5,
  schedule_in: 1,
  reliable_fetch: ENV['TEST_BASIC_FETCH'] != '1'
)

# What every test job does: report its start (with its lock's holder and
# fencing token), hold (until a token arrives on gate:<tag>, or for a
# number of seconds), fail when asked, report its end (and whether it was
# told it lost its lock).
module Probe
  def probe(tag, hold, extra = {})
    Sidekiq.redis do |r|
      running = r.incr("running:#{tag}")
      r.rpush("ev:#{tag}", JSON.generate({ e: 'start', jid: jid, running: running, pid: Process.pid,
                                           token: tumbler_fencing_token&.to_s, slot: tumbler_lock&.slot,
                                           holder: tumbler_lock&.holder,
                                           t: Time.now.to_f }.merge(extra)))
    end
    begin
      case hold
      when 'gate' then Sidekiq.redis { |r| r.blpop("gate:#{tag}", timeout: 60) }
      when 'fail_once'
        first = Sidekiq.redis { |r| r.incr("failed:#{tag}") } == 1
        raise "failing once on purpose (#{tag})" if first
      when Numeric then sleep hold
      end
    ensure
      Sidekiq.redis do |r|
        r.decr("running:#{tag}")
        r.rpush("ev:#{tag}", JSON.generate(e: $! ? 'fail' : 'end', jid: jid, pid: Process.pid,
                                           lost: tumbler_lock&.lost?, t: Time.now.to_f))
      end
    end
  end
end

class UntilExecutingJob
  include Sidekiq::Worker
  include Probe
  sidekiq_options lock: :until_executing, retry: false
  def perform(tag, hold) = probe(tag, hold)
end

class UntilExecutedJob
  include Sidekiq::Worker
  include Probe
  sidekiq_options lock: :until_executed
  sidekiq_retry_in { 1 }
  def perform(tag, hold) = probe(tag, hold)
end

class UntilExpiredJob
  include Sidekiq::Worker
  include Probe
  sidekiq_options lock: :until_expired, lock_ttl: 5, retry: false
  def perform(tag, hold) = probe(tag, hold)
end

class UntilAndWhileExecutingJob
  include Sidekiq::Worker
  include Probe
  sidekiq_options lock: :until_and_while_executing, lock_timeout: 20, retry: false
  def perform(tag, hold) = probe(tag, hold)
end

class WhileExecutingJob
  include Sidekiq::Worker
  include Probe
  sidekiq_options lock: :while_executing, lock_timeout: 20, retry: false
  def perform(tag, hold) = probe(tag, hold)
end

# "Lock around an ID": at most 3 jobs per user at once, whatever the other
# arguments; the rest wait their turn in tumbler's queue.
class PerUserJob
  include Sidekiq::Worker
  include Probe
  sidekiq_options lock: :while_executing, lock_limit: 3, lock_timeout: 60, retry: false,
                  lock_args_method: ->(args) { [args[0]] }
  def perform(user_id, n, tag, hold) = probe(tag, hold, user: user_id, n: n)
end

# Sidekiq Enterprise's spelling.
class EnterpriseStartJob
  include Sidekiq::Worker
  include Probe
  sidekiq_options unique_for: 30, unique_until: :start, retry: false
  def perform(tag, hold) = probe(tag, hold)
end

class EnterpriseSuccessJob
  include Sidekiq::Worker
  include Probe
  sidekiq_options unique_for: 1.minute, unique_until: :success, retry: false
  def perform(tag, hold) = probe(tag, hold)
end

# No uniqueness at all (and the benchmark's baseline).
class PlainJob
  include Sidekiq::Worker
  sidekiq_options retry: false
  def perform(tag) = Sidekiq.redis { |r| r.incr("done:#{tag}") }
end

class BenchUniqueJob
  include Sidekiq::Worker
  sidekiq_options lock: :until_executed, retry: false
  def perform(tag, _n) = Sidekiq.redis { |r| r.incr("done:#{tag}") }
end
