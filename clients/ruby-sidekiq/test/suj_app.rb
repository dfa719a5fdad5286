# frozen_string_literal: true

# A Sidekiq app written for sidekiq-unique-jobs, its initializer as that
# gem's README has it. The one change: the require line. (The tumbler
# address comes from TUMBLER_ADDR.)
require 'sidekiq'
require 'tumbler/sidekiq_unique_jobs' # was: require 'sidekiq_unique_jobs'

Redis.silence_deprecations = true if Redis.respond_to?(:silence_deprecations=)

Sidekiq.configure_client do |config|
  config.redis = { url: ENV.fetch('REDIS_URL') }
  config.client_middleware do |chain|
    chain.add SidekiqUniqueJobs::Middleware::Client
  end
end

Sidekiq.configure_server do |config|
  config.redis = { url: ENV.fetch('REDIS_URL') }
  config.client_middleware do |chain|
    chain.add SidekiqUniqueJobs::Middleware::Client
  end

  config.server_middleware do |chain|
    chain.add SidekiqUniqueJobs::Middleware::Server
  end

  SidekiqUniqueJobs::Server.configure(config)
end

SidekiqUniqueJobs.configure do |config|
  config.lock_ttl = 600
  config.reaper = :ruby # the old gem's reaper: nothing to do on tumbler
end

class SujReportJob
  include Sidekiq::Worker

  sidekiq_options lock: :until_executed, on_conflict: :log

  def perform(tag)
    Sidekiq.redis do |r|
      r.rpush("ev:#{tag}", JSON.generate(e: 'start', jid: jid, token: tumbler_fencing_token.to_s))
      r.blpop("gate:#{tag}", timeout: 60)
      r.rpush("ev:#{tag}", JSON.generate(e: 'end', jid: jid))
    end
  end
end
