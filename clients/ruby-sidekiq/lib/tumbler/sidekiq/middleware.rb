# frozen_string_literal: true

module Tumbler
  module Sidekiq
    module Middleware
      # Values that cannot go through JSON (a Proc, an ActiveSupport::Duration)
      # are turned into what the server reads (seconds) or dropped from the
      # job hash (a Proc stays in the class's sidekiq_options, where the
      # server reads it).
      SANITIZED = %w[lock_args_method unique_args lock_ttl lock_expiration unique_for lock_timeout
                     execution_ttl schedule_in].freeze

      def self.sanitize(item)
        SANITIZED.each do |key|
          value = item[key]
          if value.is_a?(Proc) || value.is_a?(Symbol) && key.end_with?('args', 'method')
            item.delete(key)
          elsif value.respond_to?(:in_seconds)
            item[key] = value.to_i
          end
        end
      end

      # Sidekiq client middleware: takes the lock of until_* jobs when they
      # are pushed (perform_async, perform_in, and Sidekiq's own pushes of
      # scheduled jobs and retries, which find their grant already held);
      # inside a push_bulk, the locks of all its jobs in one request (Bulk).
      class Client
        def call(worker_class, item, _queue, _redis_pool = nil, &push)
          return yield unless Sidekiq.config.enabled

          options = LockOptions.for(worker_class, item)
          return yield unless options

          Middleware.sanitize(item)
          bulk = Bulk.current
          return JobLock.new(options, item).defer_push(bulk, &push) if bulk

          JobLock.new(options, item).push(&push)
        end
      end

      # Sidekiq server middleware: runs each job under its lock type's rules
      # (execution lease kept alive by a watchdog, runtime lock, conflicts).
      class Server
        def call(worker, item, _queue, &perform)
          return yield unless Sidekiq.config.enabled

          options = LockOptions.for(worker.class, item)
          return yield unless options

          JobLock.new(options, item).execute(worker, &perform)
        ensure
          Thread.current[:tumbler_sidekiq_lock] = nil # the next job on this thread holds nothing yet
        end
      end
    end
  end
end
