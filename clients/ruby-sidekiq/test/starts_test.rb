# frozen_string_literal: true

require_relative 'test_helper'
require 'delegate'

# Starts: the try-once Acquires that start jobs, sent together when they
# meet. The first goes alone (an Acquire); those that come while it is on
# its way go together in one Batch after it; each is answered as its own
# call would be (its own holder, its own token, a busy lock nil); a start
# whose thread is interrupted while it waits leaves the line without
# holding up the others, and a sender interrupted before its answer leaves
# the others to be sent again by the next.
class StartsTest < Minitest::Test
  include SidekiqTestHelpers

  # Slows each call down (so the starts meet) and counts them.
  class Slow < SimpleDelegator
    attr_reader :singles, :batches

    def initialize(client, pause)
      super(client)
      @pause = pause
      @singles = 0
      @batches = []
    end

    def acquire(*args, **opts)
      @singles += 1
      sleep @pause
      __getobj__.acquire(*args, **opts)
    end

    def batch(items, **opts)
      @batches << items.size
      sleep @pause
      __getobj__.batch(items, **opts)
    end
  end

  def starts_for(client) = Tumbler::Sidekiq::Starts.new(client)

  # (a thread this test interrupts on purpose: no report of it)
  def quiet = Thread.current.report_on_exception = false

  def test_starts_that_meet_go_in_one_request_each_with_its_own_grant
    tag = new_tag('starts')
    queued = Array.new(6) { |i| tumbler.acquire("#{tag}-#{i}", holder: "job#{i}", ttl_ms: 30_000) }
    busy = tumbler.acquire("#{tag}-busy", holder: 'someone-else', ttl_ms: 30_000)
    slow = Slow.new(tumbler, 0.3)
    starts = starts_for(slow)
    results = {}
    threads = queued.each_with_index.map do |q, i|
      Thread.new do
        sleep 0.05 if i.positive? # the first goes alone; the others come while it is on its way
        results[i] = starts.acquire(q.name, holder: "job#{i}:run#{i}", ttl_ms: 15_000, takes_over: "job#{i}")
      end
    end
    threads << Thread.new { sleep 0.05; results[:busy] = starts.acquire(busy.name, holder: 'job9:run9', ttl_ms: 15_000) }
    threads.each(&:join)
    assert_equal 1, slow.singles, 'the first alone'
    assert_equal [6], slow.batches, 'the six that met it, in one request'
    queued.each_with_index do |q, i|
      lock = results.fetch(i)
      assert_equal "job#{i}:run#{i}", lock.holder
      assert_operator lock.fencing_token, :>, q.fencing_token, 'a token of its own, newer than the queued grant'
      assert_equal [["job#{i}:run#{i}", lock.fencing_token.to_s]], holders(q.name).map { |g| [g.holder, g.fencing_token.to_s] }
    end
    assert_nil results.fetch(:busy), 'a busy lock: nil, as a try-once acquire'
    assert_equal ['someone-else'], holders(busy.name).map(&:holder)
  end

  def test_a_start_interrupted_while_it_waits_leaves_the_line_and_the_others_are_answered
    tag = new_tag('starts-int')
    slow = Slow.new(tumbler, 0.4)
    starts = starts_for(slow)
    first = Thread.new { starts.acquire("#{tag}-0", holder: 'a:run', ttl_ms: 15_000) }
    sleep 0.1
    waiting = Thread.new { quiet; starts.acquire("#{tag}-1", holder: 'b:run', ttl_ms: 15_000) }
    other = Thread.new { starts.acquire("#{tag}-2", holder: 'c:run', ttl_ms: 15_000) }
    sleep 0.1
    waiting.raise(Interrupt) # a shutdown reaching a job that waits for its turn
    assert_raises(Interrupt) { waiting.join }
    assert_equal 'a:run', first.value.holder
    assert_equal 'c:run', other.value.holder
    assert_empty holders("#{tag}-1"), 'the interrupted start was not sent'
  end

  def test_a_sender_interrupted_before_its_answer_leaves_the_others_to_the_next
    tag = new_tag('starts-cut')
    slow = Slow.new(tumbler, 0.4)
    starts = starts_for(slow)
    sender = Thread.new { quiet; starts.acquire("#{tag}-0", holder: 'a:run', ttl_ms: 15_000) }
    sleep 0.1
    others = Array.new(2) { |i| Thread.new { starts.acquire("#{tag}-#{i + 1}", holder: "b#{i}:run", ttl_ms: 15_000) } }
    sleep 0.1
    sender.raise(Interrupt) # cut while its call is on its way
    assert_raises(Interrupt) { sender.join }
    assert_equal %w[b0:run b1:run], others.map { |t| t.value.holder }, 'sent again by the next sender, each answered'
  end
end
