# frozen_string_literal: true

# A multi-lock's grants (Tumbler::LockSet): one per name, held and given
# back as one. Its Lock names the set in Extend and Release, so the set
# shares the lock's watchdog: one Extend naming the set every third of the
# lease; NOT_HELD (any lock of it gone) marks the set lost. Extend and
# Release carry each lock's fencing token, so a late release of this set
# never touches a newer set of the same holder.
require 'forwardable'

module Tumbler
  class LockSet
    extend Forwardable

    # The grants as acquired (V1::Grant, each with its name and own fencing token), in the order asked.
    attr_reader :grants

    def_delegators :@lock, :holder, :lost?, :lost_error, :lost_reason, :check!, :keep_alive, :stop_keep_alive,
                   :release, :ttl_ms

    def initialize(lock, grants)
      @lock = lock
      @grants = grants
    end

    # The names, in the order asked.
    def names = grants.map(&:name)

    # The fencing token of the lock `name` of the set (nil: not in the set).
    def fencing_token(name) = grants.find { |g| g.name == name }&.fencing_token

    # Each lock's fencing token, in the order of names: the set's Extend
    # and Release are pinned to them.
    def fencing_tokens = names.map { |n| fencing_token(n) }

    # When the set's first lease ends (ms since the epoch), as last extended.
    def expires_at_ms = @lock.grant.expires_at_ms

    # Reset every lease of the set to ttl_ms from now (nil: the grants' own
    # ttl). Raises LockLost when any lock of the set was gone (the server
    # then releases the others).
    def extend_lease(ttl_ms = nil)
      @lock.extend_lease(ttl_ms)
      self
    end
  end
end
