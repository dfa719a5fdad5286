# frozen_string_literal: true

# require 'tumbler' loads the client of the tumbler lock service;
# Tumbler::QueuedLocks (the redis_queued_locks-style API) loads on first use.
require 'tumbler/client'

module Tumbler
  autoload :QueuedLocks, 'tumbler/queued_locks'
end
