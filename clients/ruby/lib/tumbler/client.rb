# frozen_string_literal: true

# The tumbler client: Tumbler::Client over the stubs generated from
# tumbler/v1/lock.proto when the gem was built (lib/tumbler/v1). Every call
# is retried on UNAVAILABLE with jittered back-off until its deadline, with
# the same holder id, so a retried acquire can never take a second permit.
# Client#lock holds a grant for a block, kept alive by a watchdog; when the
# grant is lost, LockLost is raised in the block's thread at once;
# Client#lock_all holds a multi-lock's set the same way.
# Client#campaign, #leader and #observe are leader election; Client#batch
# (tumbler/batch.rb) sends several independent calls in one request.
require 'securerandom'
require 'tumbler/v1/lock_services_pb'
require 'tumbler/errors'
require 'tumbler/connect'
require 'tumbler/lock'
require 'tumbler/lock_set'
require 'tumbler/election'
require 'tumbler/batch'

module Tumbler
  # Extra seconds on the RPC deadline beyond wait_ms, so the server's own
  # TIMEOUT reply wins over DEADLINE_EXCEEDED.
  DEADLINE_SLACK = 5.0
  # The lease Client#lock asks for when the caller names none; the watchdog
  # renews it every third, so it only bounds how long a crashed holder keeps it.
  DEFAULT_HELPER_TTL_MS = 15_000

  # Tumbler::Client.new('127.0.0.1:50051'); #stub is the generated stub.
  class Client
    attr_reader :stub, :unary, :namespace, :metadata

    TRANSPORTS = %i[auto connect grpc].freeze

    def self.now = Process.clock_gettime(Process::CLOCK_MONOTONIC)

    # credentials: GRPC::Core::ChannelCredentials for TLS (default plaintext);
    # token: sent as "authorization: Bearer <token>"; timeout: seconds for
    # calls that do not wait, retries included; retry: initial/max back-off (s);
    # interceptors: GRPC::ClientInterceptor instances (see every RPC, the
    # watchdog's renewals included).
    #
    # tls: true (the system's roots) or { ca_file:, cert_file:, key_file: }
    # (PEM files; cert and key for a client certificate): TLS for both
    # transports, instead of credentials.
    # transport: what carries the unary calls (acquire, release, extend,
    # the election's, ...; streams are always gRPC): :auto (default)
    # Connect when it can carry them with the channel's own security (no
    # interceptors, no GRPC credentials object, which only the grpc gem
    # can use: plaintext or tls:, and a host:port target), gRPC otherwise;
    # :grpc always gRPC; :connect Connect or ArgumentError. See
    # tumbler/connect.rb and README.md, "What a call costs".
    def initialize(target = '127.0.0.1:50051', namespace: '', timeout: 10.0, token: nil,
                   credentials: :this_channel_is_insecure, retry_initial: 0.05, retry_max: 1.0, interceptors: [],
                   tls: nil, transport: :auto)
      raise ArgumentError, "transport: #{transport.inspect} is not :auto, :connect or :grpc" unless TRANSPORTS.include?(transport)

      ssl = nil
      if tls
        raise ArgumentError, 'tls: give tls: or credentials:, not both' unless credentials == :this_channel_is_insecure

        credentials, ssl = Client.tls_settings(tls)
      end
      @stub = V1::LockService::Stub.new(target, credentials, interceptors: interceptors)
      addr = ConnectStub.split_target(target) if interceptors.empty? && (ssl || credentials == :this_channel_is_insecure)
      if transport == :connect && !addr
        raise ArgumentError, 'transport: :connect needs a host:port target, no interceptors and no credentials ' \
                             'object (give TLS as tls:)'
      end
      # What carries the unary calls: the Connect stub, or the gRPC stub itself.
      @connect = ConnectStub.new(*addr, ssl_context: ssl) if addr && transport != :grpc
      @unary = @connect || @stub
      @namespace = namespace
      @timeout = timeout
      @metadata = token ? { 'authorization' => "Bearer #{token}" } : {}
      @retry_initial = retry_initial
      @retry_max = retry_max
    end

    # tls: true or { ca_file:, cert_file:, key_file: } -> [GRPC credentials,
    # OpenSSL::SSL::SSLContext]: the same roots and client certificate for both.
    def self.tls_settings(tls)
      files = tls == true ? {} : tls.to_h.transform_keys(&:to_sym)
      unknown = files.keys - %i[ca_file cert_file key_file]
      raise ArgumentError, "tls: unknown #{unknown.join(', ')} (ca_file, cert_file, key_file)" unless unknown.empty?

      ca, cert, key = files.values_at(:ca_file, :cert_file, :key_file).map { |f| f.nil? || f.to_s.empty? ? nil : File.read(f) }
      raise ArgumentError, 'tls: cert_file and key_file go together' if cert.nil? != key.nil?

      creds = cert ? GRPC::Core::ChannelCredentials.new(ca, key, cert) : GRPC::Core::ChannelCredentials.new(*[ca].compact)
      ctx = OpenSSL::SSL::SSLContext.new
      store = OpenSSL::X509::Store.new
      if ca
        ca.scan(/-----BEGIN CERTIFICATE-----.+?-----END CERTIFICATE-----/m) { |pem| store.add_cert(OpenSSL::X509::Certificate.new(pem)) }
      else
        store.set_default_paths
      end
      ctx.set_params(verify_mode: OpenSSL::SSL::VERIFY_PEER, cert_store: store)
      ctx.alpn_protocols = ['http/1.1']
      if cert
        ctx.cert = OpenSSL::X509::Certificate.new(cert)
        ctx.key = OpenSSL::PKey.read(key)
      end
      [creds, ctx]
    end

    # Closes the Connect connections (the gRPC channel closes with the process).
    def close
      @connect&.close
    end

    # Full-jitter back-off for the attempt-th retry.
    def backoff(attempt) = rand * [@retry_max, @retry_initial * (2**attempt)].min

    # One RPC (the block builds its request), retried on UNAVAILABLE until the deadline.
    def call(method, deadline: Client.now + @timeout)
      attempt = 0
      begin
        if @connect
          @connect.invoke(method, yield, deadline, metadata) # the monotonic deadline as it is
        else
          @unary.public_send(method, yield, deadline: Time.now + [deadline - Client.now, 0.001].max, metadata: metadata)
        end
      rescue GRPC::Unavailable => e
        pause = [backoff(attempt), deadline - Client.now - 0.001].min
        raise Tumbler.error_from(e) if pause <= 0

        sleep pause
        attempt += 1
        retry
      rescue GRPC::BadStatus => e
        raise Tumbler.error_from(e)
      end
    end

    # Take a permit (permits: k takes k of the limit at once), waiting up to
    # wait_ms in the server (0: try once).
    # timeout (s) bounds the whole call, retries included (default wait_ms
    # plus 5 s); Timeout.timeout around it cancels the wait (the server drops
    # the request). takes_over: a holder whose live grant this one takes over
    # in the same step (decision 0083), sent as given (default '': none).
    # Returns a Lock (no watchdog: see #lock / Lock#keep_alive);
    # raises Busy, LockTimeout, InvalidArgument, PermissionDenied, Unavailable.
    def acquire(name, holder: nil, wait_ms: 0, timeout: nil, limit: nil, ttl_ms: nil, kind: '',
                metadata: {}, priority: 0, queue_ttl_ms: nil, fair: nil, mode: nil, prefer_readers: false,
                permits: nil, takes_over: '')
      # Only the fields set (a default is what an absent field means), built
      # once: a retry sends the same request with the rest of its wait.
      fields = { namespace: namespace, name: name }
      fields[:limit] = limit if limit
      fields[:ttl_ms] = ttl_ms if ttl_ms
      fields[:kind] = kind unless kind.nil? || kind == ''
      fields[:metadata] = metadata if metadata && !metadata.empty?
      fields[:priority] = priority unless priority.nil? || priority == 0
      fields[:queue_ttl_ms] = queue_ttl_ms if queue_ttl_ms
      fields[:fair] = fair unless fair.nil?
      if mode
        mode = Client.lock_mode(mode)
        fields[:mode] = mode if mode
      end
      fields[:prefer_readers] = prefer_readers if prefer_readers
      fields[:permits] = permits if permits
      fields[:takes_over] = takes_over unless takes_over.nil? || takes_over.to_s.empty?
      resp, sent = send_acquire(name, holder, wait_ms, timeout, fields)
      grant = resp['grant'] # (read by name: a field's method is a method_missing call)
      Lock.new(self, name, grant, sent + (grant['ttl_ms'] / 1000.0),
               already_held: resp['status'] == :ACQUIRE_STATUS_ALREADY_HELD, limit: limit)
    end

    # A multi-lock (2 to 16 distinct names of the namespace): every lock or
    # none, for one holder with one lease and one wait (0: try once). While
    # it waits it holds nothing: the server tries the whole set again when a
    # lock of it frees. Each lock grants one permit under limit (default 1).
    # Returns a LockSet (no watchdog: see #lock_all / LockSet#keep_alive);
    # raises Busy or LockTimeout (named by the names joined with commas),
    # InvalidArgument (fewer than 2 or more than 16 names, a name twice:
    # details start with "names"), Deadlock, PermissionDenied, Unavailable.
    def acquire_all(names, holder: nil, wait_ms: 0, timeout: nil, limit: nil, ttl_ms: nil, kind: '', metadata: {},
                    queue_ttl_ms: nil)
      names = names.map(&:to_s)
      fields = { namespace: namespace, names: names, kind: kind, metadata: metadata, limit: limit, ttl_ms: ttl_ms,
                 queue_ttl_ms: queue_ttl_ms }.compact
      resp, sent = send_acquire(names.join(','), holder, wait_ms, timeout, fields)
      # The set's lease is as long as its shortest.
      first = resp.grants.min_by(&:expires_at_ms) || resp.grant
      tokens = names.map { |n| resp.grants.find { |g| g.name == n }&.fencing_token }
      lock = Lock.new(self, names.join(','), first, sent + (first.ttl_ms / 1000.0), limit: limit, names: names,
                                                                                    fencing_tokens: tokens)
      LockSet.new(lock, resp.grants.to_a)
    end

    MODES = { nil => nil, read: :LOCK_MODE_READ, write: :LOCK_MODE_WRITE }.freeze

    # :read / 'read', :write / 'write' (or the enum's own symbol) -> the LockMode
    # symbol; nil: a plain lock.
    def self.lock_mode(mode)
      return mode if MODES.value?(mode)

      key = mode&.to_sym
      raise ArgumentError, "mode: #{mode.inspect} is not :read, :write or nil" unless MODES.key?(key)

      MODES[key]
    end

    # client.lock('reports', wait_ms: 5000) { |lock| ... } — held for the whole block.
    # A watchdog extends the lease every ttl_ms/3 (default lease 15 s). If the
    # grant is lost, LockLost is raised in the block's thread at once (and
    # the block ends with it); otherwise the grant is released however the block ends.
    def lock(name, ttl_ms: DEFAULT_HELPER_TTL_MS, **options, &block)
      held_for(acquire(name, ttl_ms: ttl_ms, **options), &block)
    end

    # Leader election: wait up to wait_ms in the election's queue (0: try
    # once). Elected: a Leadership whose watchdog extends the lease every
    # ttl_ms/3 (default 15 s); nil when not elected within the wait. With a
    # block: yields the Leadership (NotLeader is raised in the block's thread
    # at once if the term ends under it) and resigns when the block ends.
    # candidate defaults to an id made here before the first try, so a
    # retried campaign is the same candidacy (same term if it already leads).
    def campaign(name, value: '', candidate: nil, wait_ms: 0, timeout: nil, ttl_ms: DEFAULT_HELPER_TTL_MS,
                 queue_ttl_ms: nil, kind: '', &block)
      candidate = "rb-#{SecureRandom.hex(16)}" if candidate.nil? || candidate.empty?
      base = { namespace: namespace, name: name, candidate: candidate, value: value, ttl_ms: ttl_ms, kind: kind,
               queue_ttl_ms: queue_ttl_ms }.compact
      resp, sent = waiting_call(:campaign, V1::CampaignRequest.new(base), wait_ms: wait_ms, timeout: timeout)
      return nil unless resp&.elected

      held = Leadership.new(self, name, resp.leader, [sent, Client.now - 0.05].max + (resp.leader.ttl_ms / 1000.0),
                            resp.secret)
      return held.keep_alive unless block

      begin
        hold(held, &block)
      ensure
        held.resign
      end
    end

    # The election's current V1::Leadership, or nil when nobody leads.
    def leader(name)
      call(:leader) { V1::LeaderRequest.new(namespace: namespace, name: name) }.leader
    end

    # The election's leader changes (an Observer: Enumerable of
    # V1::LeaderChange, the first the current leader); #cancel ends it.
    def observe(name, timeout: nil)
      Observer.new(self, name, deadline: timeout && (Time.now + timeout))
    end

    def inspect_lock(name)
      call(:inspect) { V1::InspectRequest.new(namespace: namespace, name: name) }
    end

    def queue(name, max_entries: 0)
      call(:queue) { V1::QueueRequest.new(namespace: namespace, name: name, max_entries: max_entries) }
    end

    # Runs the block with the watchdog on for a grant you already have (from
    # #acquire, or a Lock built from an Extend reply): LockLost is raised in
    # this thread at once when the grant is lost, and only while the block
    # runs. Does not release: the caller decides what becomes of the grant
    # (release it, or extend it to a longer lease and keep it).
    def hold(held)
      body = Thread.current
      Thread.handle_interrupt(LockLost => :never) do
        held.keep_alive { |err| body.raise(err) }
        Thread.handle_interrupt(LockLost => :immediate) { yield held }
      ensure
        held.stop_keep_alive
        discard_pending_lost
      end
    end

    # Extend the grant `holder` has on `name` (optionally pinned to its
    # token) and return it as a Lock, as if this process had acquired it
    # (a job taking over the lock its enqueue took with the job id as
    # holder); nil when the holder holds no live grant (NOT_HELD).
    def extend_grant(name, holder:, ttl_ms: nil, fencing_token: nil)
      req = { namespace: namespace, name: name, holder: holder, ttl_ms: ttl_ms, fencing_token: fencing_token }.compact
      sent = Client.now
      resp = call(:extend) { V1::ExtendRequest.new(**req) }
      return nil unless resp.status == :EXTEND_STATUS_EXTENDED

      Lock.new(self, name, resp.grant, sent + (resp.grant.ttl_ms / 1000.0))
    end

    # Release the grant `holder` has on `name` (optionally pinned to its
    # token) without a Lock object; false when it was not held.
    def release(name, holder:, fencing_token: nil)
      req = { namespace: namespace, name: name, holder: holder, fencing_token: fencing_token }.compact
      call(:release) { V1::ReleaseRequest.new(**req) }.status == :RELEASE_STATUS_RELEASED
    end

    # client.lock_all(%w[accounts/1 accounts/2], wait_ms: 5000) { |set| ... } —
    # every lock of the set held for the whole block, as #lock holds one:
    # the watchdog extends the set every ttl_ms/3 (one Extend naming it);
    # LockLost is raised in the block's thread if any lock of it is lost;
    # otherwise the set is released however the block ends.
    def lock_all(names, ttl_ms: DEFAULT_HELPER_TTL_MS, **options, &block)
      held_for(acquire_all(names, ttl_ms: ttl_ms, **options), &block)
    end

    # Release the set `names` that `holder` holds without a LockSet; false
    # when any lock of it was not held (the holder's others are released
    # all the same). fencing_tokens (one per name, in the order of names: a
    # LockSet's #fencing_tokens) pins each lock to its token: a lock taken
    # again since is left alone and makes the answer false.
    def release_all(names, holder:, fencing_tokens: nil)
      req = V1::ReleaseRequest.new(**{ namespace: namespace, names: names.map(&:to_s), holder: holder,
                                       fencing_tokens: fencing_tokens&.to_a }.compact)
      call(:release) { req }.status == :RELEASE_STATUS_RELEASED
    end

    private

    # Sends an Acquire (fields: the request's, but holder and wait_ms) with
    # retries until its deadline: [the granted response, when it was sent
    # (the lease's local start)]; raises Busy or LockTimeout (named `label`) and the call's errors.
    def send_acquire(label, holder, wait_ms, timeout, fields)
      holder = "rb-#{SecureRandom.hex(16)}" if holder.nil? || holder.empty?
      fields[:holder] = holder
      request = V1::AcquireRequest.new(fields)
      resp, sent = if wait_ms == 0
                     try_once_call(:acquire, request, timeout: timeout)
                   else
                     waiting_call(:acquire, request, wait_ms: wait_ms, timeout: timeout)
                   end
      raise LockTimeout.new(label, nil, "#{label}: not acquired before the deadline") if resp.nil?
      raise not_acquired(label, resp) if resp['status'] == :ACQUIRE_STATUS_NOT_ACQUIRED

      now = Client.now - 0.05
      [resp, sent > now ? sent : now]
    end

    # #waiting_call's answer for a request that does not wait (wait_ms 0, as
    # built): the same, without a wait to work out on each try.
    def try_once_call(method, request, timeout:)
      sent = Client.now
      deadline = sent + (timeout || DEADLINE_SLACK)
      resp = call(method, deadline: deadline) do
        sent = Client.now
        request
      end
      [resp, sent]
    rescue Error => e
      raise unless e.code == GRPC::Core::StatusCodes::DEADLINE_EXCEEDED

      [nil, sent]
    end

    # One RPC that waits in the server (request: built once, its wait_ms
    # set on each try to the rest of wait_ms), retried until the deadline
    # (timeout, default wait_ms + DEADLINE_SLACK): [the response, when it
    # was sent], the response nil when the deadline cut the call.
    def waiting_call(method, request, wait_ms:, timeout:)
      started = Client.now
      deadline = started + (timeout || (wait_ms / 1000.0) + DEADLINE_SLACK)
      sent = started
      resp = call(method, deadline: deadline) do
        sent = Client.now
        wait = [(wait_ms / 1000.0) - (sent - started), deadline - sent - 0.05].min
        request.wait_ms = wait.positive? ? (wait * 1000).to_i : 0
        request
      end
      [resp, sent]
    rescue Error => e
      raise unless e.code == GRPC::Core::StatusCodes::DEADLINE_EXCEEDED

      [nil, sent]
    end

    # Holds a grant (or set) for the block with the watchdog on, then
    # releases it; LockLost when it was lost.
    def held_for(held, &block)
      begin
        result = hold(held, &block)
      rescue LockLost
        raise
      rescue Exception # rubocop:disable Lint/RescueException -- the block failed: give the grant back
        held.release unless held.lost?
        raise
      end
      raise held.lost_error if held.lost?

      held.release
      result
    end

    def not_acquired(name, resp)
      resp.reason == :NOT_ACQUIRED_REASON_BUSY ? Busy.new(name, resp) : LockTimeout.new(name, resp)
    end

    # A LockLost the watchdog raised after the block ended is not delivered
    # later: the ensure above already decided what the block ends with.
    def discard_pending_lost
      return unless Thread.pending_interrupt?(LockLost)

      Thread.handle_interrupt(LockLost => :immediate) { Thread.pass }
    rescue LockLost
      nil
    end
  end
end
