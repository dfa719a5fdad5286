# frozen_string_literal: true

# The Connect transport's own socket (Tumbler::ConnectStub::Conn) against a
# real `tumbler serve` over its own redis-server, seen through a relay that
# can cut its answers into pieces, close a kept-alive connection while it is
# idle, or drop a request unanswered (a server closing the connection as the
# request arrives): answers split across many reads are read whole; a
# connection the server closed while idle is replaced before the call; a
# request dropped on a reused connection is sent once more on a fresh one,
# and on a fresh connection it is UNAVAILABLE, never sent twice by the
# transport; a call past its deadline is DEADLINE_EXCEEDED and its
# connection is closed; Redis stopped under the server is UNAVAILABLE
# (after the retries), never a grant; the head's fields are read however
# the server spells them.
require 'minitest/autorun'
require 'securerandom'
require 'socket'
require 'tumbler'
require_relative 'support/servers'

SOCKET_REDIS_PID, SOCKET_REDIS_PORT = TumblerTest.start_redis
SOCKET_TUMBLER_PID, SOCKET_TUMBLER_PORT = TumblerTest.start_tumbler(SOCKET_REDIS_PORT)
Minitest.after_run do
  TumblerTest.stop(SOCKET_TUMBLER_PID)
  TumblerTest.stop(SOCKET_REDIS_PID)
end

# A TCP relay to the tumbler server. split: answers go to the client in
# pieces of that many bytes, `pause` seconds apart. drop_next: the next
# request that arrives closes its connection unanswered. Counts requests
# and connections.
class Relay
  attr_accessor :split, :pause, :drop_next
  attr_reader :port, :accepted, :requests

  def initialize(upstream_port)
    @upstream_port = upstream_port
    @server = TCPServer.new('127.0.0.1', 0)
    @port = @server.addr[1]
    @clients = []
    @accepted = 0
    @requests = 0
    @mutex = Mutex.new
    @split = nil
    @pause = 0
    @drop_next = false
    @thread = Thread.new { accept_loop }
  end

  def address = "127.0.0.1:#{@port}"

  # Closes every client connection (a server closing its idle connections).
  def close_clients
    @mutex.synchronize { @clients.each { |c| c.close rescue nil } } # rubocop:disable Style/RescueModifier
  end

  def stop
    @thread.kill
    @server.close
    close_clients
  end

  private

  def accept_loop
    loop do
      client = @server.accept
      upstream = TCPSocket.new('127.0.0.1', @upstream_port)
      @mutex.synchronize do
        @accepted += 1
        @clients << client
      end
      Thread.new { to_server(client, upstream) }
      Thread.new { to_client(upstream, client) }
    end
  rescue IOError, SystemCallError
    nil
  end

  def to_server(client, upstream)
    loop do
      data = client.readpartial(65_536)
      drop = @mutex.synchronize do
        @requests += 1
        dropping = @drop_next
        @drop_next = false
        dropping
      end
      if drop
        client.close
        upstream.close
        return
      end
      upstream.write(data)
    end
  rescue IOError, SystemCallError, EOFError
    upstream.close rescue nil # rubocop:disable Style/RescueModifier
  end

  def to_client(upstream, client)
    loop do
      data = upstream.readpartial(65_536)
      if split
        data.bytes.each_slice(split) do |piece|
          client.write(piece.pack('C*'))
          sleep pause if pause.positive?
        end
      else
        client.write(data)
      end
    end
  rescue IOError, SystemCallError, EOFError
    client.close rescue nil # rubocop:disable Style/RescueModifier
  end
end

class ConnectSocketTest < Minitest::Test
  def setup
    @relay = Relay.new(SOCKET_TUMBLER_PORT)
    @ns = "socket-#{SecureRandom.hex(4)}"
    @client = Tumbler::Client.new(@relay.address, namespace: @ns, timeout: 3)
  end

  def teardown
    @client&.close
    @relay&.stop
  end

  def idle = @client.unary.instance_variable_get(:@idle)

  def test_an_answer_split_across_many_reads_is_read_whole
    @client.acquire('warm', ttl_ms: 5_000).release
    @relay.split = 1
    @relay.pause = 0.0005
    lock = @client.acquire('split', ttl_ms: 5_000)
    assert_operator lock.fencing_token, :>, 0
    assert_equal 'split', lock.name
    assert_raises(Tumbler::InvalidArgument) { @client.acquire('split2', limit: 0) } # an error body, split too
    @relay.split = 7
    assert lock.release
    assert_equal 1, @relay.accepted, 'one kept-alive connection throughout'
  end

  def test_a_connection_the_server_closed_while_idle_is_replaced_before_the_call
    @client.acquire('idle', ttl_ms: 5_000).release
    assert_equal 1, idle.size
    @relay.close_clients
    sleep 0.05
    requests = @relay.requests
    lock = @client.acquire('idle', ttl_ms: 5_000)
    assert lock.release
    assert_equal 2, @relay.accepted
    assert_equal requests + 2, @relay.requests, 'no request went to the closed connection'
  end

  def test_a_request_dropped_on_a_reused_connection_goes_once_more_on_a_fresh_one
    lock = @client.acquire('reused', ttl_ms: 5_000)
    @relay.drop_next = true
    assert lock.release, 'the release was sent again, once, and answered'
    assert_equal 2, @relay.accepted
    refute @client.acquire('reused', ttl_ms: 5_000).already_held?
  end

  def test_a_request_dropped_on_a_fresh_connection_is_unavailable_not_sent_again
    @relay.drop_next = true
    req = Tumbler::V1::InspectRequest.new(namespace: @ns, name: 'fresh')
    err = assert_raises(GRPC::Unavailable) { @client.unary.invoke(:inspect, req, Tumbler::Client.now + 2, {}) }
    assert_match(/127\.0\.0\.1:#{@relay.port}/, err.details)
    assert_equal 1, @relay.requests, 'the transport sent it once'
    assert_empty idle, 'the broken connection is not kept'
  end

  def test_a_call_past_its_deadline_is_deadline_exceeded_and_closes_its_connection
    @client.acquire('late', ttl_ms: 5_000).release
    conn = idle.first
    @relay.split = 1
    @relay.pause = 0.05 # the answer takes several seconds to arrive
    req = Tumbler::V1::InspectRequest.new(namespace: @ns, name: 'late')
    t0 = TumblerTest.mono
    err = assert_raises(GRPC::DeadlineExceeded) { @client.unary.invoke(:inspect, req, Tumbler::Client.now + 0.3, {}) }
    assert_equal GRPC::Core::StatusCodes::DEADLINE_EXCEEDED, err.code
    assert_in_delta 0.3, TumblerTest.mono - t0, 0.25
    assert conn.io.closed?, 'the connection with an unread answer is closed'
    assert_empty idle
    @relay.split = nil
    assert_equal 'late', @client.acquire('late', ttl_ms: 5_000).name # a fresh connection
  end

  def test_release_many_sends_the_releases_in_one_request_answered_in_order
    locks = Array.new(5) { |i| @client.acquire("many#{i}", ttl_ms: 5_000) }
    stale = locks[2]
    @client.acquire(stale.name, holder: 'other', ttl_ms: 5_000, takes_over: stale.holder) # token 2 is gone
    requests = @relay.requests
    items = locks.map { |l| [l.name, l.holder, l.fencing_token] }
    items.insert(1, ['', 'h', nil]) # no name: INVALID_ARGUMENT, in its place
    results = @client.release_many(items)
    assert_equal requests + 1, @relay.requests, 'one request'
    assert_equal [true, Tumbler::InvalidArgument, true, false, true, true],
                 results.map { |r| r.is_a?(Tumbler::Error) ? r.class : r }
    assert_match(/\Aname/, results[1].details, 'the details name the field')
    assert_equal ['other'], @client.inspect_lock(stale.name).holders.map { |h| h.grant.holder }, 'pinned to its token'
    assert_equal 1, @relay.accepted
    assert_equal 1, idle.size, 'the connection is kept alive after the exchange'
    assert_equal [], @client.release_many([])
    grpc = Tumbler::Client.new("127.0.0.1:#{SOCKET_TUMBLER_PORT}", namespace: @ns, transport: :grpc)
    assert_equal [true, false], grpc.release_many([[stale.name, 'other', nil], [stale.name, 'other', nil]]),
                 'over gRPC: the same Batch, the same answers'
  end

  # The transport's HTTP/1.1 pipeline (what release_many sent before Batch;
  # bench/bulk.rb compares the two): one write, the answers read in order.
  def test_the_transport_pipelines_requests_on_one_connection_in_order
    locks = Array.new(4) { |i| @client.acquire("piped#{i}", ttl_ms: 5_000) }
    requests = @relay.requests
    accepted = @relay.accepted
    reqs = locks.map do |l|
      Tumbler::V1::ReleaseRequest.new(namespace: @ns, name: l.name, holder: l.holder, fencing_token: l.fencing_token)
    end
    reqs.insert(2, Tumbler::V1::ReleaseRequest.new(namespace: @ns, name: '', holder: 'h'))
    results = @client.unary.pipeline(:release, reqs, Tumbler::Client.now + 5, {})
    assert_equal [:RELEASE_STATUS_RELEASED, :RELEASE_STATUS_RELEASED, GRPC::InvalidArgument,
                  :RELEASE_STATUS_RELEASED, :RELEASE_STATUS_RELEASED],
                 results.map { |r| r.is_a?(GRPC::BadStatus) ? r.class : r.status }
    assert_equal requests + 1, @relay.requests, 'one write'
    assert_equal accepted, @relay.accepted, 'on the kept-alive connection'
  end

  def test_release_many_on_a_reused_connection_the_server_closed_goes_again_on_a_fresh_one
    locks = Array.new(3) { |i| @client.acquire("again#{i}", ttl_ms: 5_000) }
    @relay.drop_next = true
    assert_equal [true, true, true], @client.release_many(locks.map { |l| [l.name, l.holder, l.fencing_token] })
    assert_equal 2, @relay.accepted
  end

  def test_release_many_cut_by_its_deadline_leaves_the_unanswered_ones_to_send_again
    locks = Array.new(3) { |i| @client.acquire("cut#{i}", ttl_ms: 5_000) }
    @relay.split = 1
    @relay.pause = 0.01 # about a second per answer
    results = @client.release_many(locks.map { |l| [l.name, l.holder, l.fencing_token] }, timeout: 0.3)
    assert(results.all? { |r| r.is_a?(Tumbler::Error) && r.code == GRPC::Core::StatusCodes::DEADLINE_EXCEEDED })
    assert_empty idle, 'the connection with unread answers is closed'
    @relay.split = nil
    # The server did release them (the answers were on their way): sending again says so.
    assert_equal [false, false, false], @client.release_many(locks.map { |l| [l.name, l.holder, l.fencing_token] })
  end

  # The server answers UNAVAILABLE once its Redis command times out
  # (--redis-timeout-ms); the client retries that until the call's deadline.
  def test_redis_stopped_under_the_server_is_unavailable_and_never_a_grant
    redis_pid, redis_port = TumblerTest.start_redis
    pid, port = TumblerTest.start_tumbler(redis_port, flags: %w[--redis-timeout-ms 300])
    client = Tumbler::Client.new("127.0.0.1:#{port}", namespace: @ns, timeout: 2)
    assert client.acquire('r', ttl_ms: 5_000).release
    TumblerTest.stop(redis_pid)
    req = Tumbler::V1::AcquireRequest.new(namespace: @ns, name: 'r', holder: 'h', ttl_ms: 5_000)
    err = assert_raises(GRPC::Unavailable) { client.unary.invoke(:acquire, req, Tumbler::Client.now + 5, {}) }
    assert_equal GRPC::Core::StatusCodes::UNAVAILABLE, err.code
    t0 = TumblerTest.mono
    # retried until the deadline; the last try is cut by it (LockTimeout) or answered UNAVAILABLE
    assert_raises(Tumbler::Unavailable, Tumbler::LockTimeout) { client.acquire('r', ttl_ms: 5_000, timeout: 2) }
    assert_operator TumblerTest.mono - t0, :>=, 1.5
    err = assert_raises(Tumbler::Error) { client.release('r', holder: 'nobody') }
    assert_includes [GRPC::Core::StatusCodes::UNAVAILABLE, GRPC::Core::StatusCodes::DEADLINE_EXCEEDED], err.code
  ensure
    client&.close
    TumblerTest.stop(pid)
    TumblerTest.stop(redis_pid)
  end

  # The head as another server might spell it: mixed case, a chunked body,
  # HTTP/1.0, Connection: close. (A scripted peer: only the framing is under test.)
  def test_the_head_is_read_however_it_is_spelled
    body = Tumbler::V1::InspectResponse.encode(Tumbler::V1::InspectResponse.new(name: 'x'))
    answers = [
      "HTTP/1.1 200 OK\r\nCONTENT-TYPE: application/proto\r\nContent-Length: #{body.bytesize}\r\n\r\n".b + body,
      "HTTP/1.1 200 OK\r\ntransfer-encoding: Chunked\r\n\r\n#{body.bytesize.to_s(16)};x=1\r\n".b + body + "\r\n0\r\n\r\n",
      "HTTP/1.1 200 OK\r\nConnection: Close\r\ncontent-length: #{body.bytesize}\r\n\r\n".b + body,
      "HTTP/1.0 200 OK\r\n\r\n".b + body
    ]
    peer = TCPServer.new('127.0.0.1', 0)
    accepted = 0
    thread = Thread.new do
      answers.each_slice(2).to_a.then { |a| [a[0], [a[1][0]], [a[1][1]]] }.each do |group|
        sock = peer.accept
        accepted += 1
        group.each do |answer|
          sock.readpartial(65_536)
          sock.write(answer)
        end
        sock.close
      end
    end
    stub = Tumbler::ConnectStub.new('127.0.0.1', peer.addr[1])
    req = Tumbler::V1::InspectRequest.new(name: 'x')
    4.times { assert_equal 'x', stub.invoke(:inspect, req, Tumbler::Client.now + 2, {}).name }
    thread.join(2)
    assert_equal 3, accepted, 'kept alive after the first two; closed after Connection: Close and HTTP/1.0'
  ensure
    peer&.close
    stub&.close
  end
end
