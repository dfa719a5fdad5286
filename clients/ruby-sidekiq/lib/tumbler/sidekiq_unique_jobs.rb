# frozen_string_literal: true

# require 'tumbler/sidekiq_unique_jobs' in place of require 'sidekiq_unique_jobs':
# the names a sidekiq-unique-jobs initializer uses, on tumbler-sidekiq, so the
# initializer stays as it is:
#
#   Sidekiq.configure_client do |config|
#     config.client_middleware { |chain| chain.add SidekiqUniqueJobs::Middleware::Client }
#   end
#   Sidekiq.configure_server do |config|
#     config.client_middleware { |chain| chain.add SidekiqUniqueJobs::Middleware::Client }
#     config.server_middleware { |chain| chain.add SidekiqUniqueJobs::Middleware::Server }
#     SidekiqUniqueJobs::Server.configure(config)
#   end
#   SidekiqUniqueJobs.configure { |c| c.lock_ttl = 3600 }   # optional, as before
#
# The tumbler address comes from TUMBLER_ADDR (or
# SidekiqUniqueJobs.configure { |c| c.address = 'tumbler:50051' }).
require 'tumbler/sidekiq'

if defined?(SidekiqUniqueJobs::VERSION)
  raise LoadError, 'tumbler/sidekiq_unique_jobs replaces the sidekiq-unique-jobs gem: remove it from the Gemfile'
end

module SidekiqUniqueJobs
  VERSION_TUMBLER = Tumbler::Sidekiq::VERSION

  Conflict = Tumbler::Sidekiq::Conflict

  module Middleware
    Client = Tumbler::Sidekiq::Middleware::Client
    Server = Tumbler::Sidekiq::Middleware::Server
  end

  # SidekiqUniqueJobs::Server.configure(config): the death handler (a dead
  # job gives its lock back) and ReliableFetch (unless turned off with
  # SidekiqUniqueJobs.config.reliable_fetch = false, or another fetch is set).
  module Server
    def self.configure(sidekiq)
      Tumbler::Sidekiq.reset_client!
      sidekiq.death_handlers << Tumbler::Sidekiq.method(:on_death)
      sidekiq.on(:startup) { Tumbler::Sidekiq.send(:install_fetch, sidekiq) if Tumbler::Sidekiq.config.reliable_fetch }
    end
  end

  # SidekiqUniqueJobs.configure { |c| ... } and SidekiqUniqueJobs.config:
  # tumbler-sidekiq's settings (lock_ttl, lock_timeout, lock_prefix,
  # on_conflict, enabled, logger, and tumbler's address, namespace, token).
  # Settings of the old gem that mean nothing here (the reaper, the digest
  # algorithm, lock_info) are accepted and ignored.
  IGNORED = %i[reaper reaper_count reaper_interval reaper_timeout digest_algorithm lock_info debug_lua
               max_history].freeze

  class << self
    def config = Tumbler::Sidekiq.config

    def configure(options = {})
      options.each { |k, v| assign(k, v) }
      yield Settings.new if block_given?
      Tumbler::Sidekiq.reset_client!
      config
    end

    def enabled? = config.enabled

    def use_config(tmp)
      old = tmp.keys.to_h { |k| [k, config.public_send(k)] }
      tmp.each { |k, v| assign(k, v) }
      yield
    ensure
      old&.each { |k, v| assign(k, v) }
    end

    def assign(key, value)
      return if IGNORED.include?(key.to_sym)

      config.public_send("#{key}=", value)
    end
  end

  # What SidekiqUniqueJobs.configure yields: setters on tumbler-sidekiq's
  # config, the old gem's extra settings swallowed.
  class Settings
    def method_missing(name, *args)
      key = name.to_s.delete_suffix('=').to_sym
      return super unless name.end_with?('=') || SidekiqUniqueJobs.config.respond_to?(name)
      return nil if IGNORED.include?(key)
      return SidekiqUniqueJobs.config.public_send(name) unless name.end_with?('=')

      SidekiqUniqueJobs.assign(key, args.first)
    end

    def respond_to_missing?(name, include_private = false)
      name.end_with?('=') || SidekiqUniqueJobs.config.respond_to?(name) || super
    end
  end
end
