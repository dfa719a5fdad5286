# frozen_string_literal: true

require_relative 'test_helper'

# What the seeds cannot give: a killed worker's lock ends with its lease
# and the job runs again; a deploy (SIGTERM) keeps until_executed locks
# while the jobs wait in their queue; a per-digest limit holds under
# pressure; a failed job stays unique until its retry ran.
class SafetyTest < Minitest::Test
  include SidekiqTestHelpers

  def test_sigkill_frees_the_lock_at_the_lease_end_and_the_job_runs_again
    tag = new_tag('crash')
    queue = "q-#{tag}"
    job = UntilExecutedJob.set(queue: queue)
    digest = digest_for(UntilExecutedJob, queue, [tag, 'gate'])
    env = { 'TEST_EXECUTION_TTL' => '2', 'TEST_HEARTBEAT_TTL' => '2' }
    worker = sidekiq(queue, env: env)
    jid = job.perform_async(tag, 'gate')
    wait_until('the job to start') { starts(tag).any? }
    first = starts(tag).first
    held = holders(digest)
    assert_equal [[jid, first['holder'], 2000]], held.map { |g| [job_of(g.holder), g.holder, g.ttl_ms] },
                 'while it runs: the run\'s own 2 s execution lease'
    assert_nil job.perform_async(tag, 'gate'), 'no duplicate while it runs'

    worker.kill # nothing runs in it any more: no release, no renewal
    killed = TumblerTest.mono
    wait_until('the lock to be free', timeout: 6) { holders(digest).empty? }
    freed = TumblerTest.mono - killed
    assert_operator freed, :<=, 2.0 + 1.0, "free within the 2 s lease (took #{freed.round(2)} s; lock_ttl is a day)"
    assert_empty queue_jids(queue), 'the job is not in its queue: it was in the dead worker\'s hands'

    worker.restart
    wait_until('the job to run again after the restart', timeout: 20) { starts(tag).size == 2 }
    again = starts(tag).last
    assert_equal jid, again['jid'], 'the same job'
    refute_equal first['pid'], again['pid']
    refute_equal first['holder'], again['holder'], 'a run of its own'
    assert_operator again['token'].to_i, :>, first['token'].to_i, 'with a newer fencing token than the killed run'
    open_gate(tag)
    wait_until('the job to end') { ends(tag).any? { |e| e['e'] == 'end' } }
    wait_until('the lock released') { holders(digest).empty? }
    assert_equal 2, starts(tag).size
  end

  # The watchdog: a job that runs past its execution lease keeps its lock
  # (renewed every third of the lease), and is never told it lost it.
  def test_a_job_longer_than_its_lease_keeps_its_lock
    tag = new_tag('long')
    queue = "q-#{tag}"
    job = WhileExecutingJob.set(queue: queue)
    run_lock = "#{digest_for(WhileExecutingJob, queue, [tag, 'gate'])}:RUN"
    sidekiq(queue, env: { 'TEST_EXECUTION_TTL' => '1' })
    jid = job.perform_async(tag, 'gate')
    wait_until('the job to start') { starts(tag).any? }
    first_end = holders(run_lock).first.expires_at_ms
    wait_until('Redis time to pass the first lease\'s end by 2 s') { tumbler.inspect_lock(run_lock).now_ms > first_end + 2000 }
    grant = holders(run_lock).first
    assert_equal [jid, starts(tag).first['holder'], starts(tag).first['token']],
                 [job_of(grant.holder), grant.holder, grant.fencing_token.to_s], 'still held, same grant'
    assert_operator grant.expires_at_ms, :>, first_end + 2000, 'renewed'
    open_gate(tag)
    wait_until('the job to end') { ends(tag).any? }
    assert_equal [['end', false]], ends(tag).map { |e| [e['e'], e['lost']] }
    wait_until('the lock released') { holders(run_lock).empty? }
  end

  # A paused worker (SIGSTOP: not dead, just not running) whose job another
  # Sidekiq runs again. Its heartbeat (1 s) lapses well before its run's
  # execution lease (4 s): the other process recovers the job and starts a
  # second run of the same jid while the paused run still holds the lock.
  # The two runs never share a grant: the second waits for the paused run's
  # lease to end, then holds the lock under its own holder with a newer
  # fencing token; the paused run, resumed (SIGCONT), is told it lost the
  # lock (LockLost in the job), and neither it nor the job id can renew or
  # release the newer run's grant.
  def test_a_paused_worker_and_the_run_that_took_its_job_never_share_the_lock
    tag = new_tag('paused')
    queue = "q-#{tag}"
    job = UntilExecutedJob.set(queue: queue)
    digest = digest_for(UntilExecutedJob, queue, [tag, 'gate'])
    env = { 'TEST_EXECUTION_TTL' => '4', 'TEST_HEARTBEAT_TTL' => '1' }
    paused = sidekiq(queue, env: env)
    jid = job.perform_async(tag, 'gate')
    wait_until('the job to start') { starts(tag).any? }
    first = starts(tag).first
    assert_equal [[jid, first['holder'], first['token']]], held_by(digest), 'the first run holds the digest'
    other = sidekiq(queue, env: env)
    wait_until('the second Sidekiq to be ready') { redis.lrange('test:ready', 0, -1).include?(other.pid.to_s) }

    Process.kill('STOP', paused.pid)
    begin
      second = wait_until('the job to start again in the other Sidekiq', timeout: 20) { starts(tag)[1] }
      lease_end = holders(digest).first.expires_at_ms
      assert_equal [jid, other.pid], [second['jid'], second['pid']], 'the same job, run again elsewhere'
      assert_operator second['token'].to_i, :>, first['token'].to_i, 'the second run has a newer fencing token'
      refute_equal first['holder'], second['holder'], 'each run holds with a holder of its own'
      assert_equal [[jid, second['holder'], second['token']]], held_by(digest), 'the second run alone holds it'
      # What the paused run's watchdog and release will send, and the shared
      # holder of old (the jid): each is refused, and changes nothing.
      assert_nil tumbler.extend_grant(digest, holder: first['holder'], ttl_ms: 60_000,
                                              fencing_token: Integer(first['token'])), 'the stale run cannot renew'
      refute tumbler.release(digest, holder: first['holder'], fencing_token: Integer(first['token'])),
             'the stale run cannot release'
      assert_nil tumbler.extend_grant(digest, holder: jid, ttl_ms: 60_000), 'the job id holds nothing while it runs'
      assert_equal [[jid, second['holder'], second['token']]], held_by(digest)
    ensure
      Process.kill('CONT', paused.pid)
    end

    stale = wait_until('the resumed run to learn it lost the lock') { ends(tag).find { |e| e['pid'] == paused.pid } }
    assert_equal %w[fail true], [stale['e'], stale['lost'].to_s], 'LockLost was raised in the stale run'
    assert_empty ends(tag).select { |e| e['pid'] == other.pid }, 'the newer run still runs'
    # The stale run's retry is pushed through the client middleware: refused
    # (the lock is the newer run's), so it neither queues nor runs.
    wait_until('the stale run\'s retry in the retry set') { Sidekiq::RetrySet.new.find_job(jid) }
    wait_until('the stale run\'s retry to be pushed (and refused)') { Sidekiq::RetrySet.new.find_job(jid).nil? }
    assert_empty queue_jids(queue)
    after = holders(digest)
    assert_equal [[jid, second['holder'], second['token']]], held_by(digest), 'the newer run\'s grant is untouched'
    assert_operator after.first.expires_at_ms, :>=, lease_end, 'and still renewed by its watchdog'

    open_gate(tag)
    wait_until('the newer run to end') { ends(tag).any? { |e| e['pid'] == other.pid } }
    assert_equal [%w[end false]], ends(tag).select { |e| e['pid'] == other.pid }.map { |e| [e['e'], e['lost'].to_s] }
    wait_until('the lock released') { holders(digest).empty? }
    assert_equal 2, starts(tag).size, 'two runs, never both holding the lock'
  end

  def test_sigterm_deploy_keeps_until_executed_locks_while_jobs_wait_for_the_restart
    tag = new_tag('deploy')
    queue = "q-#{tag}"
    job = UntilExecutedJob.set(queue: queue)
    digest = digest_for(UntilExecutedJob, queue, [tag, 'gate'])
    worker = sidekiq(queue, timeout: 1)
    jid = job.perform_async(tag, 'gate')
    wait_until('the job to start') { starts(tag).any? }
    token = starts(tag).first['token']

    worker.terminate # Sidekiq waits 1 s (-t 1), then pushes the job back and stops
    assert_equal [jid], queue_jids(queue), 'the job went back to its queue'
    kept = holders(digest)
    assert_equal [jid], kept.map(&:holder), 'its lock was kept, handed back from the run to the job'
    assert_operator kept.first.fencing_token, :>, token.to_i, 'a grant of the job\'s own: the run\'s token is spent'
    assert_equal 86_400_000, kept.first.ttl_ms, 'on the queued lease again (lock_ttl: the maximum), not the 3 s execution lease'
    3.times { assert_nil job.perform_async(tag, 'gate'), 'no duplicate is enqueued while the workers restart' }
    assert_equal [jid], queue_jids(queue)

    worker.restart
    wait_until('the job to run again', timeout: 20) { starts(tag).size == 2 }
    assert_equal [jid, jid], starts(tag).map { |e| e['jid'] }
    assert_operator starts(tag).last['token'].to_i, :>, kept.first.fencing_token,
                    'the new run takes the job\'s grant over as its own, with a newer fencing token'
    open_gate(tag)
    wait_until('the job to end') { ends(tag).any? { |e| e['e'] == 'end' } }
    wait_until('the lock released') { holders(digest).empty? }
    assert_equal 2, starts(tag).size, 'no duplicate ran'
  end

  def test_lock_limit_3_with_10_jobs_never_runs_more_than_3
    tag = new_tag('limit')
    queue = "q-#{tag}"
    job = PerUserJob.set(queue: queue)
    run_digest = "#{digest_for(PerUserJob, queue, [7, 0, tag, 'gate'])}:RUN"
    assert_equal run_digest, "#{digest_for(PerUserJob, queue, [7, 99, 'other', 'args'])}:RUN",
                 'lock_args_method: the digest is the user id alone'
    jids = (1..10).map { |n| job.perform_async(7, n, tag, 'gate') }
    assert_equal 10, jids.compact.size
    sidekiq(queue, concurrency: 10)
    wait_until('3 jobs running and 7 waiting in tumbler\'s queue') do
      starts(tag).size == 3 && waiters(run_digest) == 7
    end
    assert_equal 3, holders(run_digest).size
    open_gate(tag, 10)
    wait_until('all 10 jobs to end', timeout: 30) { ends(tag).size == 10 }
    assert_equal jids.sort, starts(tag).map { |e| e['jid'] }.sort, 'every job ran, once'
    assert_equal 3, max_running(tag), 'never more than 3 at once (counted inside the jobs)'
    assert_equal [1, 2, 3], starts(tag).map { |e| e['slot'] }.uniq.sort, 'slots 1..3'
    tokens = starts(tag).map { |e| e['token'].to_i }
    assert_equal 10, tokens.uniq.size
    wait_until('the runtime lock to be free') { holders(run_digest).empty? }
  end

  def test_a_failed_job_keeps_its_lock_until_its_retry_succeeds
    tag = new_tag('retry')
    queue = "q-#{tag}"
    job = UntilExecutedJob.set(queue: queue)
    digest = digest_for(UntilExecutedJob, queue, [tag, 'fail_once'])
    sidekiq(queue)
    jid = job.perform_async(tag, 'fail_once')
    wait_until('the job to fail into the retry set') { Sidekiq::RetrySet.new.find_job(jid) }
    kept = holders(digest)
    assert_equal [jid], kept.map(&:holder), 'the failed job keeps its lock'
    assert_nil job.perform_async(tag, 'fail_once'), 'no duplicate while the retry waits'
    # "Retry now" (as from the Web UI): Sidekiq pushes it through the client
    # middleware, which finds the job's own grant (ALREADY_HELD) and lets it in.
    Sidekiq::RetrySet.new.find_job(jid).retry
    wait_until('the retry to succeed', timeout: 20) { ends(tag).any? { |e| e['e'] == 'end' } }
    assert_equal [jid, jid], starts(tag).map { |e| e['jid'] }
    wait_until('the lock released') { holders(digest).empty? }
  end
end
