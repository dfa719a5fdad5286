# frozen_string_literal: true

# Leader election: a Tumbler::Leadership is a Lock whose holder is the
# candidate and whose fencing token is the term, so the same watchdog keeps
# its lease (Extend pinned to the term) and lost? tells when the term ended
# under it. #proclaim and #resign act only with this term.
module Tumbler
  class Leadership < Lock
    attr_reader :leader

    def initialize(client, name, leader, lease_end, secret = '')
      grant = V1::Grant.new(holder: leader.candidate, fencing_token: leader.term, slot: 1,
                            acquired_at_ms: leader.elected_at_ms, expires_at_ms: leader.expires_at_ms,
                            ttl_ms: leader.ttl_ms)
      super(client, name, grant, lease_end)
      @leader = leader # the V1::Leadership as last told by the server
      # Told only to the winning Campaign: Proclaim and Resign send it.
      @secret = secret
      @resigned = false
    end

    def candidate = leader.candidate
    # The leader's fencing token: hand it to what the leader writes to.
    def term = leader.term
    def value = leader.value
    def resigned? = @resigned

    def lost_error = NotLeader.new(name, candidate, term, lost_reason || 'not the leader')

    # Replace the value others see. Raises NotLeader (and the leadership is lost) when the term is over.
    def proclaim(value)
      resp = client.call(:proclaim) do
        V1::ProclaimRequest.new(namespace: client.namespace, name: name, candidate: candidate, term: term, value: value,
                                 secret: @secret)
      end
      unless resp.status == :PROCLAIM_STATUS_PROCLAIMED
        mark_lost('not the leader')
        raise lost_error
      end
      @leader = resp.leader
      self
    end

    # Step down at once (the next candidate is elected) and stop the watchdog:
    # true when this call ended the term, false when it was over already.
    # Safe to call more than once.
    def resign
      stop_keep_alive
      return false if @resigned

      resp = client.call(:resign) do
        V1::ResignRequest.new(namespace: client.namespace, name: name, candidate: candidate, term: term,
                              secret: @secret)
      end
      @resigned = true
      resp.status == :RESIGN_STATUS_RESIGNED
    end

    alias release resign
  end

  # The leader changes of one election (V1::LeaderChange), as an Enumerable:
  # the first is the leader when the stream started (event "current").
  # #cancel (from any thread, or from the block) ends the iteration.
  class Observer
    include Enumerable

    def initialize(client, name, deadline: nil)
      @client = client
      @name = name
      @deadline = deadline
      @op = nil
      @cancelled = false
    end

    def cancelled? = @cancelled

    def each(&block)
      return enum_for(:each) unless block

      req = V1::LeaderRequest.new(namespace: @client.namespace, name: @name)
      opts = { metadata: @client.metadata, return_op: true }
      opts[:deadline] = @deadline if @deadline
      @op = @client.stub.observe(req, **opts)
      @op.execute.each do |change|
        break if @cancelled

        block.call(change)
      end
      self
    rescue GRPC::Cancelled
      raise unless @cancelled

      self
    rescue GRPC::BadStatus => e
      raise Tumbler.error_from(e)
    ensure
      cancel unless @cancelled
    end

    def cancel
      @cancelled = true
      @op&.cancel
    end
  end
end
