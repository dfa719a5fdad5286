# frozen_string_literal: true

# require 'tumbler/sidekiq' — unique Sidekiq jobs on the tumbler lock service,
# with sidekiq-unique-jobs' options (lock:, on_conflict:, lock_ttl:,
# lock_timeout:, lock_limit:, lock_args_method:, lock_prefix:) and Sidekiq
# Enterprise's unique_for: / unique_until:.
#
#   Tumbler::Sidekiq.configure(address: 'tumbler:50051')
#
# installs the client middleware (clients and servers), the server
# middleware, a death handler and ReliableFetch (servers).
require 'sidekiq'
require 'tumbler'
require 'tumbler/sidekiq/version'
require 'tumbler/sidekiq/config'
require 'tumbler/sidekiq/lock_digest'
require 'tumbler/sidekiq/lock_options'
require 'tumbler/sidekiq/keeper'
require 'tumbler/sidekiq/starts'
require 'tumbler/sidekiq/job_lock'
require 'tumbler/sidekiq/middleware'
require 'tumbler/sidekiq/bulk'
require 'tumbler/sidekiq/reliable_fetch'

module Tumbler
  module Sidekiq
    # A duplicate met on_conflict: :raise (perform_async raises it on the
    # client side; on the server side the job fails and Sidekiq retries it).
    class Conflict < Tumbler::Error
      attr_reader :job, :digest, :side

      def initialize(job, digest, side)
        @job = job
        @digest = digest
        @side = side
        super("#{job['class']} #{job['jid']}: #{digest} is locked (#{job['lock'] || 'unique'}, #{side})")
      end
    end

    # Lock options that cannot work (an unknown lock type or strategy, a
    # non-numeric lock_ttl, ...): raised when the job is pushed.
    class InvalidOptions < ArgumentError; end

    # Included into every Sidekiq worker: the lock the job holds while it
    # runs (nil for until_executing) and its fencing token, to hand to the
    # storage the job writes so a stale holder's writes are refused.
    module JobMethods
      attr_accessor :tumbler_lock

      def tumbler_fencing_token = tumbler_lock&.fencing_token
    end

    @config = Config.new
    @client = nil
    @client_pid = nil
    @client_mutex = Mutex.new

    class << self
      attr_reader :config

      # Tumbler::Sidekiq.configure(address: 'tumbler:50051', namespace: 'jobs') { |c| c.lock_ttl = 3600 }
      # install: false leaves Sidekiq's middleware chains to you (add
      # Tumbler::Sidekiq::Middleware::Client / ::Server yourself).
      def configure(install: true, **settings)
        settings.each { |k, v| config.public_send("#{k}=", v) }
        yield config if block_given?
        reset_client!
        install! if install
        config
      end

      # The tumbler client of this process (made again after a fork: gRPC
      # channels do not survive one).
      def client
        return @client if @client && @client_pid == Process.pid

        @client_mutex.synchronize do
          unless @client && @client_pid == Process.pid
            target, security = config.client_settings
            @client = Tumbler::Client.new(target, namespace: config.namespace, token: config.token,
                                                  timeout: config.rpc_timeout, interceptors: config.interceptors,
                                                  **security)
            @client_pid = Process.pid
          end
        end
        @client
      end

      def reset_client!
        @client_mutex.synchronize { @client = nil }
      end

      # The fencing token of the lock the current job holds (nil outside a
      # job, or for lock types that hold none while the job runs).
      def current_fencing_token = Thread.current[:tumbler_sidekiq_lock]&.fencing_token

      def install!
        ::Sidekiq.configure_client do |sidekiq|
          sidekiq.client_middleware { |chain| add(chain, Middleware::Client) }
        end
        ::Sidekiq.configure_server do |sidekiq|
          sidekiq.client_middleware { |chain| add(chain, Middleware::Client) }
          sidekiq.server_middleware { |chain| add(chain, Middleware::Server) }
          sidekiq.death_handlers << method(:on_death) unless sidekiq.death_handlers.include?(method(:on_death))
          sidekiq.on(:startup) { install_fetch(sidekiq) } if config.reliable_fetch
          # The releases of jobs that ended are sent before the process exits.
          at_exit { Keeper.shutdown } unless @keeper_at_exit
          @keeper_at_exit = true
        end
      end

      # A job that died (retries exhausted) gives its until-lock back; an
      # until_expired lock stays until its lease ends.
      def on_death(job, _err = nil)
        options = LockOptions.for(nil, job)
        return unless options&.client_lock? && options.type != :until_expired

        digest = job['lock_digest'] || options.digest(job)
        client.release(digest, holder: job['jid'])
      rescue StandardError => e
        config.logger.warn("tumbler-sidekiq: could not release the lock of dead job #{job['jid']}: #{e.message}")
      end

      private

      def add(chain, klass)
        chain.add(klass) unless chain.exists?(klass)
      end

      def install_fetch(sidekiq)
        if sidekiq.options[:fetch]
          config.logger.info("tumbler-sidekiq: keeping the fetch strategy #{sidekiq.options[:fetch].class}")
        else
          sidekiq.options[:fetch] = ReliableFetch.new(sidekiq.options)
        end
      end
    end
  end
end

Sidekiq::Worker.include(Tumbler::Sidekiq::JobMethods)
# push_bulk takes its unique jobs' locks in one request (Tumbler::Sidekiq::Bulk).
Sidekiq::Client.prepend(Tumbler::Sidekiq::BulkPush) unless Sidekiq::Client <= Tumbler::Sidekiq::BulkPush
