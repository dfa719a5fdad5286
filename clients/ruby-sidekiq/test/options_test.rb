# frozen_string_literal: true

require_relative 'test_helper'

# The digest (a pinned vector: it must never change), Sidekiq Enterprise's
# unique_for / unique_until, and the lock type as tumbler's metrics kind.
class OptionsTest < Minitest::Test
  include SidekiqTestHelpers

  Digest = Tumbler::Sidekiq::LockDigest

  def test_the_digest_is_pinned
    json = '{"class":"ReportJob","lock_args":[42,{"a":"Zürich","b":2}],"queue":"default"}'
    assert_equal json, Digest.canonical_json({ 'queue' => 'default', 'class' => 'ReportJob',
                                               'lock_args' => [42, { b: 2, a: 'Zürich' }] })
    expected = 'uniquejobs:de5dd4c07a6e1acbda1f297d76bfb1170fb85a2f3241110765e02a13bf398ea4'
    assert_equal expected, "uniquejobs:#{::Digest::SHA256.hexdigest(json)}"
    # Key order, symbols and strings do not matter; the values do.
    assert_equal expected, Digest.call(class_name: 'ReportJob', queue: 'default', prefix: 'uniquejobs',
                                       lock_args: [42, { b: 2, a: 'Zürich' }])
    assert_equal expected, Digest.call(class_name: :ReportJob, queue: :default, prefix: 'uniquejobs',
                                       lock_args: [42, { 'a' => 'Zürich', 'b' => 2 }])
    refute_equal expected, Digest.call(class_name: 'ReportJob', queue: 'default', prefix: 'uniquejobs',
                                       lock_args: [43, { 'a' => 'Zürich', 'b' => 2 }])
    assert_equal 'uniquejobs:ae71331ab447756caaadfa60a4bc023e734033108004b6f0f1a88c1edbedecd7',
                 Digest.call(class_name: 'ReportJob', queue: 'default', lock_args: [1.5, nil, true, 'x'],
                             prefix: 'uniquejobs')
  end

  # Arguments with no object in them skip the canonical round trip (their
  # JSON is already canonical): the same digest either way.
  def test_plain_arguments_give_the_canonical_digest
    canonical = ->(v) { JSON.generate(Digest.canonical(JSON.parse(JSON.generate([v]))[0])) }
    [[42, 'x', 1.5, nil, true, false, :sym], [], [[1, ['é', 2**70]], -0.0, 1.0e-7, 0.1 + 0.2, "\u2028\"\\"],
     [1, { 'b' => 1, 'a' => 2 }], [{ a: 1 }]].each do |args|
      fields = { 'lock_args' => args, 'queue' => 'q', 'class' => 'C' }
      assert_equal "p:#{::Digest::SHA256.hexdigest(canonical.(fields))}",
                   Digest.call(class_name: 'C', queue: 'q', lock_args: args, prefix: 'p'), args.inspect
      assert_equal canonical.(args), Digest.canonical_json(args), args.inspect
    end
  end

  class ChangingOptionsJob
    include Sidekiq::Worker
    sidekiq_options lock: :until_executed
  end

  # A class's options are read once per change, not once per job: a
  # sidekiq_options call later is seen by the next job.
  def test_changed_class_options_are_seen
    item = { 'class' => ChangingOptionsJob.name, 'args' => [] }
    assert_equal :until_executed, Tumbler::Sidekiq::LockOptions.for(ChangingOptionsJob, item).type
    assert_equal :until_executed, Tumbler::Sidekiq::LockOptions.for(ChangingOptionsJob, item).type
    ChangingOptionsJob.sidekiq_options lock: :while_executing, lock_limit: 3
    opts = Tumbler::Sidekiq::LockOptions.for(ChangingOptionsJob, item)
    assert_equal [:while_executing, 3], [opts.type, opts.limit]
  end

  def test_the_digest_options
    item = { 'class' => 'PerUserJob', 'queue' => 'default', 'args' => [7, 1, 't', 'gate'] }
    opts = Tumbler::Sidekiq::LockOptions.for(PerUserJob, item)
    assert_equal Digest.call(class_name: 'PerUserJob', queue: 'default', lock_args: [7], prefix: 'uniquejobs'),
                 opts.digest(item), 'lock_args_method picks the arguments'
    across = item.merge('unique_across_queues' => true, 'lock_prefix' => 'billing')
    assert_equal Digest.call(class_name: 'PerUserJob', queue: 'elsewhere', lock_args: [7], prefix: 'billing',
                             across_queues: true),
                 Tumbler::Sidekiq::LockOptions.for(PerUserJob, across.merge('queue' => 'elsewhere')).digest(across)
    assert_match(/\Abilling:\h{64}\z/, opts.class.for(PerUserJob, across).digest(across))
    assert_nil Tumbler::Sidekiq::LockOptions.for(PlainJob, { 'args' => [] }), 'no lock: not unique'
  end

  class TtlByMethodJob
    include Sidekiq::Worker
    sidekiq_options lock: :until_executed, lock_ttl: :ttl_for
    def self.ttl_for(args) = args.first * 2
  end

  class TtlByProcJob
    include Sidekiq::Worker
    sidekiq_options lock: :until_expired, lock_ttl: ->(_args) { 7.minutes }
  end

  # lock_ttl as a class method's name or a Proc (called with the arguments),
  # read from the class on both sides: in the job hash it went through JSON.
  def test_callable_lock_ttl
    opts = Tumbler::Sidekiq::LockOptions.for(TtlByMethodJob, { 'lock_ttl' => 'ttl_for', 'args' => [21] })
    assert_equal 42.0, opts.ttl
    opts = Tumbler::Sidekiq::LockOptions.for(TtlByProcJob, { 'lock_ttl' => '#<Proc:0x0001>', 'args' => [] })
    assert_equal 420.0, opts.ttl
    item = { 'lock_ttl' => TtlByProcJob.get_sidekiq_options['lock_ttl'], 'unique_for' => 2.minutes,
             'lock_args_method' => ->(a) { a } }
    Tumbler::Sidekiq::Middleware.sanitize(item)
    assert_equal({ 'unique_for' => 120 }, item, 'what cannot go through JSON stays in the class')
  end

  # The digest the client computed travels in the job; the worker process
  # (another Ruby process) locks the same name.
  def test_the_worker_process_locks_the_digest_the_client_computed
    tag = new_tag('digest')
    queue = "q-#{tag}"
    jid = WhileExecutingJob.set(queue: queue).perform_async(tag, 'gate')
    payload = JSON.parse(redis.lrange("queue:#{queue}", 0, -1).first)
    assert_equal digest_for(WhileExecutingJob, queue, [tag, 'gate']), payload['lock_digest']
    sidekiq(queue)
    wait_until('the job to run') { starts(tag).any? }
    assert_equal [jid], holders("#{payload['lock_digest']}:RUN").map { |g| job_of(g.holder) }
    open_gate(tag)
  end

  def test_enterprise_unique_until_start
    tag = new_tag('ent-start')
    queue = "q-#{tag}"
    job = EnterpriseStartJob.set(queue: queue)
    digest = digest_for(EnterpriseStartJob, queue, [tag, 'gate'])
    first = job.perform_async(tag, 'gate')
    assert_nil job.perform_async(tag, 'gate'), 'unique_for: a duplicate within the window is dropped'
    grant = holders(digest).first
    assert_equal [first, 30_000, 'until_executing'], [grant.holder, grant.ttl_ms, grant.kind],
                 'unique_for: 30 is the lease; unique_until: :start is until_executing'
    sidekiq(queue)
    wait_until('the job to start') { starts(tag).any? }
    wait_until('released at the start') { holders(digest).empty? }
    assert job.perform_async(tag, 'gate'), 'accepted again once the job started'
    open_gate(tag, 2)
  end

  def test_enterprise_unique_until_success_with_a_duration
    tag = new_tag('ent-success')
    queue = "q-#{tag}"
    job = EnterpriseSuccessJob.set(queue: queue)
    digest = digest_for(EnterpriseSuccessJob, queue, [tag, 'gate'])
    first = job.perform_async(tag, 'gate')
    assert_nil job.perform_async(tag, 'gate')
    grant = holders(digest).first
    assert_equal [first, 60_000, 'until_executed'], [grant.holder, grant.ttl_ms, grant.kind],
                 'unique_for: 1.minute; unique_until: :success is until_executed'
    payload = JSON.parse(redis.lrange("queue:#{queue}", 0, -1).first)
    assert_equal 60, payload['unique_for'], 'the duration travels as seconds'
    sidekiq(queue)
    wait_until('the job to start') { starts(tag).any? }
    assert_nil job.perform_async(tag, 'gate'), 'still unique while it runs'
    open_gate(tag)
    wait_until('released on success') { holders(digest).empty? }
    assert job.perform_async(tag, 'gate')
    open_gate(tag)
  end

  # The per-minute metrics table per lock type, like sidekiq-unique-jobs
  # v9's Locks tab: tumbler's Metrics RPC, by kind.
  def test_the_lock_type_is_the_metrics_kind
    tag = new_tag('metrics')
    queue = "q-#{tag}"
    job = UntilExecutedJob.set(queue: queue)
    assert job.perform_async(tag, 'none')
    assert_nil job.perform_async(tag, 'none')
    rows = tumbler.stub.metrics(Tumbler::V1::MetricsRequest.new(namespace: SidekiqHarness::NAMESPACE,
                                                                kind: 'until_executed')).totals
    row = rows.find { |r| r.kind == 'until_executed' }
    assert row, "a row for until_executed in #{rows.map(&:kind)}"
    assert_operator row.acquired, :>=, 1
    assert_operator row.denied, :>=, 1
  end
end
