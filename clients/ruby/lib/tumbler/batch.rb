# frozen_string_literal: true

# Client#batch: several independent Acquire (try-once), Release and Extend
# calls in one request (LockService.Batch, docs/api.md "Several calls in
# one request"), each answered as its own call would be. Client#release_many
# and Client#try_acquire_each are built on it.
module Tumbler
  class Client
    # The most items the server takes in one Batch request; more are sent
    # in several requests, one after another, in order.
    BATCH_MAX = 256
    # The most bytes of items one request carries: under the server's
    # default request limit (64 KiB, --max-request-bytes) with room for
    # the request's own framing. 256 jobs' locks with long class and queue
    # names in their metadata pass it; they go in several requests.
    BATCH_MAX_BYTES = 60_000

    # Options an item of each kind takes (an Acquire item never waits).
    BATCH_OPTIONS = {
      acquire: %i[holder limit ttl_ms kind metadata priority queue_ttl_ms fair mode prefer_readers permits takes_over],
      release: %i[holder fencing_token fencing_tokens],
      extend: %i[holder ttl_ms fencing_token fencing_tokens]
    }.freeze

    # A request that ends so fails its items, not the batch.
    CUT = [GRPC::Core::StatusCodes::UNAVAILABLE, GRPC::Core::StatusCodes::DEADLINE_EXCEEDED].freeze

    # One item, ready to send: its request, as the Hash a V1::BatchItem is
    # made from ({ release: { name: ..., ... } }: the whole BatchRequest is
    # made by one `new` from such hashes, a few times cheaper than a
    # message made per item and per request in it), and what its answer
    # becomes.
    BatchCall = Struct.new(:kind, :label, :names, :limit, :item)

    # Several independent calls in one request, each answered as its own
    # call would be:
    #
    #   client.batch([
    #     [:acquire, 'report:1', { holder: 'jid-1', ttl_ms: 30_000 }],  # try-once
    #     [:release, 'report:0', { holder: 'jid-0', fencing_token: 7 }],
    #     [:extend, 'report:2', { holder: 'jid-2', ttl_ms: 30_000 }]
    #   ])
    #
    # An item's name may be an Array of names (a multi-lock: all or none,
    # like #acquire_all / #release_all). Returns one result per item, in
    # order, never raising for an item's own failure:
    #   acquire  a Tumbler::Lock (a LockSet for names; already_held? when
    #            this holder held it), or the Tumbler::Busy the single
    #            call would have raised (its #response is the answer)
    #   release  true (released) or false (not held), as #release
    #   extend   a Tumbler::Lock of the extended grant, or nil (not held), as #extend_grant
    #   or the Tumbler::Error the item's own call would have raised
    #   (InvalidArgument with #details naming the field first,
    #   PermissionDenied, Unavailable, ...).
    #
    # Items on one lock run in the given order; the rest together. Above
    # BATCH_MAX items (or BATCH_MAX_BYTES of them), several requests go one
    # after another. Items
    # answered UNAVAILABLE (Redis trouble) are sent again together, in
    # order, with back-off until the deadline (timeout, s), as a single
    # call is retried: an acquire's holder is made before the first try, so
    # a retry that finds its grant answers it (already_held?). A request
    # refused whole raises: ArgumentError here for an item the server would
    # refuse whole (no call, an acquire with wait_ms), Tumbler::InvalidArgument
    # (details naming `items`), Tumbler::Error with RESOURCE_EXHAUSTED (the
    # token's request rate: every item counts as one call), PermissionDenied;
    # when earlier requests of the same call were answered, the error's
    # #batch_results holds their answers (nil for the items not sent).
    # A request that stayed unanswered until the deadline (the server
    # unreachable: Unavailable; or cut: DEADLINE_EXCEEDED) is each of its
    # items' error, as it would be each single call's; they may or may not
    # have landed, and are safe to send again with the same holders.
    def batch(items, timeout: @timeout)
      run_batch(items.map { |kind, name, options| batch_call(kind, name, **(options || {})) }, timeout)
    end

    # Try-once acquires of many locks of the namespace, each on its own
    # (not all or none: see #acquire_all for that), in one request (#batch;
    # more than BATCH_MAX go in several). holder: one holder for all of them
    # (default: one id made here before the first try), or an Array of
    # holders, one per name. The other options are #acquire's but wait_ms.
    # Returns one result per name, in order: a Tumbler::Lock, or the
    # Tumbler::Busy / Tumbler::Error its own acquire would have raised.
    def try_acquire_each(names, holder: nil, **options)
      holder = "rb-#{SecureRandom.hex(16)}" if holder.nil? || holder == ''
      holders = holder.is_a?(Array) ? holder : Array.new(names.size, holder)
      raise ArgumentError, "holder: #{holders.size} holders for #{names.size} names" unless holders.size == names.size

      batch(names.each_with_index.map { |name, i| [:acquire, name, { **options, holder: holders[i] }] })
    end

    # Releases several grants at once, each by its holder and pinned to its
    # fencing token: [[name, holder, fencing_token], ...] -> one result per
    # release, in order: true (released), false (not held) or the
    # Tumbler::Error it failed with. They go in one Batch request (several
    # above BATCH_MAX), over Connect and gRPC alike; those answered
    # UNAVAILABLE are sent again until the deadline (pinned to its token, a
    # second release of one that landed is false and touches nothing).
    def release_many(releases, timeout: @timeout)
      return [] if releases.empty?

      calls = releases.map do |name, holder, token|
        name = name.to_s
        fields = { namespace: namespace, name: name, holder: holder }
        fields[:fencing_token] = token if token
        BatchCall.new(:release, name, nil, nil, { release: fields })
      end
      run_batch(calls, timeout)
    end

    private

    # #batch's work on calls built by batch_call: the requests, retries of
    # the items answered UNAVAILABLE, the results in order.
    def run_batch(calls, timeout)
      deadline = Client.now + timeout
      results = Array.new(calls.size)
      pending = (0...calls.size).to_a
      attempt = 0
      until pending.empty?
        # (every request made before the first is sent: an item the message
        # class refuses raises before anything went)
        slices = batch_slices(pending, calls)
        requests = slices.map { |slice| V1::BatchRequest.new(items: slice.map { |i| calls[i].item }) }
        slices.each_with_index do |slice, k|
          sent = Client.now
          begin
            resp = call(:batch, deadline: deadline) do
              sent = Client.now
              requests[k]
            end
          rescue Error => e
            unless CUT.include?(e.code)
              e.batch_results = results.dup unless results.compact.empty?
              raise
            end

            # The server unreachable until the deadline, or the deadline cut the
            # request: each of its items fails as its own call would have (one
            # already answered UNAVAILABLE, on a retry, keeps that answer).
            slice.each { |i| results[i] = e unless results[i].is_a?(Unavailable) }
            next
          end
          sent = [sent, Client.now - 0.05].max
          if slice.all? { |i| calls[i].kind == :release }
            # Releases' answers read in one conversion (each message field read
            # from Ruby makes an object; a release's answer is one enum)
            slice.zip(resp.to_h[:results]) { |i, result| results[i] = release_result(calls[i], result) }
          else
            slice.zip(resp.results) { |i, result| results[i] = batch_result(calls[i], result, sent) }
          end
        end
        pending = pending.select { |i| results[i].is_a?(Unavailable) }
        break if pending.empty?

        pause = [backoff(attempt), deadline - Client.now - 0.001].min
        break if pause <= 0

        sleep pause
        attempt += 1
      end
      results
    end

    # The pending items in requests of at most BATCH_MAX items and
    # BATCH_MAX_BYTES bytes, in order (an item bigger than that alone:
    # the server says what it makes of it).
    def batch_slices(pending, calls)
      # Most fit in one request: known so from a bound on their sizes, without encoding them.
      if pending.size <= BATCH_MAX && pending.sum { |i| Client.size_bound(calls[i].item) } <= BATCH_MAX_BYTES
        return [pending]
      end

      slices = [[]]
      bytes = 0
      pending.each do |i|
        size = V1::BatchItem.encode(V1::BatchItem.new(calls[i].item)).bytesize + 4
        if !slices.last.empty? && (slices.last.size >= BATCH_MAX || bytes + size > BATCH_MAX_BYTES)
          slices << []
          bytes = 0
        end
        slices.last << i
        bytes += size
      end
      slices
    end

    def batch_call(kind, name, **options)
      kind = kind.to_sym
      allowed = BATCH_OPTIONS[kind]
      raise ArgumentError, "batch: #{kind.inspect} is not :acquire, :release or :extend" unless allowed
      if kind == :acquire && options.key?(:wait_ms) && options[:wait_ms].to_i != 0
        raise ArgumentError, 'batch: an acquire item is try-once (no wait_ms): a wait would hold every other answer back'
      end

      options.each_key do |key|
        next if key == :wait_ms || allowed.include?(key)

        unknown = options.keys - allowed - [:wait_ms]
        raise ArgumentError, "batch: #{kind} takes no #{unknown.join(', ')}"
      end

      names = name.is_a?(Array) ? name.map(&:to_s) : nil
      # Only the fields given (nil: absent), each request built from one hash.
      fields = { namespace: namespace }
      names ? fields[:names] = names : fields[:name] = name.to_s
      case kind
      when :acquire
        holder = options[:holder]
        holder = "rb-#{SecureRandom.hex(16)}" if holder.nil? || holder.empty?
        fields[:holder] = holder
        options.each do |key, value|
          next if value.nil? || key == :holder || key == :wait_ms

          case key
          when :mode then (value = Client.lock_mode(value)) && fields[:mode] = value
          when :prefer_readers then fields[:prefer_readers] = value if value
          when :takes_over then fields[:takes_over] = value unless value.to_s.empty?
          else fields[key] = value
          end
        end
        item = { acquire: fields }
      when :release
        options.each do |key, value|
          next if value.nil?

          fields[key] = key == :fencing_tokens ? value.to_a : value
        end
        item = { release: fields }
      when :extend
        options.each do |key, value|
          next if value.nil?

          fields[key] = key == :fencing_tokens ? value.to_a : value
        end
        item = { extend: fields }
      end
      BatchCall.new(kind, names ? names.join(',') : name.to_s, names, options[:limit], item)
    end

    # An upper bound of the bytes a request's item (a Hash of fields, as
    # BatchCall#item) takes in a BatchRequest: each field at most its
    # value's bytes and 12 of tag, length and varint; each message or map
    # entry in it 12 more.
    # (Summed by each with two block arguments: Hash#sum would make an
    # Array of each pair.)
    def self.size_bound(value)
      case value
      when String then value.bytesize + 12
      when Hash
        total = 12
        value.each { |k, v| total += (k.is_a?(String) ? k.bytesize + 12 : 12) + size_bound(v) }
        total
      when Array
        total = 0
        value.each { |v| total += size_bound(v) }
        total
      when Symbol then value.size + 12 # (an enum's name: its number takes less)
      else 12
      end
    end

    # A release item's answer (from the response's to_h), as #release_many gives it.
    def release_result(call, result)
      if (err = result[:error])
        return Tumbler.error_from(GRPC::BadStatus.new_status_exception(err[:code], err[:message]))
      end

      release = result[:release]
      return release[:status] == :RELEASE_STATUS_RELEASED if release

      Error.new("batch: no answer for #{call.kind} #{call.label}", code: GRPC::Core::StatusCodes::UNKNOWN)
    end

    # One item's answer as its own call's helper would give it.
    def batch_result(call, result, sent)
      case result.result
      when :error
        err = result['error']
        Tumbler.error_from(GRPC::BadStatus.new_status_exception(err.code, err.message))
      when :acquire then batch_acquired(call, result['acquire'], sent)
      when :release then result['release'].status == :RELEASE_STATUS_RELEASED
      when :extend
        resp = result['extend'] # (Object#extend is Ruby's own)
        return nil unless resp.status == :EXTEND_STATUS_EXTENDED

        tokens = call.names && call.item[:extend][:fencing_tokens].to_a
        Lock.new(self, call.label, resp.grant, sent + (resp.grant.ttl_ms / 1000.0), names: call.names,
                                                                                  fencing_tokens: tokens&.empty? ? nil : tokens)
      else
        Error.new("batch: no answer for #{call.kind} #{call.label}", code: GRPC::Core::StatusCodes::UNKNOWN)
      end
    end

    def batch_acquired(call, resp, sent)
      return not_acquired(call.label, resp) if resp.status == :ACQUIRE_STATUS_NOT_ACQUIRED

      already = resp.status == :ACQUIRE_STATUS_ALREADY_HELD
      unless call.names
        return Lock.new(self, call.label, resp.grant, sent + (resp.grant.ttl_ms / 1000.0), already_held: already,
                                                                                          limit: call.limit)
      end

      first = resp.grants.min_by(&:expires_at_ms) || resp.grant
      tokens = call.names.map { |n| resp.grants.find { |g| g.name == n }&.fencing_token }
      lock = Lock.new(self, call.label, first, sent + (first.ttl_ms / 1000.0), limit: call.limit, names: call.names,
                                                                               fencing_tokens: tokens)
      LockSet.new(lock, resp.grants.to_a)
    end
  end
end
