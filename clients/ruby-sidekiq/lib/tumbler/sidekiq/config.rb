# frozen_string_literal: true

module Tumbler
  module Sidekiq
    # Process-wide settings (Tumbler::Sidekiq.configure). Times are seconds,
    # as in sidekiq-unique-jobs; a job's own sidekiq_options override the
    # lock defaults (lock_ttl, lock_timeout, lock_prefix, on_conflict).
    class Config
      # tumbler's gRPC address: "host:port" (plaintext), or
      # "https://host:port" / "grpcs://host:port" (TLS); namespace and bearer token.
      attr_accessor :address, :namespace, :token
      # TLS: nil follows the address's scheme; true or false force it on or
      # off; a Hash turns it on with files: { ca_file: (trust this CA, PEM,
      # instead of the system's roots), cert_file:, key_file: (a client
      # certificate, for a server that requires mutual TLS) }. The files
      # default to TUMBLER_TLS_CA_FILE, TUMBLER_TLS_CLIENT_CERT_FILE and
      # TUMBLER_TLS_CLIENT_KEY_FILE, as for the tumbler CLI.
      attr_accessor :tls
      # GRPC::Core::ChannelCredentials (or :this_channel_is_insecure) used
      # as they are; nil: made from address and tls.
      attr_accessor :credentials
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
      # How long (s) the keeper holds a finished job's release for others to
      # go with it in one request (0: each is sent as soon as it can be).
      attr_accessor :release_delay
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
        @tls = nil
        @credentials = nil
        @rpc_timeout = 10.0
        @interceptors = []
        @lock_prefix = 'uniquejobs'
        @lock_ttl = nil
        @lock_timeout = 0
        @on_conflict = nil
        @max_lock_ttl = 86_400
        @max_lock_timeout = 3_600
        @execution_ttl = 15
        @release_delay = 0.005
        @schedule_in = 5
        @enabled = true
        @reliable_fetch = true
        @heartbeat_ttl = 15
        @recover_interval = 5
        @logger = nil
      end

      def logger = @logger || ::Sidekiq.logger

      SCHEMES = { 'https' => true, 'grpcs' => true, 'http' => false, 'grpc' => false }.freeze
      TLS_FILES = %i[ca_file cert_file key_file].freeze

      # The gRPC target ("host:port") and the channel credentials for it.
      def channel
        scheme, target = address.to_s.match(%r{\A(?:([a-z]+)://)?([^/]+)/?\z}i)&.captures
        raise ArgumentError, "address: host:port or https://host:port, not #{address.inspect}" unless target

        scheme = scheme&.downcase
        if scheme && !SCHEMES.key?(scheme)
          raise ArgumentError, "address: unknown scheme #{scheme}:// (#{SCHEMES.keys.join(', ')})"
        end
        return [target, credentials] if credentials

        on = tls.nil? ? SCHEMES[scheme] == true : tls != false
        [target, on ? tls_credentials : :this_channel_is_insecure]
      end

      # The target and the Tumbler::Client options for it: TLS as tls:
      # (the files, or true for the system's roots), so the client can
      # carry its unary calls over Connect with the same security; a given
      # credentials object, or plaintext, as credentials:.
      def client_settings
        target, creds = channel
        return [target, { credentials: creds }] if credentials || creds == :this_channel_is_insecure

        files = tls_files.compact.reject { |_, f| f.to_s.empty? }
        [target, { tls: files.empty? ? true : files }]
      end

      private

      def tls_files
        files = { ca_file: ENV.fetch('TUMBLER_TLS_CA_FILE', nil), cert_file: ENV.fetch('TUMBLER_TLS_CLIENT_CERT_FILE', nil),
                  key_file: ENV.fetch('TUMBLER_TLS_CLIENT_KEY_FILE', nil) }
        files.merge!(tls.transform_keys(&:to_sym)) if tls.is_a?(Hash)
        files
      end

      def tls_credentials
        if tls.is_a?(Hash)
          unknown = tls.transform_keys(&:to_sym).keys - TLS_FILES
          raise ArgumentError, "tls: unknown #{unknown.join(', ')} (#{TLS_FILES.join(', ')})" unless unknown.empty?
        end
        files = tls_files
        ca, cert, key = files.values_at(*TLS_FILES).map { |f| f.nil? || f.to_s.empty? ? nil : File.read(f) }
        raise ArgumentError, 'tls: cert_file and key_file go together' if cert.nil? != key.nil?

        cert ? GRPC::Core::ChannelCredentials.new(ca, key, cert) : GRPC::Core::ChannelCredentials.new(*[ca].compact)
      end
    end
  end
end
