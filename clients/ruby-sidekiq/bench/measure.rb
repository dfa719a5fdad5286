# frozen_string_literal: true

# What the gem's benches (run.rb, bulk.rb, keeper.rb, and app.rb inside the
# Sidekiq process) share: a process's CPU from /proc, the server's RPC
# counts from its /metrics, and the keeper's releases as they went before
# Batch (an HTTP/1.1 pipeline of Release requests on one connection), for
# the A/B arms.
require 'etc'
require 'net/http'

# CPU seconds (user + system) a process has used so far (Linux /proc).
def cpu_s(pid)
  fields = File.read("/proc/#{pid}/stat").split(') ').last.split
  (Integer(fields[11]) + Integer(fields[12])) / Float(Etc.sysconf(Etc::SC_CLK_TCK))
end

# tumbler_rpc_requests_total by method, as the server counts them.
def rpc_counts(http_port)
  body = Net::HTTP.get(URI("http://127.0.0.1:#{http_port}/metrics"))
  body.scan(/^tumbler_rpc_requests_total\{method="(\w+)",code="\w+"\} (\d+)/)
      .each_with_object(Hash.new(0)) { |(m, v), h| h[m] += Integer(v) }
end

# Client#release_many as it was before Batch: one pipeline of Releases.
module PipelineReleases
  def release_many(releases, timeout: 10.0)
    requests = releases.map do |name, holder, token|
      Tumbler::V1::ReleaseRequest.new(namespace: namespace, name: name, holder: holder, fencing_token: token)
    end
    unary.pipeline(:release, requests, Tumbler::Client.now + timeout, metadata).map do |resp|
      resp.is_a?(GRPC::BadStatus) ? Tumbler.error_from(resp) : resp.status == :RELEASE_STATUS_RELEASED
    end
  end
end
