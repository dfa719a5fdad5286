# frozen_string_literal: true

require_relative 'test_helper'
require 'delegate'
require 'net/http'

# The process's Keeper sends the releases given while it was busy in one
# request (Client#release_many: one LockService.Batch), each pinned
# to its run's token: every one is applied, a stale one (its grant taken
# over since) touches nothing, and the keeper's flush waits for them all.
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
end
