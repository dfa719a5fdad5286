# frozen_string_literal: true

require_relative 'test_helper'

# The migration promise: an app written for sidekiq-unique-jobs (its
# initializer untouched, test/suj_app.rb) runs on tumbler once its require
# line changes and TUMBLER_ADDR names a tumbler.
class MigrationTest < Minitest::Test
  include SidekiqTestHelpers

  SUJ_APP = File.expand_path('suj_app.rb', __dir__)

  # Pushes from a separate client process of the app; returns the jids.
  def push_from_app(tag, queue, times)
    script = "puts JSON.generate(#{times}.times.map { SujReportJob.set(queue: #{queue.inspect}).perform_async(#{tag.inspect}) })"
    out = IO.popen([RbConfig.ruby, '-rjson', '-r', SUJ_APP, '-e', script], err: %i[child out], &:read)
    assert $?.success?, out
    JSON.parse(out.lines.last)
  end

  def test_a_sidekiq_unique_jobs_app_runs_on_tumbler_by_changing_its_require
    tag = new_tag('suj')
    queue = "q-#{tag}"
    digest = Tumbler::Sidekiq::LockDigest.call(class_name: 'SujReportJob', queue: queue, lock_args: [tag],
                                               prefix: 'uniquejobs')
    jids = push_from_app(tag, queue, 2)
    assert_equal 1, jids.compact.size, 'until_executed: the duplicate was dropped (on_conflict: :log)'
    held = holders(digest)
    assert_equal [[jids.first, 600_000, 'until_executed']], held.map { |g| [g.holder, g.ttl_ms, g.kind] },
                 'SidekiqUniqueJobs.configure { lock_ttl = 600 } is the queued lease'

    sidekiq(queue, app: SUJ_APP) # `sidekiq -r test/suj_app.rb`
    wait_until('the job to run') { starts(tag).any? }
    assert_equal holders(digest).first.fencing_token.to_s, starts(tag).first['token'], 'the job sees its token'
    assert_equal [nil], push_from_app(tag, queue, 1), 'still unique while it runs'
    open_gate(tag)
    wait_until('the lock released after the job') { ends(tag).any? && holders(digest).empty? }
  end
end
