# frozen_string_literal: true

# The Sidekiq side of the cross-system test (test_cross_sidekiq.py): `sidekiq -r tests/sidekiq_app.rb -q cross`
# runs it; tests/sidekiq_pusher.rb requires it to push jobs as a client. CrossReportJob is the logical job
# "reports.nightly" that tasks.py's nightly_report is on the Celery side: the job digest form
# (lock_digest_form: :job), with the lock arguments [account_id, region].
require 'json'
require 'tumbler/sidekiq'

Redis.silence_deprecations = true if Redis.respond_to?(:silence_deprecations=) # Sidekiq 6.4's sadd on redis-rb 4.8

SIDEKIQ_REDIS_URL = "#{ENV.fetch('TEST_REDIS_URL')}/1"
REPORTS_URL = "#{ENV.fetch('TEST_REDIS_URL')}/4" # where the Celery tasks report too

def reports = Redis.new(url: REPORTS_URL)

Sidekiq.configure_client { |c| c.redis = { url: SIDEKIQ_REDIS_URL, size: 2 } }
Sidekiq.configure_server do |c|
  c.redis = { url: SIDEKIQ_REDIS_URL }
  c.on(:startup) { reports.tap { |r| r.rpush('test:sidekiq-ready', Process.pid) }.close }
end
Tumbler::Sidekiq.configure(
  address: ENV.fetch('TUMBLER_ADDR'),
  namespace: ENV.fetch('TUMBLER_NAMESPACE'), # the Celery app's namespace: one lock for both
  execution_ttl: Float(ENV.fetch('TEST_EXECUTION_TTL', '2')),
  heartbeat_ttl: 2, recover_interval: 0.5
)

class CrossReportJob
  include Sidekiq::Worker
  sidekiq_options queue: 'cross', lock: :until_executed, lock_digest_form: :job, lock_job_name: 'reports.nightly',
                  lock_args_method: ->(args) { args[0, 2] }, on_conflict: :log, retry: false

  # Reports its start (holder, token) to ev:<tag>, waits for a token on gate:<tag> (hold 'gate') or
  # sleeps hold seconds, reports its end.
  def perform(account_id, region, tag, hold)
    r = reports
    lock = tumbler_lock
    r.rpush("ev:#{tag}", JSON.generate(e: 'start', side: 'sidekiq', id: jid, pid: Process.pid, holder: lock&.holder,
                                       token: lock&.fencing_token, account_id: account_id, region: region))
    hold == 'gate' ? r.blpop("gate:#{tag}", timeout: 30) : sleep(hold.to_f)
    r.rpush("ev:#{tag}", JSON.generate(e: 'end', side: 'sidekiq', id: jid, lost: lock&.lost?))
  ensure
    r&.close
  end
end
