# frozen_string_literal: true

# Tumbler::QueuedLocks (the redis_queued_locks-style API) against a real
# tumbler: two `tumbler serve` replicas over one redis-server, so that a
# waiter whose replica dies can be watched leaving the queue after its
# queue_ttl. Each test has its own namespace.
require 'minitest/autorun'
require 'securerandom'
require 'active_support'
require 'active_support/notifications'
require 'tumbler'
require_relative 'support/servers'

module QueuedLocksServers
  class << self
    attr_reader :addr, :redis_port

    def start
      @addr, @redis_port = TumblerTest.start_servers
    end
  end
end
QueuedLocksServers.start

class QueuedLocksTest < Minitest::Test
  def setup
    @ns = "rql-#{SecureRandom.hex(4)}"
    @rql = rql
  end

  def rql(addr = QueuedLocksServers.addr, &configure)
    Tumbler::QueuedLocks.new(addr, namespace: @ns, &configure)
  end

  def mono = TumblerTest.mono
  def wait_until(what, timeout: 10, &cond) = TumblerTest.wait_until(what, timeout: timeout, &cond)

  def test_lock_with_a_block_runs_it_held_and_releases
    value = @rql.lock('report', ttl: 2_000) do
      assert @rql.locked?('report')
      info = @rql.lock_info('report')
      assert_equal %w[acq_id fencing_token ini_ttl limit lock_key rem_ttl slot ts].sort, info.keys.sort
      assert_match(%r{\Arql:acq:\d+/\d+/\d+/\d+/\h{16}\z}, info['acq_id'])
      assert_equal 2_000, info['ini_ttl']
      42
    end
    assert_equal 42, value
    refute @rql.locked?('report')
    assert_nil @rql.lock_info('report')
  end

  def test_lock_without_a_block_lives_for_its_ttl_with_its_meta
    res = @rql.lock('nightly', ttl: 1_000, meta: { 'owner' => 'cron', key: 123.456 })
    assert res[:ok]
    assert_equal %i[acq_id fencing_token lock_key slot ts ttl], res[:result].keys.sort
    info = @rql.lock_info('nightly')
    assert_equal ['cron', '123.456'], info.values_at('owner', 'key'), 'meta comes back as strings'
    assert_operator info['rem_ttl'], :<=, 1_000
    assert_raises(ArgumentError) { @rql.lock('other', meta: { 'acq_id' => 'x' }) }
    wait_until('the ttl to pass', timeout: 3) { !@rql.locked?('nightly') }
  end

  def test_fail_fast
    @rql.lock('busy', ttl: 10_000)
    other = rql
    started = mono
    assert_equal({ ok: false, result: :fail_fast_no_try }, other.lock('busy', fail_fast: true))
    assert_operator mono - started, :<, 1.5, 'answered at once (no wait)'
    assert_raises(Tumbler::QueuedLocks::LockAlreadyObtainedError) { other.lock!('busy', fail_fast: true) }
  end

  def test_timeout_and_retry_count_bound_the_wait_in_the_server
    @rql.lock('held', ttl: 10_000)
    other = rql
    started = mono
    assert_equal({ ok: false, result: :timeout_reached }, other.lock('held', timeout: 0.4, retry_count: nil))
    assert_includes 0.35..2.0, mono - started
    # retry_count × (retry_delay + retry_jitter): 2 × 150 ms, waited once in the server.
    started = mono
    assert_equal({ ok: false, result: :retry_count_reached },
                 other.lock('held', retry_count: 2, retry_delay: 100, retry_jitter: 50))
    assert_includes 0.25..2.0, mono - started
    assert_raises(Tumbler::QueuedLocks::LockAcquiermentTimeoutError) do
      other.lock!('held', timeout: 0.2, retry_count: nil)
    end
    assert_raises(Tumbler::QueuedLocks::LockAcquiermentRetryLimitError) do
      other.lock!('held', retry_count: 1, retry_delay: 100, retry_jitter: 0)
    end
  end

  def test_requests_are_served_in_queue_order
    @rql.lock('fifo', ttl: 30_000)
    order = Queue.new
    waiters = 3.times.map do |i|
      t = Thread.new do
        rql.lock('fifo', ttl: 5_000, timeout: 20, retry_count: nil) do
          order << i
          sleep 0.05
        end
      end
      wait_until("waiter #{i} in the queue") { @rql.queue_info('fifo')&.fetch('queue')&.size == i + 1 }
      t
    end
    assert @rql.queued?('fifo')
    queue = @rql.queue_info('fifo')['queue']
    assert_equal [1, 2, 3], queue.map { |r| r['position'] }
    assert_equal queue.map { |r| r['score'] }.sort, queue.map { |r| r['score'] }
    assert_equal :released, @rql.unlock('fifo')[:result][:lock_res]
    waiters.each(&:join)
    assert_equal [0, 1, 2], 3.times.map { order.pop }, 'granted in the order they queued'
    refute @rql.queued?('fifo')
  end

  # A live waiter keeps its place past its queue_ttl (its server refreshes
  # it); a waiter whose server died is dropped after its queue_ttl, and the
  # next one is served without waiting out the dead one.
  def test_queue_ttl_drops_dead_requests_and_keeps_live_ones
    replica_pid, replica_port = TumblerTest.start_tumbler(QueuedLocksServers.redis_port)
    begin
      @rql.lock('gate', ttl: 30_000)
      doomed = Thread.new do
        rql("127.0.0.1:#{replica_port}").lock('gate', queue_ttl: 1, timeout: 30, retry_count: nil)
      rescue StandardError => e
        e
      end
      wait_until('the waiter on the second replica to queue') { @rql.queue_info('gate')&.fetch('queue')&.size == 1 }
      result = Queue.new
      live = Thread.new { result << rql.lock('gate', queue_ttl: 1, timeout: 30, retry_count: nil) { :ran } }
      wait_until('the second waiter to queue') { @rql.queue_info('gate')&.fetch('queue')&.size == 2 }
      client = Tumbler::Client.new(QueuedLocksServers.addr, namespace: @ns)
      wait_until('both waiters to have waited twice their 1 s queue_ttl') do
        q = client.queue('gate')
        q.requests.all? { |r| q.now_ms - r.enqueued_at_ms > 2_000 }
      end
      assert_equal 2, @rql.queue_info('gate')['queue'].size, 'live waiters keep their places'

      TumblerTest.stop(replica_pid, 'KILL') # its waiter is no longer refreshed
      doomed.kill
      released = mono
      @rql.unlock('gate')
      assert_equal :ran, result.pop
      waited = mono - released
      assert_operator waited, :<, 1 + 2.0,
                      "served within about one queue_ttl of the dead waiter, not its 30 s timeout (#{waited.round(2)} s)"
      live.join
      assert_nil @rql.queue_info('gate')
    ensure
      TumblerTest.stop(replica_pid, 'KILL')
    end
  end

  def test_unlock_and_extend_lock_ttl
    other = rql
    other.lock('shared', ttl: 2_000)
    ext = @rql.extend_lock_ttl('shared', 5_000)
    assert_equal({ ok: true, result: :ttl_extended }, ext)
    assert_operator @rql.lock_info('shared')['rem_ttl'], :>, 5_000
    res = @rql.unlock('shared')
    assert_equal({ rel_key: 'shared', rel_queue: 'shared', queue_res: :nothing_to_release, lock_res: :released },
                 res[:result].except(:rel_time))
    refute @rql.locked?('shared')
    assert_equal :nothing_to_release, @rql.unlock('shared')[:result][:lock_res]
    assert_equal({ ok: false, result: :async_expire_or_no_lock }, @rql.extend_lock_ttl('shared', 1_000))
  end

  def test_listing_and_clearing
    %w[a b c].each { |n| @rql.lock("list-#{n}", ttl: 30_000) }
    waiter = Thread.new { rql.lock('list-a', timeout: 20, retry_count: nil, queue_ttl: 0.3) }
    wait_until('a waiter') { @rql.queued?('list-a') }
    assert_equal Set['list-a', 'list-b', 'list-c'], @rql.locks
    assert_equal Set['list-a'], @rql.queues
    assert_equal Set['list-a', 'list-b', 'list-c'], @rql.keys
    infos = @rql.locks_info
    assert_equal 3, infos.size
    assert(infos.all? { |i| i[:status] == :alive && i[:info]['acq_id'] })
    assert_equal 1, @rql.queues_info.first[:requests].size
    assert_equal 3, @rql.locks(with_info: true).size

    res = @rql.clear_locks
    assert res[:ok]
    assert_operator res[:result][:rel_key_cnt], :>=, 3
    # Its request was dropped by the clear; the waiting call joins the queue
    # again (at its next refresh, a third of its queue_ttl) and gets the free lock.
    assert_equal true, waiter.join(5).value[:ok]
    dead = @rql.clear_dead_requests
    assert dead[:ok]
    assert_kind_of Integer, dead[:result][:dead_requests]
  end

  def test_timed_blocks_are_cut_at_the_ttl
    assert_raises(Tumbler::QueuedLocks::TimedLockTimeoutError) { @rql.lock('timed', ttl: 300, timed: true) { sleep 2 } }
    refute @rql.locked?('timed')
    assert_equal :ok, @rql.lock('timed', ttl: 1_000, timed: true) { :ok }
  end

  def test_events_go_through_active_support_notifications
    seen = []
    sub = ActiveSupport::Notifications.subscribe(/\Aredis_queued_locks\./) { |name, *, payload| seen << [name, payload] }
    @rql.lock('evented', ttl: 1_000, instrument: { job: 7 }) { :done }
    @rql.lock('evented-2', ttl: 5_000)
    @rql.unlock('evented-2')
    @rql.clear_locks
    names = seen.map(&:first)
    assert_equal %w[redis_queued_locks.lock_obtained redis_queued_locks.lock_hold_and_release
                    redis_queued_locks.lock_obtained redis_queued_locks.explicit_lock_release
                    redis_queued_locks.explicit_all_locks_release], names
    obtained = seen[0][1]
    assert_equal %i[acq_id acq_time instrument lock_key ts ttl], obtained.keys.sort
    assert_equal({ job: 7 }, obtained[:instrument])
    assert_equal %i[acq_id acq_time hold_time instrument lock_key ts ttl], seen[1][1].keys.sort
    assert_equal %i[at instrument lock_key lock_key_queue rel_time], seen[3][1].keys.sort
    assert_equal %i[at instrument rel_keys rel_time], seen[4][1].keys.sort
  ensure
    ActiveSupport::Notifications.unsubscribe(sub)
  end

  def test_a_custom_instrumenter
    events = []
    notifier = Object.new
    notifier.define_singleton_method(:notify) { |event, payload| events << [event, payload[:lock_key]] }
    custom = rql { |c| c.instrumenter = notifier }
    custom.lock('custom', ttl: 1_000) { nil }
    assert_equal [%w[redis_queued_locks.lock_obtained custom], %w[redis_queued_locks.lock_hold_and_release custom]], events
  end
end
