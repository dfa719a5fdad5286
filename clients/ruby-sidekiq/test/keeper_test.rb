# frozen_string_literal: true

require_relative 'test_helper'
require 'delegate'
require 'net/http'

# The process's Keeper sends the releases given while it was busy in one
# request (Client#release_many: one LockService.Batch), each pinned
# to its run's token: every one is applied, a stale one (its grant taken
# over since) touches nothing, and the keeper's flush waits for them all.
# A release waits up to the keeper's delay for others to go with it, no
# longer; a flush (and the process's exit) sends at once.
class KeeperTest < Minitest::Test
  include SidekiqTestHelpers

  # Counts how the keeper sends its releases.
  class Spy < SimpleDelegator
    attr_reader :batches, :singles

    def initialize(client)
      super
      @batches = []
      @singles = 0
    end

    def release_many(releases, **opts)
      @batches << releases.size
      __getobj__.release_many(releases, **opts)
    end

    def release(*args, **opts)
      @singles += 1
      __getobj__.release(*args, **opts)
    end
  end

  def rpc_counts
    body = Net::HTTP.get(URI("http://127.0.0.1:#{SidekiqHarness.http_port}/metrics"))
    body.scan(/^tumbler_rpc_requests_total\{method="(\w+)",code="\w+"\} (\d+)/)
        .each_with_object(Hash.new(0)) { |(m, v), h| h[m] += Integer(v) }
  end

  def test_releases_given_together_go_in_one_request_each_pinned_to_its_token
    tag = new_tag('keeper')
    locks = Array.new(20) { |i| tumbler.acquire("#{tag}-#{i}", holder: "job#{i}:run", ttl_ms: 30_000) }
    # The run of job 3 lost its grant to a newer run: its release must leave that grant alone.
    newer = tumbler.acquire(locks[3].name, holder: 'job3:newer', ttl_ms: 30_000, takes_over: locks[3].holder)
    spy = Spy.new(tumbler)
    keeper = Tumbler::Sidekiq::Keeper.new(spy, Logger.new(nil))
    before = rpc_counts
    # Given in one go (the keeper thread waits for this one to block): sent together.
    locks.each { |l| keeper.release_later(l.name, l.holder, l.fencing_token) }
    keeper.flush(10)
    assert_equal 20, spy.batches.sum + spy.singles, 'every release sent once'
    assert_operator spy.batches.size + spy.singles, :<, 20, "sent together (#{spy.batches.inspect}, #{spy.singles} alone)"
    sent = rpc_counts.to_h { |m, v| [m, v - before[m]] }
    assert_equal spy.batches.size, sent['Batch'].to_i, 'each group of releases is one request'
    assert_equal spy.singles, sent['Release'].to_i
    locks.each_with_index do |l, i|
      expected = i == 3 ? [[newer.holder, newer.fencing_token.to_s]] : []
      assert_equal expected, holders(l.name).map { |g| [g.holder, g.fencing_token.to_s] }, l.name
    end
    assert newer.release
  ensure
    keeper&.stop(5)
  end

  def test_releases_given_one_by_one_within_the_delay_go_in_one_request_sent_once_it_passed
    tag = new_tag('keeper-delay')
    locks = Array.new(5) { |i| tumbler.acquire("#{tag}-#{i}", holder: "job#{i}:run", ttl_ms: 30_000) }
    spy = Spy.new(tumbler)
    keeper = Tumbler::Sidekiq::Keeper.new(spy, Logger.new(nil), delay: 0.5)
    given = TumblerTest.mono
    locks.each do |l|
      keeper.release_later(l.name, l.holder, l.fencing_token)
      sleep 0.02
    end
    refute_empty holders(locks.first.name), 'the first release waits for the others'
    wait_until('every release sent', timeout: 5) { locks.all? { |l| holders(l.name).empty? } }
    waited = TumblerTest.mono - given
    assert_operator waited, :>=, 0.45, 'sent once the first had waited the delay'
    assert_operator waited, :<, 3, 'and not much later'
    assert_equal [[5], 0], [spy.batches, spy.singles], 'in one request'
  ensure
    keeper&.stop(5)
  end

  def test_a_flush_sends_at_once_whatever_the_delay
    tag = new_tag('keeper-flush')
    lock = tumbler.acquire(tag, holder: 'job:run', ttl_ms: 30_000)
    other = tumbler.acquire("#{tag}-2", holder: 'job2:run', ttl_ms: 30_000)
    keeper = Tumbler::Sidekiq::Keeper.new(tumbler, Logger.new(nil), delay: 60)
    keeper.release_later(lock.name, lock.holder, lock.fencing_token)
    started = TumblerTest.mono
    keeper.flush(10)
    assert_operator TumblerTest.mono - started, :<, 5, 'the flush did not wait out the delay'
    assert_empty holders(lock.name)
    # The process's exit (stop) sends what is left the same way.
    keeper.release_later(other.name, other.holder, other.fencing_token)
    keeper.stop(10)
    assert_empty holders(other.name)
  ensure
    keeper&.stop(5)
  end

  def test_with_no_delay_each_release_goes_at_once
    tag = new_tag('keeper-nodelay')
    lock = tumbler.acquire(tag, holder: 'job:run', ttl_ms: 30_000)
    keeper = Tumbler::Sidekiq::Keeper.new(tumbler, Logger.new(nil), delay: 0)
    keeper.release_later(lock.name, lock.holder, lock.fencing_token)
    wait_until('the release sent', timeout: 5) { holders(lock.name).empty? }
  ensure
    keeper&.stop(5)
  end
end
