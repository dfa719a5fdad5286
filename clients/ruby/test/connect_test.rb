# frozen_string_literal: true

# The Connect transport of Tumbler::Client's unary calls (tumbler/connect.rb)
# against a real `tumbler serve` over its own redis-server: it is the
# default for a plaintext client; the answers and errors are those of the
# gRPC transport; connections are kept alive and reused; a kept-alive
# connection the server closed is replaced without the caller seeing it;
# a deadline cuts a call with DEADLINE_EXCEEDED; an exception raised into
# a waiting caller's thread (Timeout.timeout) closes its connection, so the
# server drops the waiting request; a server that is gone is Unavailable
# after the retries, and the client works again once it is back.
require 'minitest/autorun'
require 'securerandom'
require 'timeout'
require 'tumbler'
require_relative 'support/servers'

CONNECT_REDIS_PID, CONNECT_REDIS_PORT = TumblerTest.start_redis
Minitest.after_run { TumblerTest.stop(CONNECT_REDIS_PID) }

class ConnectTest < Minitest::Test
  def setup
    @pid, @port = TumblerTest.start_tumbler(CONNECT_REDIS_PORT)
    @ns = "connect-#{SecureRandom.hex(4)}"
    @client = Tumbler::Client.new("127.0.0.1:#{@port}", namespace: @ns, timeout: 2)
  end

  def teardown
    @client&.close
    TumblerTest.stop(@pid)
  end

  def grpc_client = Tumbler::Client.new("127.0.0.1:#{@port}", namespace: @ns, transport: :grpc)

  def test_plaintext_clients_send_unary_calls_over_connect_and_streams_stay_grpc
    assert_kind_of Tumbler::ConnectStub, @client.unary
    assert_kind_of GRPC::ClientStub, grpc_client.unary
    assert_kind_of GRPC::ClientStub, Tumbler::Client.new("127.0.0.1:#{@port}", interceptors: [GRPC::ClientInterceptor.new]).unary
    lock = @client.acquire('a', ttl_ms: 5_000)
    assert_operator lock.fencing_token, :>, 0
    assert_equal [lock.holder], grpc_client.inspect_lock('a').holders.map { |h| h.grant.holder }, 'one lock, whichever transport'
    again = @client.acquire('a', holder: lock.holder)
    assert again.already_held?
    assert_equal lock.fencing_token, again.fencing_token
    lock.extend_lease(8_000)
    assert lock.release
    refute lock.release, 'a second release: not held'
    assert_raises(ArgumentError) { Tumbler::Client.new('dns:///localhost:1', transport: :connect) }
  end

  def test_takes_over_is_passed_through_to_the_server
    [@client, grpc_client].each_with_index do |c, i|
      queued = c.acquire("t#{i}", holder: "job-#{i}", ttl_ms: 5_000)
      run = c.acquire("t#{i}", holder: "run-#{i}", ttl_ms: 5_000, takes_over: "job-#{i}")
      assert_operator run.fencing_token, :>, queued.fencing_token
      assert_equal ["run-#{i}"], c.inspect_lock("t#{i}").holders.map { |h| h.grant.holder }
      refute queued.release, 'the grant passed on'
      assert run.release
    end
  end

  def test_errors_are_the_grpc_transports
    [@client, grpc_client].each do |c|
      err = assert_raises(Tumbler::InvalidArgument) { c.acquire('b', limit: 0, ttl_ms: 1_000) }
      assert_equal GRPC::Core::StatusCodes::INVALID_ARGUMENT, err.code
      assert_match(/\Alimit/, err.details, 'the details name the field')
      assert_kind_of GRPC::InvalidArgument, err.cause
    end
    held = grpc_client.acquire('b', ttl_ms: 5_000)
    busy = assert_raises(Tumbler::Busy) { @client.acquire('b') }
    assert_equal 1, busy.response.holders
    held.release
  end

  def test_connections_are_kept_alive_and_one_the_server_closed_is_replaced
    @client.acquire('c', ttl_ms: 5_000).release
    idle = @client.unary.instance_variable_get(:@idle)
    assert_equal 1, idle.size
    first = idle.first
    10.times { @client.acquire('c', ttl_ms: 5_000).release }
    assert_equal [first], idle, 'the same connection, every call'
    first.io.shutdown(Socket::SHUT_WR) # the server sees the connection end, and closes its side
    sleep 0.1
    @client.acquire('c', ttl_ms: 5_000).release
    assert_equal 1, idle.size
    refute_same first, idle.first
  end

  def test_a_deadline_cuts_a_call_and_timeout_drops_the_waiting_request
    held = @client.acquire('d', ttl_ms: 10_000)
    t0 = TumblerTest.mono
    assert_raises(Tumbler::LockTimeout) { @client.acquire('d', wait_ms: 5_000, timeout: 0.5) }
    assert_in_delta 0.5, TumblerTest.mono - t0, 0.4
    assert_raises(Timeout::Error) { Timeout.timeout(0.3) { @client.acquire('d', holder: 'waiter', wait_ms: 5_000) } }
    TumblerTest.wait_until('the server to drop the waiting request', timeout: 3) { @client.queue('d').requests.empty? }
    assert held.release
    @client.acquire('d', ttl_ms: 1_000).release # the pool still works
  end

  def test_a_server_that_is_gone_is_unavailable_and_the_client_recovers_when_it_is_back
    @client.acquire('e', ttl_ms: 1_000).release
    TumblerTest.stop(@pid)
    t0 = TumblerTest.mono
    assert_raises(Tumbler::Unavailable) { @client.inspect_lock('e') }
    assert_operator TumblerTest.mono - t0, :>=, 1.5, 'retried until the deadline'
    @pid, = TumblerTest.start_tumbler(CONNECT_REDIS_PORT, port: @port)
    assert @client.acquire('e', ttl_ms: 1_000).release
  end
end
