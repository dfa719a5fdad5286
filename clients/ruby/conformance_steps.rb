#!/usr/bin/env ruby
# frozen_string_literal: true

# Ruby's steps of the cross-language conformance scenario (clients/conformance).
# usage: conformance_steps.rb ADDR NAMESPACE STEP ARGS...   — prints one JSON line.
$LOAD_PATH.unshift File.join(__dir__, 'lib')
require 'json'
require 'tumbler/client'

def grant_json(lock)
  { holder: lock.holder, token: lock.fencing_token.to_s, slot: lock.slot,
    acquired_at_ms: lock.grant.acquired_at_ms }
end

def run(client, step, args)
  ns = client.namespace
  case step
  when 'hold' # NAME HOLDER LIMIT
    begin
      lock = client.acquire(args[0], holder: args[1], limit: Integer(args[2]), ttl_ms: 60_000)
      { status: 'ACQUIRED', **grant_json(lock) }
    rescue Tumbler::NotAcquired => e
      { status: e.busy? ? 'BUSY' : 'TIMEOUT', holders: e.response.holders }
    end
  when 'release' # NAME HOLDER
    resp = client.stub.release(Tumbler::V1::ReleaseRequest.new(namespace: ns, name: args[0], holder: args[1]))
    { released: resp.status == :RELEASE_STATUS_RELEASED }
  when 'wait' # NAME HOLDER WAIT_MS HOLD_MS
    client.lock(args[0], holder: args[1], wait_ms: Integer(args[2]), ttl_ms: 60_000) do |lock|
      out = grant_json(lock)
      sleep Integer(args[3]) / 1000.0
      out.merge(released_at_ms: (Time.now.to_f * 1000).to_i)
    end
  when 'scoped' # NAME
    out = client.lock(args[0], ttl_ms: 2000) do |lock|
      o = grant_json(lock)
      before = lock.grant.expires_at_ms
      sleep 0.05
      lock.extend_lease(30_000)
      o.merge(extended: lock.grant.expires_at_ms > before)
    end
    out.merge(holders_after: client.inspect_lock(args[0]).holders.size)
  when 'inspect' # NAME
    info = client.inspect_lock(args[0])
    queue = client.stub.queue(Tumbler::V1::QueueRequest.new(namespace: ns, name: args[0]))
    { limit: info.limit, waiters: info.waiters,
      holders: info.holders.map { |h| { holder: h.grant.holder, token: h.grant.fencing_token.to_s, slot: h.grant.slot } },
      queue: queue.requests.map(&:holder) }
  when 'invalid' # bad input: queue_ttl_ms below 100
    begin
      client.acquire('conformance-invalid', wait_ms: 10, queue_ttl_ms: 5)
      { field: 'queue_ttl_ms', code: 'OK' }
    rescue GRPC::BadStatus => e
      code = GRPC::Core::StatusCodes.constants.find { |c| GRPC::Core::StatusCodes.const_get(c) == e.code }
      { field: 'queue_ttl_ms', code: code.to_s, message: e.details }
    end
  else
    raise "unknown step #{step}"
  end
end

addr, namespace, step, *args = ARGV
puts JSON.generate(run(Tumbler::Client.new(addr, namespace: namespace), step, args))
