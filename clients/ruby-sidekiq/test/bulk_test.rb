# frozen_string_literal: true

require_relative 'test_helper'
require 'digest'
require 'fileutils'
require 'net/http'
require 'tmpdir'

# Sidekiq::Client.push_bulk of unique jobs takes all their push-time locks
# in one Batch request (counted by tumbler's /metrics), and keeps every
# promise of a single push: a duplicate (of a queued job, or of an earlier
# job of the same bulk: the first wins) is not pushed and its jid not
# returned; each lock's holder is its job's jid; the run takes the grant
# over and releases it; each conflict strategy does what it does for a
# single push; with tumbler's Redis stopped the bulk raises what a single
# push raises and pushes nothing.
class BulkTest < Minitest::Test
  include SidekiqTestHelpers

  def rpc_counts
    body = Net::HTTP.get(URI("http://127.0.0.1:#{SidekiqHarness.http_port}/metrics"))
    body.scan(/^tumbler_rpc_requests_total\{method="(\w+)",code="\w+"\} (\d+)/)
        .each_with_object(Hash.new(0)) { |(m, v), h| h[m] += Integer(v) }
  end

  # The lock calls the block made, by method.
  def lock_calls
    before = rpc_counts
    yield
    rpc_counts.to_h { |m, v| [m, v - before[m]] }.reject { |_, v| v.zero? }
  end

  def bulk(queue, args, **options)
    Sidekiq::Client.push_bulk({ 'class' => UntilExecutedJob, 'queue' => queue, 'args' => args }
                                .merge(options.transform_keys(&:to_s)))
  end

  def test_push_bulk_takes_every_lock_in_one_request_drops_duplicates_and_runs_each_once
    tag = new_tag('bulk')
    queue = "q-#{tag}"
    queued = UntilExecutedJob.set(queue: queue).perform_async(tag, 'w0')
    args = (1..30).map { |i| [tag, "w#{i}"] }
    args.insert(5, [tag, 'w3']) # a duplicate of an earlier job of the bulk
    args.insert(12, [tag, 'w0']) # a duplicate of the queued job
    args << [tag, 'w30'] # and of the last one
    jids = nil
    calls = lock_calls { jids = bulk(queue, args) }
    assert_equal({ 'Batch' => 1 }, calls, 'every push-time lock in one request')
    assert_equal 30, jids.size, 'the duplicates are not pushed, their jids not returned'
    assert_equal [queued, *jids].sort, queue_jids(queue).sort
    # Each lock's holder is its job's jid; of two in one bulk, the first's.
    unique = (1..30).map { |i| [tag, "w#{i}"] }
    unique.zip(jids) do |a, jid|
      assert_equal [jid], holders(digest_for(UntilExecutedJob, queue, a)).map(&:holder), a.inspect
    end
    assert_equal [queued], holders(digest_for(UntilExecutedJob, queue, [tag, 'w0'])).map(&:holder)

    sidekiq(queue)
    wait_until("31 jobs to end (#{ends(tag).size})", timeout: 60) { ends(tag).size == 31 }
    started = starts(tag).map { |e| e['jid'] }
    assert_equal [queued, *jids].sort, started.sort, 'each pushed job ran exactly once'
    # The run took its grant over (holder "<jid>:<run>", a token of its own) and gave it back.
    starts(tag).each { |e| assert_equal e['jid'], job_of(e['holder']), e.inspect }
    wait_until('every lock given back') do
      (unique + [[tag, 'w0']]).all? { |a| holders(digest_for(UntilExecutedJob, queue, a)).empty? }
    end
    sleep 0.5
    assert_equal 31, starts(tag).size, 'and nothing ran twice'
  end

  def test_push_bulk_meets_each_conflict_strategy_as_a_single_push
    # :reject: the duplicate of the queued job goes to the dead set; the others are pushed.
    tag = new_tag('bulk-reject')
    queue = "q-#{tag}"
    first = UntilExecutedJob.set(queue: queue).perform_async(tag, 'gate')
    jids = bulk(queue, [[tag, 'a'], [tag, 'gate'], [tag, 'b']], on_conflict: 'reject')
    assert_equal 2, jids.size
    assert_equal [first, *jids].sort, queue_jids(queue).sort
    assert_equal 1, Sidekiq::DeadSet.new.count { |j| j.args == [tag, 'gate'] }

    # :replace: the queued holder is replaced; of two in the bulk, the first wins.
    tag = new_tag('bulk-replace')
    queue = "q-#{tag}"
    old = UntilExecutedJob.set(queue: queue).perform_async(tag, 'gate')
    log = capture_log { jids = bulk(queue, [[tag, 'gate'], [tag, 'x'], [tag, 'x']], on_conflict: 'replace') }
    assert_equal 2, jids.size, log
    assert_equal jids.sort, queue_jids(queue).sort, 'the old job is gone'
    refute_includes queue_jids(queue), old
    assert_equal [jids[0]], holders(digest_for(UntilExecutedJob, queue, [tag, 'gate'])).map(&:holder)
    assert_equal [jids[1]], holders(digest_for(UntilExecutedJob, queue, [tag, 'x'])).map(&:holder)
    assert_match(/of the same push_bulk holds it/, log)

    # :reschedule: the duplicate goes into the schedule, without a lock, beside the pushed ones.
    tag = new_tag('bulk-reschedule')
    queue = "q-#{tag}"
    first = UntilExecutedJob.set(queue: queue).perform_async(tag, 'gate')
    jids = bulk(queue, [[tag, 'gate'], [tag, 'y']], on_conflict: 'reschedule')
    assert_equal 2, jids.size
    assert Sidekiq::ScheduledSet.new.find_job(jids[0]), 'the duplicate is in the schedule'
    assert_equal [first, jids[1]].sort, queue_jids(queue).sort
    assert_equal [first], holders(digest_for(UntilExecutedJob, queue, [tag, 'gate'])).map(&:holder)

    # :raise: Conflict, nothing of the bulk pushed, and the locks it took given back.
    tag = new_tag('bulk-raise')
    queue = "q-#{tag}"
    first = UntilExecutedJob.set(queue: queue).perform_async(tag, 'gate')
    err = assert_raises(Tumbler::Sidekiq::Conflict) { bulk(queue, [[tag, 'p'], [tag, 'gate'], [tag, 'q']], on_conflict: 'raise') }
    assert_equal :client, err.side
    assert_equal [first], queue_jids(queue)
    assert_equal [], holders(digest_for(UntilExecutedJob, queue, [tag, 'p']))
    assert_equal [], holders(digest_for(UntilExecutedJob, queue, [tag, 'q']))

    # Default (log): dropped and logged.
    tag = new_tag('bulk-log')
    queue = "q-#{tag}"
    first = UntilExecutedJob.set(queue: queue).perform_async(tag, 'gate')
    log = capture_log { jids = bulk(queue, [[tag, 'gate'], [tag, 'z']]) }
    assert_equal 1, jids.size
    assert_equal [first, jids[0]].sort, queue_jids(queue).sort
    assert_match(/skipping job \h+ \(UntilExecutedJob\) on client/, log)
  end

  def test_a_single_push_inside_is_untouched_and_plain_jobs_pass
    tag = new_tag('bulk-plain')
    queue = "q-#{tag}"
    jids = nil
    calls = lock_calls do
      jids = Sidekiq::Client.push_bulk('class' => PlainJob, 'queue' => queue, 'args' => [[tag], [tag], [tag]])
    end
    assert_equal({}, calls, 'no lock calls for jobs without a lock')
    assert_equal 3, jids.size
    # Scheduled jobs (perform_in's bulk: 'at') are locked together as well.
    at = Time.now.to_f + 300
    calls = lock_calls do
      jids = Sidekiq::Client.push_bulk('class' => UntilExecutedJob, 'queue' => queue, 'at' => at,
                                       'args' => [[tag, 's1'], [tag, 's2'], [tag, 's1']])
    end
    assert_equal({ 'Batch' => 1 }, calls)
    assert_equal 2, jids.size
    jids.each { |j| assert Sidekiq::ScheduledSet.new.find_job(j) }
    lease = tumbler.inspect_lock(digest_for(UntilExecutedJob, queue, [tag, 's1'])).holders.first.grant
    assert_operator lease.ttl_ms, :>=, 300_000, 'the queued lease covers the time until it is due'
    # perform_bulk (Sidekiq's, in push_bulks of 1,000) the same way.
    calls = lock_calls { jids = UntilExecutedJob.set(queue: queue).perform_bulk([[tag, 'p1'], [tag, 'p1'], [tag, 'p2']]) }
    assert_equal({ 'Batch' => 1 }, calls)
    assert_equal 2, jids.size
    assert_equal [jids[0]], holders(digest_for(UntilExecutedJob, queue, [tag, 'p1'])).map(&:holder)
    # A single push after a bulk takes its own lock, as always.
    calls = lock_calls { assert UntilExecutedJob.set(queue: queue).perform_async(tag, 'single') }
    assert_equal({ 'Acquire' => 1 }, calls)
  end

  # A push_bulk above 256 jobs against a token with a request rate: its
  # first request (256 items, each one call) is granted, the next refused
  # whole (RESOURCE_EXHAUSTED); the bulk raises that and pushes nothing,
  # and the grants the first request took are given back although the
  # budget is spent (the give-back goes again, in smaller requests, as it
  # refills): no lock is left without its job, and the jobs can be pushed
  # again at once.
  def test_a_rate_limited_multi_request_bulk_gives_back_what_it_took
    redis_pid, redis_port = TumblerTest.start_redis
    limited = "tmb_#{SecureRandom.hex(32)}"
    checker = "tmb_#{SecureRandom.hex(32)}"
    dir = Dir.mktmpdir('tumbler-bulk-rate')
    tokens = File.join(dir, 'tokens.toml')
    File.write(tokens, <<~TOML)
      [[token]]
      name = "bulk-rate"
      sha256 = "#{Digest::SHA256.hexdigest(limited)}"
      role = "client"
      namespaces = ["*"]
      requests_per_second = 300

      [[token]]
      name = "checker"
      sha256 = "#{Digest::SHA256.hexdigest(checker)}"
      role = "client"
      namespaces = ["*"]
    TOML
    port = TumblerTest.free_port
    pid, log = TumblerTest.spawn_logged("tumbler-rate-#{port}", {}, TumblerTest.tumbler_bin, 'serve', '--listen',
                                        "127.0.0.1:#{port}", '--http-listen', 'off', '--auth-tokens-file', tokens,
                                        '--shutdown-drain-ms', '0', '--redis-url', "redis://127.0.0.1:#{redis_port}")
    TumblerTest.wait_listening(pid, port, 'tumbler serve', log)
    Tumbler::Sidekiq.configure(address: "127.0.0.1:#{port}", token: limited, rpc_timeout: 10.0, install: false)
    check = Tumbler::Client.new("127.0.0.1:#{port}", namespace: SidekiqHarness::NAMESPACE, token: checker)
    held = -> { check.call(:list) { Tumbler::V1::ListRequest.new(namespace: SidekiqHarness::NAMESPACE, page_size: 1000) }.locks.size }
    tag = new_tag('bulk-rate')
    queue = "q-#{tag}"
    args = (1..400).map { |i| [tag, "r#{i}"] }
    log_text = nil
    err = nil
    log_text = capture_log { err = assert_raises(Tumbler::Error) { bulk(queue, args) } }
    assert_equal GRPC::Core::StatusCodes::RESOURCE_EXHAUSTED, err.code, err.message
    assert_equal 0, queue_jids(queue).size, 'nothing of the failed bulk was pushed'
    assert_equal 0, held.call, "every grant of the first request was given back (log: #{log_text})"
    refute_match(/could not give back/, log_text)
    # The same jobs go through afterwards, as the budget allows: none is held by a lock left behind.
    sleep 1.2
    jids = bulk(queue, args.first(100))
    assert_equal 100, jids.size, 'a job of the failed bulk can be pushed again'
    assert_equal 100, held.call
  ensure
    Tumbler::Sidekiq.configure(address: ENV.fetch('TUMBLER_ADDR'), token: nil, rpc_timeout: 10.0, install: false)
    check&.close
    TumblerTest.stop(pid)
    TumblerTest.stop(redis_pid)
    FileUtils.rm_rf(dir) if dir
  end

  # Tumbler's Redis stopped: the bulk raises what a single push raises
  # (Tumbler::Unavailable once the client's retries ran out) and pushes
  # nothing: never a job without its lock.
  def test_redis_stopped_the_bulk_fails_as_a_single_push_and_pushes_nothing
    redis_pid, redis_port = TumblerTest.start_redis
    pid, port = TumblerTest.start_tumbler(redis_port, flags: %w[--redis-timeout-ms 300])
    Tumbler::Sidekiq.configure(address: "127.0.0.1:#{port}", rpc_timeout: 1.5, install: false)
    tag = new_tag('bulk-down')
    queue = "q-#{tag}"
    assert_equal 1, bulk(queue, [[tag, 'up']]).size, 'up: pushed'
    TumblerTest.stop(redis_pid)
    # A single push raises Unavailable (or, when the deadline cut its last try, drops the job as a conflict).
    single = begin
      UntilExecutedJob.set(queue: queue).perform_async(tag, 'one')
    rescue Tumbler::Error => e
      e
    end
    assert(single.nil? || single.is_a?(Tumbler::Unavailable), single.inspect)
    err = assert_raises(Tumbler::Error) { bulk(queue, [[tag, 'a'], [tag, 'b'], [tag, 'c']]) }
    assert_instance_of Tumbler::Unavailable, err, err.message
    assert_equal 1, queue_jids(queue).size, 'nothing of the failed bulk was pushed'
  ensure
    Tumbler::Sidekiq.configure(address: ENV.fetch('TUMBLER_ADDR'), rpc_timeout: 10.0, install: false)
    TumblerTest.stop(pid)
    TumblerTest.stop(redis_pid)
  end
end
