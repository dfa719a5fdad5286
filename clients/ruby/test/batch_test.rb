# frozen_string_literal: true

# Client#batch (LockService.Batch) against a real `tumbler serve` over its
# own redis-server, over Connect and over gRPC: each item answered as its
# own call would be (a Lock, Busy, true/false, nil, or the error class its
# call raises, with details naming the field), items of one lock in order,
# a multi-lock item, requests the server refuses whole, more than 256
# items in several requests (counted on the server's /metrics), the
# helpers built on it (release_many, try_acquire_each), and Redis stopped
# under the server: each item Unavailable once the timeout passed.
require 'minitest/autorun'
require 'net/http'
require 'securerandom'
require 'tumbler'
require_relative 'support/servers'

BATCH_REDIS_PID, BATCH_REDIS_PORT = TumblerTest.start_redis
BATCH_HTTP_PORT = TumblerTest.free_port
BATCH_TUMBLER_PID, BATCH_TUMBLER_PORT = TumblerTest.start_tumbler(BATCH_REDIS_PORT, http_port: BATCH_HTTP_PORT)
Minitest.after_run do
  TumblerTest.stop(BATCH_TUMBLER_PID)
  TumblerTest.stop(BATCH_REDIS_PID)
end

module BatchTests
  def setup
    @client = Tumbler::Client.new("127.0.0.1:#{BATCH_TUMBLER_PORT}", namespace: "batch-#{SecureRandom.hex(4)}",
                                                                     transport: transport)
  end

  def teardown = @client.close

  # tumbler_rpc_requests_total by method, as the server counts them.
  def rpc_counts
    body = Net::HTTP.get(URI("http://127.0.0.1:#{BATCH_HTTP_PORT}/metrics"))
    body.scan(/^tumbler_rpc_requests_total\{method="(\w+)",code="\w+"\} (\d+)/)
        .each_with_object(Hash.new(0)) { |(m, v), h| h[m] += Integer(v) }
  end

  def counted
    before = rpc_counts
    yield
    after = rpc_counts
    after.to_h { |m, v| [m, v - before[m]] }.reject { |_, v| v.zero? }
  end

  def holders(name) = @client.inspect_lock(name).holders.map { |h| h.grant.holder }

  def test_each_item_is_answered_as_its_own_call_would_be
    held = @client.acquire('taken', holder: 'other', ttl_ms: 30_000)
    results = nil
    calls = counted do
      results = @client.batch([
                                [:acquire, 'a', { holder: 'job-1', ttl_ms: 30_000, kind: 'reports' }],
                                [:acquire, 'taken', { holder: 'job-2', ttl_ms: 30_000 }],
                                [:acquire, 'b', { holder: 'job-3', kind: 'Not A Kind!' }],
                                [:acquire, 'c', { holder: 'job-4', queue_ttl_ms: 5 }],
                                [:release, 'nothing', { holder: 'nobody' }],
                                [:extend, 'nothing', { holder: 'nobody', ttl_ms: 1000 }],
                                [:acquire, '', { holder: 'job-5' }],
                                [:acquire, %w[m1 m2], { holder: 'set', ttl_ms: 30_000 }]
                              ])
    end
    assert_equal({ 'Batch' => 1 }, calls, 'one request')
    a, busy, bad_kind, bad_ttl, released, extended, no_name, set = results
    assert_instance_of Tumbler::Lock, a
    assert_equal 'job-1', a.holder
    assert_equal 'reports', a.grant.kind
    assert_operator a.fencing_token, :>, 0
    refute a.already_held?
    assert_instance_of Tumbler::Busy, busy
    assert busy.busy?
    assert_equal :NOT_ACQUIRED_REASON_BUSY, busy.response.reason
    assert_match(/\Ataken: not acquired/, busy.message)
    assert_instance_of Tumbler::InvalidArgument, bad_kind
    assert_equal GRPC::Core::StatusCodes::INVALID_ARGUMENT, bad_kind.code
    assert_match(/\Akind: /, bad_kind.details, 'the field is named first')
    assert_instance_of Tumbler::InvalidArgument, bad_ttl
    assert_match(/\Aqueue_ttl_ms: /, bad_ttl.details)
    assert_equal false, released
    assert_nil extended
    assert_instance_of Tumbler::InvalidArgument, no_name
    assert_match(/\Aname/, no_name.details)
    assert_instance_of Tumbler::LockSet, set
    assert_equal %w[m1 m2], set.names
    # The single calls answer the same.
    single = assert_raises(Tumbler::InvalidArgument) { @client.acquire('b', holder: 'job-3', kind: 'Not A Kind!') }
    assert_equal single.details, bad_kind.details
    assert_equal ['job-1'], holders('a')
    assert_equal ['other'], holders('taken')
    assert_equal [], holders('b')
    # What the batch granted is an ordinary grant.
    assert_equal 'job-1', a.extend_lease(10_000).holder
    assert a.release
    assert set.release
    assert held.release
  end

  def test_items_on_one_lock_run_in_order_and_a_retry_finds_its_grant
    first, second, extended, released, again = @client.batch([
                                                               [:acquire, 'x', { holder: 'j1', ttl_ms: 30_000 }],
                                                               [:acquire, 'x', { holder: 'j2', ttl_ms: 30_000 }],
                                                               [:extend, 'x', { holder: 'j1', ttl_ms: 20_000 }],
                                                               [:release, 'x', { holder: 'j1' }],
                                                               [:acquire, 'x', { holder: 'j2', ttl_ms: 30_000 }]
                                                             ])
    assert_instance_of Tumbler::Lock, first
    assert_instance_of Tumbler::Busy, second, 'the first of one lock wins'
    assert_equal first.fencing_token, extended.fencing_token
    assert_equal 20_000, extended.ttl_ms
    assert_equal true, released
    assert_instance_of Tumbler::Lock, again
    assert_operator again.fencing_token, :>, first.fencing_token
    retried = @client.batch([[:acquire, 'x', { holder: 'j2', ttl_ms: 30_000 }]]).first
    assert retried.already_held?, 'the same holder again: ALREADY_HELD, its grant'
    assert_equal again.fencing_token, retried.fencing_token
    assert_equal [true], @client.release_many([['x', 'j2', again.fencing_token]])
  end

  def test_refused_whole
    err = assert_raises(ArgumentError) { @client.batch([[:acquire, 'w', { holder: 'h', wait_ms: 1000 }]]) }
    assert_match(/try-once/, err.message)
    assert_raises(ArgumentError) { @client.batch([[:lock, 'w', {}]]) }
    assert_raises(ArgumentError) { @client.batch([[:release, 'w', { ttl_ms: 5 }]]) }
    # What the server refuses whole, sent as it is.
    empty = assert_raises(Tumbler::InvalidArgument) { @client.call(:batch) { Tumbler::V1::BatchRequest.new } }
    assert_match(/\Aitems/, empty.details)
    item = Tumbler::V1::BatchItem.new(release: Tumbler::V1::ReleaseRequest.new(name: 'r', holder: 'h'))
    too_many = assert_raises(Tumbler::InvalidArgument) do
      @client.call(:batch) { Tumbler::V1::BatchRequest.new(items: Array.new(257, item)) }
    end
    assert_match(/\Aitems/, too_many.details)
    waits = Tumbler::V1::BatchItem.new(acquire: Tumbler::V1::AcquireRequest.new(name: 'w', holder: 'h', wait_ms: 100))
    waiting = assert_raises(Tumbler::InvalidArgument) { @client.call(:batch) { Tumbler::V1::BatchRequest.new(items: [waits]) } }
    assert_match(/\Aitems/, waiting.details)
    assert_equal [], holders('w')
    assert_equal [], @client.batch([]), 'nothing to send: no request'
  end

  def test_a_later_request_refused_whole_hands_back_what_the_earlier_ones_took
    # 256 small acquires go first; the 257th alone is over the server's
    # request size (64 KiB), so its request is refused whole.
    items = Array.new(256) { |i| [:acquire, "part-#{i}", { holder: "jid-#{i}", ttl_ms: 30_000 }] }
    items << [:acquire, 'huge', { holder: 'jid-huge', ttl_ms: 30_000, metadata: { 'args' => 'x' * 70_000 } }]
    err = assert_raises(Tumbler::Error) { @client.batch(items) }
    refute_includes Tumbler::Client::CUT, err.code, err.message
    taken = err.batch_results
    refute_nil taken, 'the answers of the request that went through'
    assert_equal 257, taken.size
    assert(taken.first(256).all? { |r| r.is_a?(Tumbler::Lock) }, taken.first(3).map(&:class).to_s)
    assert_nil taken.last
    # Given back by the caller, pinned to the tokens it was told.
    released = @client.release_many(taken.first(256).each_with_index.map { |r, i| ["part-#{i}", "jid-#{i}", r.fencing_token] })
    assert_equal [true] * 256, released
    assert_equal [], holders('huge')
  end

  def test_items_over_the_request_size_go_in_several_requests
    # 200 acquires with 600 bytes of metadata each: about 130 KB, past the
    # server's 64 KiB request limit in one request.
    meta = { 'class' => 'Reports::MonthlyExportJob', 'queue' => 'q' * 560 }
    items = Array.new(200) { |i| [:acquire, "wide-#{i}", { holder: "jid-#{i}", ttl_ms: 30_000, metadata: meta }] }
    results = nil
    calls = counted { results = @client.batch(items) }
    assert(results.all? { |r| r.is_a?(Tumbler::Lock) }, results.reject { |r| r.is_a?(Tumbler::Lock) }.first(2).inspect)
    assert_operator calls['Batch'], :>=, 3, calls.inspect
  end

  def test_more_than_256_items_go_in_several_requests_in_order
    names = Array.new(600) { |i| "many/#{i}" }
    locks = nil
    calls = counted { locks = @client.try_acquire_each(names, holder: 'bulk', ttl_ms: 30_000) }
    assert_equal({ 'Batch' => 3 }, calls, '256 + 256 + 88')
    assert_equal names, locks.map(&:name)
    assert(locks.all? { |l| l.is_a?(Tumbler::Lock) && l.holder == 'bulk' })
    assert_equal %w[bulk], holders('many/599')
    released = nil
    calls = counted { released = @client.release_many(locks.map { |l| [l.name, l.holder, l.fencing_token] }) }
    assert_equal({ 'Batch' => 3 }, calls)
    assert_equal [true] * 600, released
    assert_equal [], holders('many/0')
  end

  def test_try_acquire_each_takes_each_lock_on_its_own
    other = @client.acquire('t2', holder: 'other', ttl_ms: 30_000)
    results = @client.try_acquire_each(%w[t1 t2 t3], holder: %w[h1 h2 h3], ttl_ms: 30_000)
    assert_equal [Tumbler::Lock, Tumbler::Busy, Tumbler::Lock], results.map(&:class)
    assert_equal %w[h1 h3], [results[0].holder, results[2].holder]
    one = @client.try_acquire_each(%w[u1 u2], ttl_ms: 30_000)
    assert_equal 1, one.map(&:holder).uniq.size, 'one holder made for all'
    assert_raises(ArgumentError) { @client.try_acquire_each(%w[a b], holder: %w[one]) }
    assert_equal [true, true, false], @client.release_many([['t1', 'h1', results[0].fencing_token],
                                                            ['t3', 'h3', results[2].fencing_token],
                                                            ['t3', 'h3', results[2].fencing_token]])
    assert other.release
  end
end

class BatchConnectTest < Minitest::Test
  include BatchTests

  def transport = :connect
end

class BatchGrpcTest < Minitest::Test
  include BatchTests

  def transport = :grpc
end

# Redis stopped under the server: every item is Unavailable once the
# timeout has passed (its UNAVAILABLE answers retried until then).
class BatchRedisDownTest < Minitest::Test
  def test_redis_stopped_each_item_is_unavailable_after_the_retries
    redis_pid, redis_port = TumblerTest.start_redis
    pid, port = TumblerTest.start_tumbler(redis_port, flags: %w[--redis-timeout-ms 300])
    client = Tumbler::Client.new("127.0.0.1:#{port}", namespace: 'down', retry_max: 0.2)
    assert_instance_of Tumbler::Lock, client.batch([[:acquire, 'up', { holder: 'h', ttl_ms: 30_000 }]]).first
    TumblerTest.stop(redis_pid)
    started = TumblerTest.mono
    results = client.batch([[:acquire, 'd1', { holder: 'h1', ttl_ms: 30_000 }],
                            [:release, 'up', { holder: 'h' }]], timeout: 2)
    # (the last try answered UNAVAILABLE, or cut by the deadline)
    codes = [GRPC::Core::StatusCodes::UNAVAILABLE, GRPC::Core::StatusCodes::DEADLINE_EXCEEDED]
    results.each do |r|
      assert_kind_of Tumbler::Error, r
      assert_includes codes, r.code, r.message
    end
    # The same as the single calls raise.
    single = assert_raises(Tumbler::Unavailable, Tumbler::LockTimeout) { client.acquire('d1', holder: 'h1', timeout: 1) }
    assert_includes [Tumbler::Unavailable, Tumbler::LockTimeout], single.class
    assert_operator TumblerTest.mono - started, :>=, 1.5, 'retried until the timeout'
    client.close
  ensure
    TumblerTest.stop(pid)
    TumblerTest.stop(redis_pid)
  end
end
