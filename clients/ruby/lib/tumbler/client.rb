# frozen_string_literal: true

# A thin helper over tumbler's generated gRPC stubs (lib/tumbler/v1, built
# from proto/ by generate.sh). Client#stub is the full API; this file adds
# acquire with a wait and a deadline, a block form that always releases,
# extend_lease, and the grant's fencing token and slot.
unless File.exist?(File.join(__dir__, 'v1', 'lock_services_pb.rb'))
  system(File.join(__dir__, '..', '..', 'generate.sh'), exception: true)
end
require 'tumbler/v1/lock_services_pb'

module Tumbler
  # Extra seconds on the RPC deadline beyond wait_ms, so the server's own
  # TIMEOUT reply wins over DEADLINE_EXCEEDED.
  DEADLINE_SLACK = 5.0

  # The lock was not granted: busy? (tried once) or timeout? (waited).
  class NotAcquired < StandardError
    attr_reader :response

    def initialize(name, response)
      @response = response
      super("#{name}: not acquired (#{response.reason}, #{response.holders} holder(s))")
    end

    def busy? = response.reason == :NOT_ACQUIRED_REASON_BUSY
    def timeout? = response.reason == :NOT_ACQUIRED_REASON_TIMEOUT
  end

  # Extend answered NOT_HELD: stop working on what the lock protected.
  class LockLost < StandardError; end

  # One grant.
  class Lock
    attr_reader :client, :name, :grant

    def initialize(client, name, grant)
      @client = client
      @name = name
      @grant = grant
    end

    def holder = grant.holder
    def fencing_token = grant.fencing_token
    def slot = grant.slot

    # Reset the lease to ttl_ms from now (nil: the grant's own ttl). Raises LockLost.
    # (Named so because Object#extend is Ruby's own.)
    def extend_lease(ttl_ms = nil)
      req = { namespace: client.namespace, name: name, holder: holder, fencing_token: fencing_token }
      req[:ttl_ms] = ttl_ms if ttl_ms
      resp = client.stub.extend(V1::ExtendRequest.new(**req), deadline: client.deadline)
      raise LockLost, "#{name}: lease of #{holder} lost" unless resp.status == :EXTEND_STATUS_EXTENDED

      @grant = resp.grant
      self
    end

    # Give the permit back; false when it was no longer held (expired).
    def release
      req = V1::ReleaseRequest.new(namespace: client.namespace, name: name, holder: holder,
                                   fencing_token: fencing_token)
      client.stub.release(req, deadline: client.deadline).status == :RELEASE_STATUS_RELEASED
    end
  end

  # Tumbler::Client.new('127.0.0.1:50051'); #stub is the generated stub.
  class Client
    attr_reader :stub, :namespace

    def initialize(target = '127.0.0.1:50051', namespace: '', timeout: 10.0,
                   credentials: :this_channel_is_insecure)
      @stub = V1::LockService::Stub.new(target, credentials)
      @namespace = namespace
      @timeout = timeout
    end

    def deadline(seconds = @timeout) = Time.now + seconds

    # Take a permit, waiting up to wait_ms in the server (0: try once).
    # timeout (seconds) is the RPC deadline; default wait_ms plus a little.
    # Returns a Lock or raises NotAcquired.
    def acquire(name, holder: '', wait_ms: 0, timeout: nil, limit: nil, ttl_ms: nil, kind: '',
                metadata: {}, priority: 0, queue_ttl_ms: nil, fair: nil)
      req = { namespace: namespace, name: name, holder: holder, kind: kind, metadata: metadata,
              wait_ms: wait_ms, priority: priority, limit: limit, ttl_ms: ttl_ms,
              queue_ttl_ms: queue_ttl_ms, fair: fair }.compact
      resp = stub.acquire(V1::AcquireRequest.new(**req),
                          deadline: deadline(timeout || (wait_ms / 1000.0) + DEADLINE_SLACK))
      raise NotAcquired.new(name, resp) if resp.status == :ACQUIRE_STATUS_NOT_ACQUIRED

      Lock.new(self, name, resp.grant)
    end

    # client.lock('reports', wait_ms: 5000) { |lock| ... } — released however the block ends.
    def lock(name, **options)
      held = acquire(name, **options)
      begin
        yield held
      ensure
        held.release
      end
    end

    def inspect_lock(name)
      stub.inspect(V1::InspectRequest.new(namespace: namespace, name: name), deadline: deadline)
    end
  end
end
