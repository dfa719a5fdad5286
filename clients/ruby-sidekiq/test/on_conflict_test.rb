# frozen_string_literal: true

require_relative 'test_helper'

# Each conflict strategy, on the side where it applies: the client side (a
# duplicate pushed while an until_executed job waits or runs) and the
# server side (a while_executing job that finds the runtime lock taken,
# lock_timeout 0), and the hash form with a strategy per side.
class OnConflictTest < Minitest::Test
  include SidekiqTestHelpers

  # --- client side: UntilExecutedJob, the first job waits in its queue

  def pushed_twice(strategy)
    tag = new_tag("client-#{strategy}")
    queue = "q-#{tag}"
    job = UntilExecutedJob.set(queue: queue, on_conflict: strategy)
    first = job.perform_async(tag, 'gate')
    assert first
    [tag, queue, job, first]
  end

  def test_client_log
    tag, queue, job, first = pushed_twice('log')
    log = capture_log { assert_nil job.perform_async(tag, 'gate'), 'the duplicate is dropped' }
    assert_match(/skipping job \h+ \(UntilExecutedJob\) on client: uniquejobs:\h{64} is locked \(until_executed/, log)
    assert_equal [first], queue_jids(queue)
  end

  def test_client_raise
    tag, queue, job, first = pushed_twice(:raise)
    err = assert_raises(Tumbler::Sidekiq::Conflict) { job.perform_async(tag, 'gate') }
    assert_equal :client, err.side
    assert_equal digest_for(UntilExecutedJob, queue, [tag, 'gate']), err.digest
    assert_equal [first], queue_jids(queue)
  end

  def test_client_reject
    tag, queue, job, first = pushed_twice(:reject)
    assert_nil job.perform_async(tag, 'gate')
    assert_equal [first], queue_jids(queue)
    dead = Sidekiq::DeadSet.new.select { |j| j.args == [tag, 'gate'] }
    assert_equal 1, dead.size, 'the duplicate went to the dead set'
    refute_equal first, dead.first.jid
  end

  def test_client_replace
    tag, queue, job, first = pushed_twice(:replace)
    digest = digest_for(UntilExecutedJob, queue, [tag, 'gate'])
    second = job.perform_async(tag, 'gate')
    refute_nil second
    assert_equal [second], queue_jids(queue), 'the queued job was replaced by the new one'
    assert_equal [second], holders(digest).map(&:holder), 'and its lock with the new job'

    # A scheduled job is replaced as well.
    later = UntilExecutedJob.set(queue: queue, on_conflict: :replace).perform_in(300, tag, 'later') # (a Setter keeps the 'at' of perform_in)
    assert Sidekiq::ScheduledSet.new.find_job(later)
    third = job.perform_async(tag, 'later')
    refute_nil third
    assert_nil Sidekiq::ScheduledSet.new.find_job(later), 'the scheduled job is gone'
    assert_equal [third], holders(digest_for(UntilExecutedJob, queue, [tag, 'later'])).map(&:holder)

    # A job that already runs cannot be replaced: the new one is dropped.
    sidekiq(queue)
    wait_until('the queued job to run') { starts(tag).any? }
    assert_nil job.perform_async(tag, 'gate'), 'a running holder is not replaced'
    open_gate(tag, 2)
    wait_until("the jobs to end (#{events(tag)})") { ends(tag).size == 2 }
    assert_equal [second, third].sort, starts(tag).map { |e| e['jid'] }.sort
    refute_includes starts(tag).map { |e| e['jid'] }, first
  end

  def test_client_reschedule
    tag, queue, job, first = pushed_twice(:reschedule)
    sidekiq(queue)
    wait_until('the first job to run') { starts(tag).any? }
    again = job.perform_async(tag, 'gate')
    refute_nil again, 'the duplicate is pushed, into the schedule'
    entry = Sidekiq::ScheduledSet.new.find_job(again)
    assert entry
    assert_in_delta Time.now.to_f + 1, entry.at.to_f, 1.0, 'schedule_in: 1 s from now'
    # While the first job runs, the duplicate keeps coming back to the schedule.
    wait_until('the duplicate to be rescheduled again') do
      (j = Sidekiq::ScheduledSet.new.find_job(again)) && j['tumbler_rescheduled'].to_i >= 2
    end
    open_gate(tag, 2)
    wait_until('the duplicate to run once the first ended', timeout: 20) { ends(tag).size == 2 }
    first_end = ends(tag).find { |e| e['jid'] == first }['t']
    second_start = starts(tag).find { |e| e['jid'] == again }['t']
    assert_operator second_start, :>=, first_end, 'never alongside the first'
  end

  # --- server side: WhileExecutingJob (lock_timeout 0); the first job holds
  # the runtime lock, a duplicate is fetched and finds it taken.

  def server_conflict(strategy)
    tag = new_tag("server-#{strategy}")
    queue = "q-#{tag}"
    job = WhileExecutingJob.set(queue: queue, on_conflict: strategy, lock_timeout: 0, retry: 3)
    sk = sidekiq(queue)
    first = job.perform_async(tag, 'gate')
    wait_until('the first job to run') { starts(tag).any? }
    second = job.perform_async(tag, 'gate')
    [tag, queue, job, first, second, sk]
  end

  def test_server_log
    tag, _queue, _job, first, second, sk = server_conflict(:log)
    wait_until('the conflict in the worker\'s log') { sk.log_text.include?("skipping job #{second}") }
    assert_match(/skipping job #{second} \(WhileExecutingJob\) on server: uniquejobs:\h{64}:RUN is locked \(while_executing, limit 1\)/,
                 sk.log_text)
    open_gate(tag)
    wait_until('the first job to end') { ends(tag).size == 1 }
    assert_equal [first], starts(tag).map { |e| e['jid'] }, 'the duplicate never ran'
    assert_nil Sidekiq::RetrySet.new.find_job(second)
    assert_nil Sidekiq::DeadSet.new.find_job(second)
  end

  def test_server_raise
    tag, _queue, _job, _first, second, = server_conflict(:raise)
    retry_entry = wait_until('the duplicate in the retry set') { Sidekiq::RetrySet.new.find_job(second) }
    assert_equal 'Tumbler::Sidekiq::Conflict', retry_entry['error_class']
    open_gate(tag)
    assert_equal 1, starts(tag).size
  end

  def test_server_reject
    tag, _queue, _job, first, second, = server_conflict(:reject)
    wait_until('the duplicate in the dead set') { Sidekiq::DeadSet.new.find_job(second) }
    open_gate(tag)
    wait_until('the first job to end') { ends(tag).size == 1 }
    assert_equal [first], starts(tag).map { |e| e['jid'] }
  end

  def test_server_reschedule
    tag, _queue, _job, first, second, = server_conflict(:reschedule)
    wait_until('the duplicate in the schedule') { Sidekiq::ScheduledSet.new.find_job(second) }
    open_gate(tag, 2)
    wait_until('the duplicate to run after the first', timeout: 20) { ends(tag).size == 2 }
    first_end = ends(tag).find { |e| e['jid'] == first }['t']
    assert_operator starts(tag).find { |e| e['jid'] == second }['t'], :>=, first_end
    assert_equal 1, max_running(tag)
  end

  # --- the hash form: { client: ..., server: ... }

  def test_hash_form_gives_each_side_its_strategy
    tag = new_tag('hash')
    queue = "q-#{tag}"
    job = UntilAndWhileExecutingJob.set(queue: queue, lock_timeout: 0, retry: 3,
                                        on_conflict: { client: :reject, server: :raise })
    first = job.perform_async(tag, 'gate')
    assert_nil job.perform_async(tag, 'gate'), 'client side: rejected'
    assert_equal 1, Sidekiq::DeadSet.new.count { |j| j.args == [tag, 'gate'] }
    sidekiq(queue)
    wait_until('the first job to run') { starts(tag).any? }
    second = job.perform_async(tag, 'gate') # the until-lock was released at the start
    refute_nil second
    entry = wait_until('server side: the duplicate raised Conflict') { Sidekiq::RetrySet.new.find_job(second) }
    assert_equal 'Tumbler::Sidekiq::Conflict', entry['error_class']
    open_gate(tag)
    wait_until('the first job to end') { ends(tag).size == 1 }
    assert_equal [first], starts(tag).map { |e| e['jid'] }
  end

  def test_invalid_options_are_refused_at_push
    assert_raises(Tumbler::Sidekiq::InvalidOptions) do
      WhileExecutingJob.set(on_conflict: { server: :replace }).perform_async('x', 'none')
    end
    assert_raises(Tumbler::Sidekiq::InvalidOptions) { UntilExecutedJob.set(lock: :until_tomorrow).perform_async('x', 1) }
    assert_raises(Tumbler::Sidekiq::InvalidOptions) { UntilExecutedJob.set(lock_ttl: 'soon').perform_async('x', 1) }
    # A single :replace means :log on the server side, as in sidekiq-unique-jobs.
    opts = Tumbler::Sidekiq::LockOptions.for(UntilExecutedJob, { 'on_conflict' => 'replace', 'args' => [] })
    assert_equal [:replace, :log], [opts.on_client_conflict, opts.on_server_conflict]
  end
end
