# frozen_string_literal: true

# Weighted permits through Tumbler::Client against a real `tumbler serve`
# over its own redis-server: permits: k takes k of the limit, the grant
# reports one slot per permit (kept when extended), a big waiter is handed
# its permits when they free, and more than the limit is InvalidArgument
# with the server's message. Each test has its own namespace.
require 'minitest/autorun'
require 'securerandom'
require 'tumbler'
require_relative 'support/servers'

WEIGHTED_ADDR, = TumblerTest.start_servers

class WeightedTest < Minitest::Test
  def setup
    @client = Tumbler::Client.new(WEIGHTED_ADDR, namespace: "weighted-#{SecureRandom.hex(4)}")
  end

  def test_a_big_job_takes_three_of_five_permits_and_a_waiter_gets_its_slots_when_they_free
    big = @client.acquire('pool', holder: 'big', limit: 5, permits: 3, ttl_ms: 30_000)
    assert_equal [3, [1, 2, 3]], [big.permits, big.slots]
    assert_equal 1, big.slot
    busy = assert_raises(Tumbler::Busy) { @client.acquire('pool', holder: 'other', limit: 5, permits: 3) }
    assert_equal 3, busy.response.holders
    small = @client.acquire('pool', holder: 'small', limit: 5, permits: 2, ttl_ms: 30_000)
    assert_equal [2, [4, 5]], [small.permits, small.slots]
    assert_equal 5, @client.inspect_lock('pool').permits_in_use

    waiter = Thread.new do
      @client.lock('pool', holder: 'other', limit: 5, permits: 3, wait_ms: 10_000) do |lock|
        lock.extend_lease
        [lock.permits, lock.slots, lock.fencing_token]
      end
    end
    TumblerTest.wait_until('the waiter in the queue') { @client.queue('pool').requests.map(&:permits) == [3] }
    assert big.release
    permits, slots, token = waiter.value
    assert_equal [3, [1, 2, 3]], [permits, slots], 'the waiter holds 3 permits, and keeps them when extended'
    assert_operator token, :>, small.fencing_token
    small.release
  end

  def test_a_plain_grant_reports_one_permit_in_its_one_slot
    lock = @client.acquire('plain', limit: 2, ttl_ms: 30_000)
    assert_equal [1, [lock.slot]], [lock.permits, lock.slots]
    lock.release
  end

  def test_more_permits_than_the_limit_is_invalid_argument_naming_permits
    err = assert_raises(Tumbler::InvalidArgument) { @client.acquire('pool', limit: 5, permits: 6) }
    assert_match(/\Apermits/, err.details)
    assert_equal GRPC::Core::StatusCodes::INVALID_ARGUMENT, err.code
  end
end
