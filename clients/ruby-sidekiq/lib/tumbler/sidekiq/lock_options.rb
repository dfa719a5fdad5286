# frozen_string_literal: true

module Tumbler
  module Sidekiq
    # A job's lock settings, from its hash and its class's sidekiq_options,
    # spelled as sidekiq-unique-jobs spells them, with Sidekiq Enterprise's
    # unique_for / unique_until as an alias. nil when the job is not unique.
    class LockOptions
      TYPES = %i[until_executing until_executed until_expired until_and_while_executing while_executing].freeze
      # Which lock types take a lock when the job is pushed, and which hold one while it runs.
      CLIENT_TYPES = %i[until_executing until_executed until_expired until_and_while_executing].freeze
      RUNTIME_TYPES = %i[while_executing until_and_while_executing].freeze
      CLIENT_STRATEGIES = %i[log raise reject replace reschedule].freeze
      SERVER_STRATEGIES = %i[log raise reject reschedule].freeze
      # lock_digest_form: the gem's own digest (default), or the job form
      # shared with other job systems (LockDigest.job).
      DIGEST_FORMS = %i[default job].freeze

      attr_reader :type, :ttl, :timeout, :limit, :prefix, :on_client_conflict, :on_server_conflict,
                  :schedule_in, :execution_ttl, :job_class, :digest_form

      # job_class: the class (or its name); item: the job hash.
      def self.for(job_class, item, config = Sidekiq.config)
        klass = constantize(job_class || item['class'])
        opts = Options.new(item, class_options(klass))
        type = opts['lock'] || opts['unique'] # `unique:` is sidekiq-unique-jobs' older name
        unique_for = opts['unique_for']
        return nil if (type.nil? || type == false) && unique_for.nil?

        new(klass, item, opts, config)
      end

      @class_options = {}.compare_by_identity # class -> [its options Hash, with String keys, size]
      @class_options_lock = Mutex.new

      # The class's sidekiq_options with String keys: made again only when
      # they changed (sidekiq_options replaces the class's Hash; the same
      # Hash object with the same size is taken as unchanged), not per job.
      def self.class_options(klass)
        return {} unless klass.respond_to?(:get_sidekiq_options)

        raw = klass.get_sidekiq_options
        cached = @class_options[klass]
        return cached[1] if cached && cached[0].equal?(raw) && cached[2] == raw.size

        opts = raw.transform_keys(&:to_s)
        @class_options_lock.synchronize { @class_options[klass] = [raw, opts, raw.size] }
        opts
      end

      def self.constantize(name)
        return name unless name.is_a?(String)

        name.split('::').reject(&:empty?).inject(Object) { |mod, part| mod.const_get(part, false) }
      rescue NameError
        nil
      end

      # item first (per-push overrides with Job.set), the class's options
      # next; a callable (Proc, Symbol) is only ever taken from the class,
      # since in the job hash it has been through JSON.
      class Options
        def initialize(item, class_opts)
          @item = item
          @class_opts = class_opts
        end

        CALLABLE = %w[lock_args_method unique_args lock_ttl lock_expiration].freeze

        def [](key)
          from_class = @class_opts[key]
          return from_class if from_class.is_a?(Proc) || from_class.is_a?(Symbol) && CALLABLE.include?(key)

          @item.key?(key) ? @item[key] : from_class
        end

        def key?(key) = @item.key?(key) || @class_opts.key?(key)
      end

      def initialize(klass, item, opts, config)
        @job_class = klass
        @opts = opts
        unique_for = opts['unique_for']
        type = opts['lock'] || opts['unique']
        type = enterprise_type(opts['unique_until']) if type.nil? || type == false
        @type = type.to_sym
        raise InvalidOptions, "lock: #{type.inspect} is not one of #{TYPES.join(', ')}" unless TYPES.include?(@type)

        ttl = opts['lock_ttl']
        ttl = opts['lock_expiration'] if ttl.nil? # sidekiq-unique-jobs' older name
        ttl = unique_for if ttl.nil?
        @ttl = seconds(callable(ttl, item), 'lock_ttl') || (config.lock_ttl && seconds(config.lock_ttl, 'lock_ttl'))
        @timeout = opts.key?('lock_timeout') ? opts['lock_timeout'] : config.lock_timeout
        @timeout = seconds(@timeout, 'lock_timeout')
        @limit = Integer(opts['lock_limit'] || 1)
        raise InvalidOptions, "lock_limit: must be 1 or more, not #{@limit}" if @limit < 1

        @prefix = (opts['lock_prefix'] || opts['unique_prefix'] || config.lock_prefix).to_s
        @schedule_in = seconds(opts['schedule_in'], 'schedule_in') || config.schedule_in
        @execution_ttl = seconds(opts['execution_ttl'], 'execution_ttl') || config.execution_ttl
        on_conflict = opts['on_conflict'] || config.on_conflict
        @on_client_conflict = strategy(on_conflict, 'client', CLIENT_STRATEGIES)
        @on_server_conflict = strategy(on_conflict, 'server', SERVER_STRATEGIES)
        @digest_form = (opts['lock_digest_form'] || :default).to_sym
        return if DIGEST_FORMS.include?(@digest_form)

        raise InvalidOptions, "lock_digest_form: #{@digest_form.inspect} is not one of #{DIGEST_FORMS.join(', ')}"
      end

      def client_lock? = CLIENT_TYPES.include?(type)
      def runtime_lock? = RUNTIME_TYPES.include?(type)

      # The metrics label of the lock in tumbler: the lock type.
      def kind = type.name # (a frozen String, made once)

      def across_queues? = truthy(@opts['unique_across_queues'])
      def across_workers? = truthy(@opts['unique_across_workers'])

      # The arguments that form the digest: lock_args_method (a Proc, or the
      # name of a class method), else the class's lock_args (or unique_args)
      # method, else every argument.
      def lock_args(args)
        method = @opts['lock_args_method'] || @opts['unique_args']
        method ||= :lock_args if job_class.respond_to?(:lock_args)
        method ||= :unique_args if job_class.respond_to?(:unique_args)
        return args if method.nil? || method == false

        json_args = JSON.parse(JSON.generate(args))
        case method
        when Proc then method.call(json_args)
        when Symbol, String then job_class.public_send(method, json_args)
        else raise InvalidOptions, "lock_args_method: a Proc or a class method's name, not #{method.class}"
        end
      end

      # The job form's name of the logical job: lock_job_name, else the class name.
      def job_name(item) = (@opts['lock_job_name'] || item['class']).to_s

      def digest(item)
        return LockDigest.job(name: job_name(item), lock_args: lock_args(item['args'] || [])) if digest_form == :job

        LockDigest.call(class_name: item['class'], queue: item['queue'], lock_args: lock_args(item['args'] || []),
                        prefix: prefix, across_queues: across_queues?, across_workers: across_workers?)
      end

      private

      def enterprise_type(unique_until)
        case unique_until&.to_s
        when nil, 'success' then :until_executed
        when 'start' then :until_executing
        else raise InvalidOptions, "unique_until: :start or :success, not #{unique_until.inspect}"
        end
      end

      def callable(value, item)
        case value
        when Proc then value.call(item['args'])
        when Symbol then job_class.public_send(value, item['args'])
        else value
        end
      end

      # Seconds as a Float from an Integer, Float, numeric String or an
      # ActiveSupport::Duration (1.minute).
      def seconds(value, name)
        return nil if value.nil?
        return value.to_f if value.is_a?(Numeric) || value.respond_to?(:in_seconds)

        Float(value)
      rescue ArgumentError, TypeError
        raise InvalidOptions, "#{name}: seconds (a number or a duration), not #{value.inspect}"
      end

      # One strategy for both sides, or { client: ..., server: ... }. A
      # single :replace (a client strategy) means :log on the server side,
      # as in sidekiq-unique-jobs; a hash that names a strategy for the wrong
      # side is refused.
      def strategy(on_conflict, side, allowed)
        hash = on_conflict.is_a?(Hash)
        value = hash ? (on_conflict[side] || on_conflict[side.to_sym]) : on_conflict
        return :log if value.nil? || value == false

        value = value.to_sym
        return value if allowed.include?(value)
        return :log if !hash && (CLIENT_STRATEGIES | SERVER_STRATEGIES).include?(value)

        raise InvalidOptions, "on_conflict: #{side}: #{value.inspect} is not one of #{allowed.join(', ')}"
      end

      def truthy(value) = value == true || value.to_s == 'true'
    end
  end
end
