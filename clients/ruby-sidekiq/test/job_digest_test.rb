# frozen_string_literal: true

require_relative 'test_helper'

# The job digest form (lock_digest_form: :job), shared with tumbler-celery
# (unique={"digest": "job"}): one logical job, one lock, whichever job system
# enqueues it. The vector is pinned here and in
# clients/python-celery/tests/test_compat_and_digest.py; the cross-system
# test with real Sidekiq and Celery processes is
# clients/python-celery/tests/test_cross_sidekiq.py.
class JobDigestTest < Minitest::Test
  include SidekiqTestHelpers

  Digest = Tumbler::Sidekiq::LockDigest
  PINNED = 'tumbler:job:reports.nightly:73bf39470cd107b5057bd3d406ee5944e57a3acf3cd36f6d145fa6da49f51557'

  class NightlyReportJob
    include Sidekiq::Worker
    sidekiq_options lock: :until_executed, lock_digest_form: :job, lock_job_name: 'reports.nightly',
                    lock_args_method: ->(args) { args[0, 2] }
  end

  class ByClassNameJob
    include Sidekiq::Worker
    sidekiq_options lock: :until_executed, lock_digest_form: 'job'
  end

  def test_the_job_form_is_pinned
    assert_equal PINNED, Digest.job(name: 'reports.nightly',
                                    lock_args: [42, { region: 'Zürich', at: 1.5e20, tags: [:a, nil, true] }])
    assert_equal PINNED, Digest.job(name: 'reports.nightly',
                                    lock_args: [42, { 'tags' => ['a', nil, true], 'at' => 1.5e20, 'region' => 'Zürich' }])
    assert_raises(Tumbler::Sidekiq::InvalidOptions) { Digest.job(name: '', lock_args: []) }
  end

  def test_the_option_picks_the_form_and_leaves_the_default_alone
    item = { 'class' => NightlyReportJob.name, 'queue' => 'default', 'args' => [42, 'eu', 'tag', 'gate'] }
    opts = Tumbler::Sidekiq::LockOptions.for(NightlyReportJob, item)
    assert_equal :job, opts.digest_form
    assert_equal Digest.job(name: 'reports.nightly', lock_args: [42, 'eu']), opts.digest(item)
    assert_equal "tumbler:job:reports.nightly:#{::Digest::SHA256.hexdigest('[42,"eu"]')}", opts.digest(item)

    by_class = { 'class' => ByClassNameJob.name, 'queue' => 'q', 'args' => [1] }
    assert_equal Digest.job(name: ByClassNameJob.name, lock_args: [1]),
                 Tumbler::Sidekiq::LockOptions.for(ByClassNameJob, by_class).digest(by_class)

    plain = { 'class' => 'UntilExecutedJob', 'queue' => 'default', 'args' => [42, 'eu'] }
    default = Tumbler::Sidekiq::LockOptions.for(UntilExecutedJob, plain)
    assert_equal :default, default.digest_form
    assert_equal Digest.call(class_name: 'UntilExecutedJob', queue: 'default', lock_args: [42, 'eu'],
                             prefix: 'uniquejobs'), default.digest(plain), 'no option: the digest as before'

    bad = plain.merge('lock_digest_form' => 'md5')
    assert_raises(Tumbler::Sidekiq::InvalidOptions) { Tumbler::Sidekiq::LockOptions.for(UntilExecutedJob, bad) }
  end

  # A real push takes the job-form lock in tumbler under the jid; a second
  # push of the same logical job (other non-lock arguments) is refused.
  def test_a_push_holds_the_job_form_lock
    queue = new_tag('parked') # no Sidekiq reads it
    tag = new_tag('job-form')
    jid = NightlyReportJob.set(queue: queue).perform_async(4242, 'eu', tag, 'gate')
    name = Digest.job(name: 'reports.nightly', lock_args: [4242, 'eu'])
    assert_equal [jid], holders(name).map(&:holder)
    assert_nil NightlyReportJob.set(queue: queue).perform_async(4242, 'eu', "#{tag}-2", 'gate'), 'dropped (log)'
  ensure
    tumbler.release(name, holder: jid) if jid
    Sidekiq::Queue.new(queue).clear if queue
  end
end
