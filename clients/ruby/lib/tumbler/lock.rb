# frozen_string_literal: true

# A grant (Tumbler::Lock) and its watchdog thread: extend every third of the
# lease, pinned to the fencing token. NOT_HELD, or renewals that fail until
# the lease has run out, mark the lock lost at once and call the on_lost
# hook (Client#lock raises LockLost in the block's thread with it).
module Tumbler
  class Lock
    attr_reader :client, :name, :grant, :lost_reason

    # already_held: the Acquire found this holder already holding the grant
    # (ALREADY_HELD: same token and slot, lease unchanged).
    # names: a multi-lock's names (LockSet): Extend and Release then name
    # the set, each lock pinned to its own token (fencing_tokens, in the
    # order of names).
    def initialize(client, name, grant, lease_end, already_held: false, limit: nil, names: nil, fencing_tokens: nil)
      @names = names
      @fencing_tokens = fencing_tokens
      @already_held = already_held
      @limit = limit # the limit asked: a downgrade asks the same
      @client = client
      @name = name
      self.grant = grant
      @lease_end = lease_end # local monotonic estimate of when the lease runs out
      @lost_reason = nil
      @mutex = Mutex.new
      @wake = ConditionVariable.new
      @stopped = false
      @watchdog = nil
    end

    # (Read once per grant: a message's field is a method_missing call.)
    attr_reader :holder, :fencing_token, :ttl_ms

    def slot = grant.slot
    # :read or :write for a grant of a read/write lock, nil for a plain lock's.
    def mode = { LOCK_MODE_READ: :read, LOCK_MODE_WRITE: :write }[grant.mode]
    # The permits the grant holds (1 unless acquired with permits: k), and
    # its slots, one per permit, ascending.
    def permits = [grant.permits, 1].max
    def slots = grant.slots.empty? ? [grant.slot] : grant.slots.to_a
    def lost? = !@lost_reason.nil?
    def already_held? = @already_held

    def lost_error = LockLost.new(name, holder, fencing_token, @lost_reason || 'lost')

    # Raises LockLost if the grant is known to be gone.
    def check! = (raise lost_error if lost?)

    # Reset the lease to ttl_ms from now (nil: the grant's own ttl). Raises LockLost.
    # (Named so because Object#extend is Ruby's own.)
    def extend_lease(ttl_ms = nil)
      sent = Client.now
      resp = client.call(:extend) { extend_request(ttl_ms) }
      unless resp.status == :EXTEND_STATUS_EXTENDED
        mark_lost('not held')
        raise lost_error
      end
      renewed(resp.grant, sent)
      self
    end

    # Turn a write grant into a read grant at once: the same fencing token, slot
    # and lease; readers may then join. Raises Tumbler::Error
    # (FAILED_PRECONDITION) on a plain lock, LockLost when the grant is gone.
    def downgrade
      req = V1::AcquireRequest.new(**{ namespace: client.namespace, name: name, holder: holder, kind: grant.kind,
                                       ttl_ms: ttl_ms, limit: @limit, mode: :LOCK_MODE_READ }.compact)
      sent = Client.now
      resp = client.call(:acquire) { req }
      if resp.status == :ACQUIRE_STATUS_NOT_ACQUIRED || resp.grant.fencing_token != fencing_token
        unless resp.status == :ACQUIRE_STATUS_NOT_ACQUIRED # a new grant, not ours: give it back
          client.call(:release) do
            V1::ReleaseRequest.new(namespace: client.namespace, name: name, holder: holder,
                                   fencing_token: resp.grant.fencing_token)
          end
        end
        mark_lost('not held')
        raise lost_error
      end
      renewed(resp.grant, sent)
      self
    end

    # Give the permit back (pinned to the fencing token); false when it was no longer held.
    def release
      stop_keep_alive
      req = V1::ReleaseRequest.new(namespace: client.namespace, holder: holder, **which)
      client.call(:release) { req }.status == :RELEASE_STATUS_RELEASED
    end

    # Start the watchdog; the block (if any) is called with a LockLost when the grant is lost.
    def keep_alive(&on_lost)
      @on_lost = on_lost
      @stopped = false
      @watchdog ||= Thread.new { watch }
      self
    end

    def stop_keep_alive
      return unless @watchdog

      @mutex.synchronize do
        @stopped = true
        @wake.signal
      end
      @watchdog.join unless @watchdog == Thread.current
      @watchdog = nil
    end

    def extend_request(ttl_ms)
      req = { namespace: client.namespace, holder: holder, **which }
      req[:ttl_ms] = ttl_ms if ttl_ms
      V1::ExtendRequest.new(**req)
    end

    private

    # What an Extend or Release names: the lock pinned to its token, or the set pinned to its tokens.
    def which
      return { name: name, fencing_token: fencing_token } unless @names

      { names: @names, fencing_tokens: @fencing_tokens }.compact
    end

    # The grant, and its fields read often.
    def grant=(grant)
      @grant = grant
      @holder = grant['holder']
      @fencing_token = grant['fencing_token']
      @ttl_ms = grant['ttl_ms']
    end

    def renewed(grant, sent)
      self.grant = grant
      @lease_end = sent + (grant.ttl_ms / 1000.0)
    end

    def mark_lost(reason)
      @mutex.synchronize do
        return if lost?

        @lost_reason = reason
      end
      @on_lost&.call(lost_error)
    end

    # Sleeps until `at` unless stopped first; true when stopped.
    def stopped_before?(at)
      @mutex.synchronize do
        until @stopped || (wait = at - Client.now) <= 0
          @wake.wait(@mutex, wait)
        end
        @stopped
      end
    end

    def watch
      interval = ttl_ms / 3000.0
      next_at = Client.now + interval
      attempt = 0
      until stopped_before?(next_at)
        sent = Client.now
        timeout = [[interval, @lease_end - sent].min, 0.05].max
        begin
          resp = client.unary.extend(extend_request(ttl_ms), deadline: Time.now + timeout, metadata: client.metadata)
        rescue StandardError => e
          # Any failure (a status, or the channel erroring while its server
          # restarts) is retried until the lease would end.
          return mark_lost("renewals failed until the lease ran out (#{e.class.name})") if Client.now >= @lease_end

          next_at = [Client.now + client.backoff(attempt), @lease_end].min
          attempt += 1
          next
        end
        return if @stopped
        return mark_lost('not held') unless resp.status == :EXTEND_STATUS_EXTENDED

        renewed(resp.grant, sent)
        next_at = sent + interval
        attempt = 0
      end
    end
  end
end
