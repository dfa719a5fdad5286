# frozen_string_literal: true

# Multi-locks and deadlock refusals through Tumbler::Client against a real
# `tumbler serve` over its own redis-server: a set is taken all or none, is
# extended and released as one, a waiting set is granted once the set it
# overlaps is released, a name twice is InvalidArgument naming names, and a
# wait closing a real two-party cycle raises Tumbler::Deadlock. Each test
# has its own namespace.
require 'minitest/autorun'
require 'securerandom'
require 'tumbler'
require_relative 'support/servers'

MULTI_ADDR, = TumblerTest.start_servers

class MultiTest < Minitest::Test
  def setup
    @client = Tumbler::Client.new(MULTI_ADDR, namespace: "multi-#{SecureRandom.hex(4)}")
  end

  def holders(*names) = names.map { |n| @client.inspect_lock(n).holders.size }

  def test_a_set_with_one_name_held_elsewhere_is_busy_and_leaves_the_others_unheld
    other = @client.acquire('b', holder: 'other', ttl_ms: 30_000)
    busy = assert_raises(Tumbler::Busy) { @client.acquire_all(%w[a b c], holder: 'set') }
    assert_match(/\Aa,b,c: not acquired/, busy.message)
    assert_equal [0, 1, 0], holders('a', 'b', 'c')
    assert other.release
    set = @client.acquire_all(%w[a b c], holder: 'set', ttl_ms: 30_000)
    assert_equal [1, 1, 1], holders('a', 'b', 'c')
    assert set.release
  end

  def test_a_set_is_granted_one_grant_per_name_extended_and_released_as_one
    set = @client.acquire_all(%w[accounts/2 accounts/1], holder: 'mover', ttl_ms: 5000)
    assert_equal %w[accounts/2 accounts/1], set.names
    assert_equal %w[accounts/2 accounts/1], set.grants.map(&:name)
    assert_equal 'mover', set.holder
    assert_operator set.fencing_token('accounts/1'), :>, 0
    assert_nil set.fencing_token('accounts/3')
    before = set.expires_at_ms
    set.extend_lease(60_000)
    assert_operator set.expires_at_ms, :>, before + 30_000
    assert_operator @client.inspect_lock('accounts/1').holders.first.grant.expires_at_ms, :>, before + 30_000
    assert set.release
    assert_equal [0, 0], holders('accounts/1', 'accounts/2')
    assert_raises(Tumbler::LockLost) { set.extend_lease }
  end

  def test_lock_all_holds_the_set_for_the_block_and_releases_it
    tokens = @client.lock_all(%w[x y], ttl_ms: 3000) do |set|
      assert_equal [1, 1], holders('x', 'y')
      %w[x y].map { |n| set.fencing_token(n) }
    end
    assert tokens.all?(&:positive?)
    assert_equal [0, 0], holders('x', 'y')
  end

  def test_the_watchdog_keeps_the_set_past_its_lease
    seen = @client.lock_all(%w[w1 w2], ttl_ms: 600) do |set|
      sleep 1.2 # twice the lease: only the watchdog's renewals of the set keep it
      [set.lost?, holders('w1', 'w2')]
    end
    assert_equal [false, [1, 1]], seen
    assert_equal [0, 0], holders('w1', 'w2')
  end

  def test_a_waiting_set_is_granted_once_the_set_it_overlaps_is_released
    first = @client.acquire_all(%w[p q], holder: 'first', ttl_ms: 30_000)
    waiter = Thread.new do
      @client.lock_all(%w[q r], holder: 'second', wait_ms: 10_000) { |set| [set.grants.map(&:name), TumblerTest.mono] }
    end
    TumblerTest.wait_until('the waiting set in q\'s queue') do
      @client.queue('q').requests.map(&:holder).include?('second')
    end
    assert waiter.alive?, 'the overlapping set waits'
    released_at = TumblerTest.mono
    assert first.release
    names, granted_at = waiter.value
    assert_equal %w[q r], names
    assert_operator granted_at, :>=, released_at
    assert_equal [0, 0, 0], holders('p', 'q', 'r')
  end

  def test_release_all_by_holder_frees_the_set_and_is_false_when_a_name_was_not_held
    @client.acquire_all(%w[m n], holder: 'crashed', ttl_ms: 30_000)
    assert @client.release_all(%w[m n], holder: 'crashed')
    @client.acquire_all(%w[m n], holder: 'crashed', ttl_ms: 30_000)
    refute @client.release_all(%w[m o], holder: 'crashed')
    assert_equal [0], holders('m')
    @client.release_all(%w[m n], holder: 'crashed')
  end

  # The holder took the set again after releasing it: a late release of the
  # old set (its own, or release_all with its tokens) and a late extend of
  # it answer not held, and leave the newer set held with its tokens.
  def test_a_late_release_of_an_old_set_leaves_the_holders_newer_set_alone
    old = @client.acquire_all(%w[s t], holder: 'again', ttl_ms: 30_000)
    assert old.release
    newer = @client.acquire_all(%w[s t], holder: 'again', ttl_ms: 30_000)
    refute_equal old.fencing_tokens, newer.fencing_tokens
    refute old.release, 'the old set released again'
    refute @client.release_all(%w[s t], holder: 'again', fencing_tokens: old.fencing_tokens)
    assert_raises(Tumbler::LockLost) { old.extend_lease }
    held = %w[s t].map { |n| @client.inspect_lock(n).holders.map { |h| [h.grant.holder, h.grant.fencing_token] } }
    assert_equal(newer.fencing_tokens.map { |t| [['again', t]] }, held)
    assert newer.release
    assert_equal [0, 0], holders('s', 't')
  end

  def test_release_all_with_tokens_not_one_per_name_is_invalid_argument_naming_fencing_tokens
    set = @client.acquire_all(%w[u v], holder: 'short', ttl_ms: 30_000)
    err = assert_raises(Tumbler::InvalidArgument) do
      @client.release_all(%w[u v], holder: 'short', fencing_tokens: [set.fencing_token('u')])
    end
    assert_match(/\Afencing_tokens/, err.details)
    assert_equal [1, 1], holders('u', 'v'), 'nothing released'
    assert @client.release_all(%w[u v], holder: 'short', fencing_tokens: set.fencing_tokens)
  end

  def test_a_name_twice_is_invalid_argument_naming_names
    err = assert_raises(Tumbler::InvalidArgument) { @client.acquire_all(%w[a a]) }
    assert_match(/\Anames/, err.details)
    err = assert_raises(Tumbler::InvalidArgument) { @client.acquire_all(%w[a]) }
    assert_match(/\Anames/, err.details)
  end

  # "rb-a" holds x, "rb-b" holds y; "rb-b" waits for x (its wait is checked,
  # and so recorded, after a tenth of its 5 s). Then "rb-a" asking y would
  # close the cycle: refused as soon as its own check is due.
  def test_a_wait_that_would_close_a_cycle_raises_deadlock
    x = @client.acquire('x', holder: 'rb-a', ttl_ms: 30_000)
    y = @client.acquire('y', holder: 'rb-b', ttl_ms: 30_000)
    waiter = Thread.new { @client.lock('x', holder: 'rb-b', wait_ms: 5000) { |lock| lock.fencing_token } }
    TumblerTest.wait_until('rb-b in x\'s queue') { @client.queue('x').requests.map(&:holder) == ['rb-b'] }
    sleep 1 # well past rb-b's check (a tenth of 5 s): its edge is recorded
    started = TumblerTest.mono
    err = assert_raises(Tumbler::Deadlock) { @client.acquire('y', holder: 'rb-a', wait_ms: 10_000) }
    assert_operator TumblerTest.mono - started, :<, 5, 'long before its wait would end'
    assert_equal GRPC::Core::StatusCodes::ABORTED, err.code
    assert_match(/\Adeadlock: .*"rb-a".*"rb-b"|\Adeadlock: .*"rb-b".*"rb-a"/, err.details)
    assert x.release
    assert_operator waiter.value, :>, x.fencing_token, 'the other waiter is granted once x frees'
    y.release
  end

  def test_other_aborted_answers_are_not_deadlocks
    err = Tumbler.error_from(GRPC::Aborted.new('session resumed elsewhere'))
    assert_instance_of Tumbler::Error, err
    assert_instance_of Tumbler::Deadlock, Tumbler.error_from(GRPC::Aborted.new('deadlock: holder "a" waits'))
  end
end
