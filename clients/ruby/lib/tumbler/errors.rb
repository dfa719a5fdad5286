# frozen_string_literal: true

# Typed errors of the tumbler gem. Not getting a lock raises NotAcquired
# (Busy after a try-once request, LockTimeout after a wait); a grant that
# ends while it is relied on raises LockLost; a wait that would close a
# wait-for cycle raises Deadlock. gRPC failures become
# InvalidArgument, PermissionDenied, Unavailable (after the retries ran
# out) or Error; #code and #details are the status's.
require 'grpc'

module Tumbler
  class Error < StandardError
    attr_reader :code, :details
    # Set when Client#batch sent its items in several requests and a later
    # one was refused whole: the answers of the requests before it, one per
    # item (nil for the items not sent), so that what they took can be
    # given back.
    attr_accessor :batch_results

    def initialize(message = nil, code: nil, details: nil)
      super(message)
      @code = code
      @details = details || ''
    end
  end

  # The lock was not granted; #response is the AcquireResponse (nil when the deadline cut the call).
  class NotAcquired < Error
    attr_reader :response

    def initialize(name, response, message = nil)
      @response = response
      super(message || "#{name}: not acquired (#{response&.reason}, #{response&.holders} holder(s))")
    end

    def busy? = false
    def timeout? = false
  end

  # A try-once request (wait_ms: 0) found every permit taken, or fair waiters ahead.
  class Busy < NotAcquired
    def busy? = true
  end

  # The wait (wait_ms, or the call's deadline) ended without a grant.
  class LockTimeout < NotAcquired
    def timeout? = true
  end

  # The grant is gone (Extend answered NOT_HELD, or renewals failed past the lease).
  class LockLost < Error
    attr_reader :name, :holder, :fencing_token, :reason

    def initialize(name, holder, fencing_token, reason)
      @name = name
      @holder = holder
      @fencing_token = fencing_token
      @reason = reason
      super("#{name}: lock lost by #{holder} (token #{fencing_token}): #{reason}")
    end
  end

  # A leadership whose term is over (Proclaim answered NOT_LEADER, or the
  # watchdog's Extend NOT_HELD): a LockLost with the candidate and term.
  class NotLeader < LockLost
    alias candidate holder
    alias term fencing_token
  end

  # The wait was refused because it would close a wait-for cycle: the
  # holder holds a lock another waiter needs while waiting for one it
  # holds (ABORTED; #details, "deadlock: holder ... waits for lock ...",
  # names the cycle). Waiting longer cannot help: give back what the holder
  # holds, then try again.
  class Deadlock < Error; end

  class InvalidArgument < Error; end
  class PermissionDenied < Error; end
  class Unavailable < Error; end

  BY_CODE = {
    GRPC::Core::StatusCodes::INVALID_ARGUMENT => InvalidArgument,
    GRPC::Core::StatusCodes::PERMISSION_DENIED => PermissionDenied,
    GRPC::Core::StatusCodes::UNAUTHENTICATED => PermissionDenied,
    GRPC::Core::StatusCodes::UNAVAILABLE => Unavailable
  }.freeze

  # The typed error for a GRPC::BadStatus (kept as #cause when raised in a rescue).
  def self.error_from(err)
    name = GRPC::Core::StatusCodes.constants.find { |c| GRPC::Core::StatusCodes.const_get(c) == err.code }
    klass = BY_CODE[err.code] || Error
    # Other ABORTED answers (a session resume race) say something else.
    klass = Deadlock if err.code == GRPC::Core::StatusCodes::ABORTED && err.details.to_s.start_with?('deadlock: ')
    klass.new("#{name}: #{err.details}", code: err.code, details: err.details)
  end
end
