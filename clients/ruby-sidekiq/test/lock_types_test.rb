# frozen_string_literal: true

require_relative 'test_helper'

# The README's table of lock types, row by row, against a real Sidekiq:
# duplicates pushed while the first job waits in its queue and while it
# runs, a Sidekiq with concurrency 5, then how many jobs were enqueued and
# ran, whether any overlapped, and when tumbler shows the lock held or free.
class LockTypesTest < Minitest::Test
  include SidekiqTestHelpers

  # enqueued: of two pushes before any worker runs; dup: a push while the
  # first job runs is accepted; runs: jobs that run in all; overlap: the
  # accepted duplicate runs alongside the first; held: the lock tumbler
  # shows while the first job runs (:until the digest, :run digest:RUN,
  # nil none); own: while it runs, the holder is the run's own
  # ("<jid>:<run id>", not the bare jid); after: the digest once every job ended.
  TABLE = {
    until_executing: { job: UntilExecutingJob, enqueued: 1, dup: true, runs: 2, overlap: true, held: nil, after: :free },
    until_executed: { job: UntilExecutedJob, enqueued: 1, dup: false, runs: 1, overlap: false, held: :until,
                      own: true, after: :free },
    until_expired: { job: UntilExpiredJob, enqueued: 1, dup: false, runs: 1, overlap: false, held: :until,
                     own: false, after: :until_ttl },
    until_and_while_executing: { job: UntilAndWhileExecutingJob, enqueued: 1, dup: true, runs: 2, overlap: false,
                                 held: :run, own: true, after: :free },
    while_executing: { job: WhileExecutingJob, enqueued: 2, dup: true, runs: 3, overlap: false, held: :run,
                       own: true, after: :free }
  }.freeze

  TABLE.each do |type, row|
    define_method("test_#{type}") { check_lock_type(type, row) }
  end

  def check_lock_type(type, row)
    tag = new_tag(type)
    queue = "q-#{tag}"
    job = row[:job].set(queue: queue)
    digest = digest_for(row[:job], queue, [tag, 'gate'])

    # 1. Two pushes before any worker runs.
    jids = 2.times.map { job.perform_async(tag, 'gate') }
    first = jids.first
    assert_equal row[:enqueued], jids.compact.size, "#{type}: jobs enqueued of 2 pushes"
    assert_equal jids.compact.sort, queue_jids(queue).sort
    if row[:held] == :until
      queued = holders(digest)
      assert_equal [first], queued.map(&:holder), "#{type}: the digest is held by the queued job"
      assert_equal type.to_s, queued.first.kind, 'the lock type is the lock kind'
    end

    # 2. A worker (concurrency 5) takes the first job, which holds its gate.
    sidekiq(queue)
    wait_until("#{type}: the first job to start") { starts(tag).any? }
    run = starts(tag).first
    assert_includes jids, run['jid'] # of two while_executing jobs, either may win the runtime lock
    first = run['jid']
    if row[:held]
      assert_equal row[:own], run['holder'] != first,
                   "#{type}: the run's holder (#{run['holder']}) is its own, not the bare jid?"
    end
    case row[:held]
    when :until
      assert_equal [[first, run['holder'], run['token']]], held_by(digest),
                   "#{type}: the job holds the digest while it runs and sees its fencing token"
    when :run
      assert_empty holders(digest), "#{type}: the until-lock is released when the job starts"
      assert_equal [[first, run['holder'], run['token']]], held_by("#{digest}:RUN"),
                   "#{type}: the job holds the runtime lock and sees its fencing token"
    else
      assert_empty holders(digest), "#{type}: released when the job starts"
      assert_nil run['token'], "#{type}: no lock while it runs, no token"
    end

    # 3. A duplicate pushed while the first job runs.
    dup = job.perform_async(tag, 'gate')
    assert_equal row[:dup], !dup.nil?, "#{type}: a duplicate pushed while the first runs is accepted?"
    if row[:overlap]
      wait_until("#{type}: the duplicate to run alongside") { max_running(tag) == 2 }
    elsif row[:held] == :run
      waiting = row[:runs] - 1
      wait_until("#{type}: #{waiting} job(s) waiting in tumbler's queue for the runtime lock") do
        waiters("#{digest}:RUN") == waiting
      end
      assert_equal 1, starts(tag).size, 'nothing else runs while the first job holds the runtime lock'
    end

    # 4. Every gate opens; the jobs end.
    open_gate(tag, row[:runs])
    wait_until("#{type}: #{row[:runs]} jobs to end") { ends(tag).size == row[:runs] }
    assert_equal row[:runs], starts(tag).size, "#{type}: jobs that ran"
    assert_equal row[:runs], starts(tag).map { |e| e['jid'] }.uniq.size, 'each job ran once'
    assert_equal(row[:overlap] ? 2 : 1, max_running(tag), "#{type}: jobs running at once")
    assert(ends(tag).all? { |e| e['e'] == 'end' })

    # 5. The lock afterwards (a push of the same job again: the same digest).
    open_gate(tag) # so that an accepted job does not wait
    case row[:after]
    when :free
      wait_until("#{type}: the digest to be free") { holders(digest).empty? && holders("#{digest}:RUN").empty? }
      assert job.perform_async(tag, 'gate'), "#{type}: a new push is accepted once the lock is free"
    when :until_ttl
      info = tumbler.inspect_lock(digest)
      assert_equal [first], info.holders.map { |h| h.grant.holder }, "#{type}: still held after the job ran"
      lease = info.holders.first
      assert_in_delta 5000, lease.grant.ttl_ms, 1, "#{type}: the lease is lock_ttl, from the push, not renewed"
      if lease.remaining_ms > 500 # the refusal is only certain well inside the lease
        assert_nil job.perform_async(tag, 'gate'), "#{type}: refused until lock_ttl"
      end
      wait_until("#{type}: the lease (lock_ttl 5 s) to end", timeout: 8) { holders(digest).empty? }
      assert job.perform_async(tag, 'gate'), "#{type}: accepted once lock_ttl passed"
    end
  end
end
