# frozen_string_literal: true

# Tumbler::QueuedLocks — the API of the redis_queued_locks gem (lock, lock!,
# lock_info, queue_info, locked?, queued?, unlock, extend_lock_ttl, locks,
# queues, keys, locks_info, queues_info, clear_locks, clear_dead_requests),
# with its option names and result shapes, on tumbler: every lock request
# waits in tumbler's per-lock FIFO queue, inside the server (no polling,
# no retry loop), and a waiter whose server is gone is dropped after its
# queue_ttl. Instrumentation events keep the gem's names and go through
# ActiveSupport::Notifications when it is loaded.
#
#   require 'tumbler/queued_locks'
#   rql = Tumbler::QueuedLocks.new('127.0.0.1:50051', namespace: 'billing') do |config|
#     config.default_lock_ttl = 10_000
#   end
#   rql.lock('invoice-42') { charge! }
require 'set'
require 'timeout'
require 'securerandom'
require 'tumbler/client'

module Tumbler
  class QueuedLocks
    class Error < Tumbler::Error; end
    # lock!(fail_fast: true) found the lock taken.
    class LockAlreadyObtainedError < Error; end
    # lock! waited for `timeout` seconds.
    class LockAcquiermentTimeoutError < Error; end
    # lock! waited for what retry_count × (retry_delay + retry_jitter) allows.
    class LockAcquiermentRetryLimitError < Error; end
    # lock(timed: true) { ... }: the block ran longer than the lock's ttl.
    class TimedLockTimeoutError < Error; end

    RESERVED_META = %w[lock_key acq_id ts ini_ttl rem_ttl].freeze

    # Instrumenters: #notify(event, payload).
    module Instrument
      module VoidNotifier
        def self.notify(_event, _payload = {}) = nil
      end

      module ActiveSupport
        def self.notify(event, payload = {}) = ::ActiveSupport::Notifications.instrument(event, payload)
      end

      # ActiveSupport::Notifications when it is loaded (looked up at each
      # event, so loading it later is enough), else nothing.
      module Auto
        def self.notify(event, payload = {})
          return unless defined?(::ActiveSupport::Notifications)

          ::ActiveSupport::Notifications.instrument(event, payload)
        end
      end
    end

    # redis_queued_locks' configuration, same names and units.
    class Config
      attr_accessor :retry_count, :retry_delay, :retry_jitter, :try_to_lock_timeout, :default_lock_ttl,
                    :default_queue_ttl, :is_timed_by_default, :lock_release_batch_size,
                    :key_extraction_batch_size, :dead_request_ttl, :instrumenter, :uniq_identifier,
                    :logger, :log_lock_try, :kind, :max_wait

      def initialize
        @retry_count = 3            # tries; with retry_delay/jitter, bounds the wait (nil: timeout alone)
        @retry_delay = 200          # ms
        @retry_jitter = 25          # ms
        @try_to_lock_timeout = 10   # s (nil: as long as the server allows)
        @default_lock_ttl = 5_000   # ms
        @default_queue_ttl = 15     # s
        @is_timed_by_default = false
        @lock_release_batch_size = 100
        @key_extraction_batch_size = 500
        @dead_request_ttl = 86_400_000 # ms (tumbler finds dead requests by liveness; kept for compatibility)
        @instrumenter = Instrument::Auto
        @uniq_identifier = -> { SecureRandom.hex(8) }
        @logger = nil
        @log_lock_try = false
        @kind = 'queued_locks'      # tumbler's metrics label for these locks
        @max_wait = 3_600           # s: the server's --max-wait-ms
      end

      def [](key) = public_send(key)
    end

    attr_reader :client, :config, :uniq_identity

    # target: "host:port" (or a Tumbler::Client); namespace and the other
    # keywords go to Tumbler::Client.new. The block configures.
    def initialize(target = '127.0.0.1:50051', namespace: '', **client_options)
      @client = target.is_a?(Client) ? target : Client.new(target, namespace: namespace, **client_options)
      @config = Config.new
      yield @config if block_given?
      @uniq_identity = @config.uniq_identifier.call
    end

    # Obtain a lock. With a block: run it holding the lock (kept alive by
    # the watchdog for the block's whole run, or, with timed: true, for at
    # most ttl: the block is cut with TimedLockTimeoutError), release it,
    # return the block's value. Without: return { ok: true, result: {...} }
    # and the lock lives for ttl. Not obtained: { ok: false, result: :timeout_reached |
    # :retry_count_reached | :fail_fast_no_try } (lock! raises instead).
    def lock(lock_name, ttl: config.default_lock_ttl, queue_ttl: config.default_queue_ttl,
             timeout: config.try_to_lock_timeout, timed: config.is_timed_by_default,
             retry_count: config.retry_count, retry_delay: config.retry_delay, retry_jitter: config.retry_jitter,
             raise_errors: false, fail_fast: false, identity: uniq_identity, meta: nil, metadata: nil,
             instrument: nil, instrumenter: config.instrumenter, logger: config.logger,
             log_lock_try: config.log_lock_try, limit: nil, priority: 0, kind: config.kind, &block)
      acq_id = acquirer_id(identity)
      wait_s, bound = wait_budget(timeout, retry_count, retry_delay, retry_jitter, fail_fast)
      log(logger, 'start_lock_obtaining', lock_name, queue_ttl, acq_id)
      log(logger, 'try_lock.start', lock_name, queue_ttl, acq_id) if log_lock_try
      started = mono
      held = begin
        client.acquire(lock_name, holder: acq_id, wait_ms: (wait_s * 1000).round, ttl_ms: ttl,
                                  queue_ttl_ms: [(queue_ttl * 1000).round, 100].max, metadata: meta_strings(meta, metadata),
                                  kind: kind, limit: limit, priority: priority)
      rescue NotAcquired
        result = fail_fast ? :fail_fast_no_try : bound
        log(logger, 'fail_fast_or_limits_reached__dequeue', lock_name, queue_ttl, acq_id)
        raise failure(result, lock_name) if raise_errors

        return { ok: false, result: result }
      end
      acq_time = (mono - started) * 1000
      ts = held.grant.acquired_at_ms / 1000.0
      log(logger, 'lock_obtained', lock_name, queue_ttl, acq_id, acq_time: acq_time)
      instrumenter.notify('redis_queued_locks.lock_obtained',
                          { ttl: ttl, acq_id: acq_id, lock_key: lock_name, ts: ts, acq_time: acq_time, instrument: instrument })
      info = { lock_key: lock_name, acq_id: acq_id, ts: ts, ttl: ttl, fencing_token: held.fencing_token, slot: held.slot }
      return { ok: true, result: info } unless block

      hold_started = mono
      begin
        timed ? run_timed(held, ttl, &block) : client.hold(held) { block.call }
      ensure
        held.release unless held.lost?
        instrumenter.notify('redis_queued_locks.lock_hold_and_release',
                            { hold_time: (mono - hold_started) * 1000, ttl: ttl, acq_id: acq_id, lock_key: lock_name,
                              ts: ts, acq_time: acq_time, instrument: instrument })
      end
    end

    # lock with raise_errors: LockAlreadyObtainedError (fail_fast),
    # LockAcquiermentTimeoutError, LockAcquiermentRetryLimitError.
    def lock!(lock_name, **options, &block) = lock(lock_name, **options, raise_errors: true, &block)

    # The lock's holder (the first, for a semaphore: all of them under
    # "holders"), or nil when nobody holds it.
    def lock_info(lock_name)
      info = client.inspect_lock(lock_name)
      return nil if info.holders.empty?

      first = info.holders.first
      data = { 'lock_key' => lock_name, 'acq_id' => first.grant.holder, 'ts' => first.grant.acquired_at_ms / 1000.0,
               'ini_ttl' => first.grant.ttl_ms, 'rem_ttl' => first.remaining_ms,
               'fencing_token' => first.grant.fencing_token, 'slot' => first.grant.slot, 'limit' => info.limit }
      if info.holders.size > 1
        data['holders'] = info.holders.map do |h|
          { 'acq_id' => h.grant.holder, 'ts' => h.grant.acquired_at_ms / 1000.0, 'rem_ttl' => h.remaining_ms,
            'fencing_token' => h.grant.fencing_token, 'slot' => h.grant.slot }
        end
      end
      data.merge(first.grant.metadata.to_h)
    end

    # The lock's live waiting requests in grant order, or nil when none wait.
    def queue_info(lock_name)
      q = client.queue(lock_name, max_entries: 1000)
      return nil if q.waiters.zero?

      { 'lock_queue' => lock_name,
        'queue' => q.requests.map do |r|
          { 'acq_id' => r.holder, 'score' => r.enqueued_at_ms / 1000.0, 'position' => r.position,
            'priority' => r.priority }
        end }
    end

    def locked?(lock_name) = !client.inspect_lock(lock_name).holders.empty?
    def queued?(lock_name) = client.inspect_lock(lock_name).waiters.positive?

    # Release the lock whoever holds it (each holder, pinned to its fencing
    # token). Live waiters are not dropped: they are served in order.
    def unlock(lock_name, logger: config.logger, instrumenter: config.instrumenter, instrument: nil)
      started = mono
      info = client.inspect_lock(lock_name)
      released = info.holders.count do |h|
        client.release(lock_name, holder: h.grant.holder, fencing_token: h.grant.fencing_token)
      end
      rel_time = mono - started
      logger&.debug { "[redis_queued_locks.explicit_lock_release] lock_key=#{lock_name} released=#{released}" }
      instrumenter.notify('redis_queued_locks.explicit_lock_release',
                          { at: Time.now.to_f, rel_time: rel_time * 1000, lock_key: lock_name, lock_key_queue: lock_name,
                            instrument: instrument })
      { ok: true, result: { rel_time: rel_time, rel_key: lock_name, rel_queue: lock_name,
                            queue_res: info.waiters.zero? ? :nothing_to_release : :kept,
                            lock_res: released.positive? ? :released : :nothing_to_release } }
    end

    # Add milliseconds to the lock's remaining lease: atomic per holder and
    # pinned to its fencing token, so a lock that changed hands meanwhile is
    # never extended for its new holder.
    def extend_lock_ttl(lock_name, milliseconds, logger: config.logger)
      extended = client.inspect_lock(lock_name).holders.count do |h|
        client.extend_grant(lock_name, holder: h.grant.holder, ttl_ms: h.remaining_ms + milliseconds,
                                       fencing_token: h.grant.fencing_token)
      end
      logger&.debug { "[redis_queued_locks.extend_lock_ttl] lock_key=#{lock_name} extended=#{extended}" }
      extended.positive? ? { ok: true, result: :ttl_extended } : { ok: false, result: :async_expire_or_no_lock }
    end

    def locks(scan_size: config.key_extraction_batch_size, with_info: false)
      names = list(scan_size) { |l| l.holders.positive? }
      with_info ? locks_info_for(names) : names
    end

    def queues(scan_size: config.key_extraction_batch_size, with_info: false)
      names = list(scan_size, only_waiting: true) { |l| l.waiters.positive? }
      with_info ? queues_info_for(names) : names
    end

    def keys(scan_size: config.key_extraction_batch_size) = list(scan_size) { true }

    def locks_info(scan_size: config.key_extraction_batch_size) = locks_info_for(locks(scan_size: scan_size))
    def queues_info(scan_size: config.key_extraction_batch_size) = queues_info_for(queues(scan_size: scan_size))

    # Every lock and queue of this namespace (tumbler's Clear: an admin
    # token, or a server run with --no-auth).
    def clear_locks(batch_size: config.lock_release_batch_size, logger: config.logger,
                    instrumenter: config.instrumenter, instrument: nil)
      started = mono
      resp = client.call(:clear) { V1::ClearRequest.new(namespace: client.namespace) }
      rel_time = mono - started
      logger&.debug { "[redis_queued_locks.explicit_all_locks_release] locks=#{resp.locks_cleared} batch=#{batch_size}" }
      instrumenter.notify('redis_queued_locks.explicit_all_locks_release',
                          { rel_time: rel_time * 1000, at: Time.now.to_f, rel_keys: resp.locks_cleared, instrument: instrument })
      { ok: true, result: { rel_time: rel_time, rel_key_cnt: resp.locks_cleared,
                            grants_released: resp.grants_released, requests_dropped: resp.requests_dropped } }
    end

    # Drop the waiting requests whose server stopped refreshing them (and
    # leases already past). tumbler knows a dead request by its liveness,
    # so dead_ttl is accepted but not needed; the answer counts what was
    # dropped (tumbler's Reap does not name the queues).
    def clear_dead_requests(dead_ttl: config.dead_request_ttl, logger: config.logger,
                            instrumenter: config.instrumenter, instrument: nil)
      resp = client.call(:reap) { V1::ReapRequest.new(namespace: client.namespace) }
      logger&.debug { "[redis_queued_locks.clear_dead_requests] dead=#{resp.dead_waiters} dead_ttl=#{dead_ttl}" }
      instrumenter.notify('redis_queued_locks.clear_dead_requests',
                          { at: Time.now.to_f, dead_requests: resp.dead_waiters, instrument: instrument })
      { ok: true, result: { dead_requests: resp.dead_waiters, expired_locks: resp.expired_holders,
                            locks_visited: resp.locks_visited } }
    end

    private

    def mono = Process.clock_gettime(Process::CLOCK_MONOTONIC)

    # The gem's acquirer id: process/thread/fiber/ractor/identity.
    def acquirer_id(identity)
      "rql:acq:#{Process.pid}/#{Thread.current.object_id}/#{Fiber.current.object_id}/" \
        "#{Ractor.current.object_id}/#{identity}"
    end

    # How long to wait in the server, and which limit that is. The gem
    # tried retry_count times, retry_delay (+ jitter) apart, within
    # timeout; tumbler waits once for the same time, and is woken when the
    # lock is its turn instead of polling.
    def wait_budget(timeout, retry_count, retry_delay, retry_jitter, fail_fast)
      return [0, :fail_fast_no_try] if fail_fast

      by_timeout = timeout.nil? ? config.max_wait : timeout.to_f
      return [by_timeout, :timeout_reached] if retry_count.nil?

      by_retries = retry_count * (retry_delay.to_f + retry_jitter.to_f) / 1000.0
      by_retries < by_timeout ? [by_retries, :retry_count_reached] : [by_timeout, :timeout_reached]
    end

    def failure(result, lock_name)
      case result
      when :fail_fast_no_try then LockAlreadyObtainedError.new("#{lock_name}: already obtained (fail_fast)")
      when :retry_count_reached then LockAcquiermentRetryLimitError.new("#{lock_name}: retry_count reached")
      else LockAcquiermentTimeoutError.new("#{lock_name}: timeout reached")
      end
    end

    def meta_strings(meta, metadata)
      all = (meta || {}).merge(metadata || {}).to_h { |k, v| [k.to_s, v.to_s] }
      bad = all.keys & RESERVED_META
      raise ArgumentError, "meta: #{bad.join(', ')} are reserved lock data keys" unless bad.empty?

      all
    end

    def run_timed(held, ttl)
      Timeout.timeout(ttl / 1000.0, TimedLockTimeoutError, "#{held.name}: the block ran past the lock's ttl (#{ttl} ms)") do
        yield
      end
    end

    def log(logger, event, lock_name, queue_ttl, acq_id, **extra)
      return unless logger

      logger.debug do
        extras = extra.map { |k, v| " #{k}=#{v}" }.join
        "[redis_queued_locks.#{event}] lock_key=#{lock_name} queue_ttl=#{queue_ttl} acq_id=#{acq_id}#{extras}"
      end
    end

    def list(scan_size, only_waiting: false)
      names = Set.new
      token = ''
      loop do
        resp = client.call(:list) do
          V1::ListRequest.new(namespace: client.namespace, page_size: scan_size.clamp(1, 1000), page_token: token,
                              only_waiting: only_waiting)
        end
        resp.locks.each { |l| names << l.name if yield(l) }
        token = resp.next_page_token
        break if token.empty?
      end
      names
    end

    def locks_info_for(names)
      names.to_set do |name|
        info = lock_info(name)
        { lock: name, status: info ? :alive : :released, info: info || {} }
      end
    end

    def queues_info_for(names)
      names.to_set { |name| { queue: name, requests: queue_info(name)&.fetch('queue') || [] } }
    end
  end
end
