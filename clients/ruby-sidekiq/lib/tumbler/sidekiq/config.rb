# frozen_string_literal: true

module Tumbler
  module Sidekiq
    # Process-wide settings (Tumbler::Sidekiq.configure). Times are seconds,
    # as in sidekiq-unique-jobs; a job's own sidekiq_options override the
    # lock defaults (lock_ttl, lock_timeout, lock_prefix, on_conflict).
    class Config
      # tumbler's gRPC address ("host:port"), namespace and bearer token.
      attr_accessor :address, :namespace, :token, :credentials
      # RPC deadline (s) for calls that do not wait; what the client retries
      # UNAVAILABLE within.
      attr_accessor :rpc_timeout
      # GRPC::ClientInterceptor instances handed to the client (counting, tracing).
      attr_accessor :interceptors
      # Defaults for jobs that name none. lock_ttl nil: max_lock_ttl.
      attr_accessor :lock_prefix, :lock_ttl, :lock_timeout, :on_conflict
      # The longest lease asked for (the server's --max-ttl-ms, one day by
      # default) and the longest server-side wait (--max-wait-ms).
      attr_accessor :max_lock_ttl, :max_lock_timeout
      # The lease of a lock while its job runs: the watchdog renews it every
      # third, so it only bounds how long a killed worker keeps the lock.
      attr_accessor :execution_ttl
      # Seconds before a rescheduled job (on_conflict: :reschedule) runs again.
      attr_accessor :schedule_in
      # false: the middleware passes every job through untouched.
      attr_accessor :enabled
      # Install Tumbler::Sidekiq::ReliableFetch in Sidekiq servers (unless a
      # fetch strategy is already set), so a killed worker's jobs come back.
      attr_accessor :reliable_fetch
      # ReliableFetch: a process is dead once its heartbeat key is this old (s);
      # live processes look for dead ones' jobs every recover_interval (s).
      attr_accessor :heartbeat_ttl, :recover_interval
      attr_writer :logger

      def initialize
        @address = ENV.fetch('TUMBLER_ADDR', '127.0.0.1:50051')
        @namespace = ENV.fetch('TUMBLER_NAMESPACE', 'sidekiq')
        @token = ENV.fetch('TUMBLER_TOKEN', nil)
        @credentials = :this_channel_is_insecure
        @rpc_timeout = 10.0
        @interceptors = []
        @lock_prefix = 'uniquejobs'
        @lock_ttl = nil
        @lock_timeout = 0
        @on_conflict = nil
        @max_lock_ttl = 86_400
        @max_lock_timeout = 3_600
        @execution_ttl = 15
        @schedule_in = 5
        @enabled = true
        @reliable_fetch = true
        @heartbeat_ttl = 15
        @recover_interval = 5
        @logger = nil
      end

      def logger = @logger || ::Sidekiq.logger
    end
  end
end
