# frozen_string_literal: true

require 'digest'
require 'json'

module Tumbler
  module Sidekiq
    # The digest that names a job's lock. Documented and stable (README,
    # "The digest"): the same job gives the same name in every process,
    # Ruby version and host, and the test suite pins a known vector.
    #
    #   <lock_prefix>:<hex SHA-256 of the canonical JSON of
    #                  {"class": ..., "lock_args": [...], "queue": ...}>
    #
    # Canonical JSON: the lock arguments as Sidekiq stores them (JSON
    # types: symbols become strings), object keys sorted at every level,
    # no whitespace, UTF-8 left unescaped. unique_across_queues drops
    # "queue"; unique_across_workers drops "class". The runtime lock of
    # while_executing and until_and_while_executing is the digest plus ":RUN".
    #
    # The job form (lock_digest_form: :job), shared with other job systems
    # (tumbler-celery's unique={"digest": "job"}), so one logical job is
    # unique whichever of them enqueues it:
    #
    #   tumbler:job:<job name>:<hex SHA-256 of the canonical JSON of [lock args...]>
    #
    # The name is lock_job_name (default: the class name); queue, class and
    # lock_prefix play no part.
    module LockDigest
      JOB_PREFIX = 'tumbler:job:'

      module_function

      def call(class_name:, queue:, lock_args:, prefix:, across_queues: false, across_workers: false)
        fields = {} # (in the canonical order of its keys)
        fields['class'] = class_name.to_s unless across_workers
        fields['lock_args'] = lock_args
        fields['queue'] = queue.to_s unless across_queues
        json = plain?(lock_args) ? JSON.generate(fields) : canonical_json(fields)
        "#{prefix}:#{::Digest::SHA256.hexdigest(json)}"
      end

      def job(name:, lock_args:)
        raise InvalidOptions, 'lock_job_name: a non-empty name of the logical job' if name.to_s.empty?

        "#{JOB_PREFIX}#{name}:#{::Digest::SHA256.hexdigest(canonical_json(lock_args.is_a?(Array) ? lock_args : [lock_args]))}"
      end

      def canonical_json(value)
        return JSON.generate(value) if plain?(value)

        JSON.generate(canonical(JSON.parse(JSON.generate([value]))[0]))
      end

      # Values whose JSON is already canonical (no object, so no keys to
      # sort; each leaf its own JSON once read back): the common arguments.
      PLAIN = [String, Integer, Float, TrueClass, FalseClass, NilClass, Symbol].freeze

      def plain?(value)
        return value.all? { |v| plain?(v) } if value.instance_of?(Array)

        PLAIN.include?(value.class)
      end

      def canonical(value)
        case value
        when Hash then value.keys.sort.to_h { |k| [k, canonical(value[k])] }
        when Array then value.map { |v| canonical(v) }
        else value
        end
      end
    end
  end
end
