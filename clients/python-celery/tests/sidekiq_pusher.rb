# frozen_string_literal: true

# Pushes CrossReportJob as a Sidekiq client, one job per line of standard input ({"args": [...],
# "on_conflict": "raise"} or without it), and answers each with one line, after "@@ ": {"jid": "..."} (pushed), {"jid": null}
# (dropped: the lock is held) or {"error": "<class>", "message": "..."}.
require_relative 'sidekiq_app'

$stdout.sync = true
Sidekiq.logger = Sidekiq::Logger.new($stderr) # conflicts are logged: not into the answers
def answer(obj) = puts("@@ #{JSON.generate(obj)}")
answer(ready: Process.pid)
$stdin.each_line do |line|
  req = JSON.parse(line)
  job = req['on_conflict'] ? CrossReportJob.set(on_conflict: req['on_conflict']) : CrossReportJob
  begin
    answer(jid: job.perform_async(*req['args']))
  rescue StandardError => e
    answer(error: e.class.name, message: e.message)
  end
end
