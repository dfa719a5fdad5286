# frozen_string_literal: true

require_relative 'test_helper'
require 'open3'
require 'tmpdir'

# TLS: a second `tumbler serve` over the suite's Redis speaks only TLS,
# with a certificate for 127.0.0.1 signed by a CA made here (openssl). The
# gem uses TLS when its address asks for it (https://, grpcs://) or when
# `tls:` says so, trusting the CA of `tls: { ca_file: }` or
# TUMBLER_TLS_CA_FILE; a real Sidekiq process runs a job through it.
class TlsTest < Minitest::Test
  include SidekiqTestHelpers

  class << self
    attr_reader :dir, :port

    # The CA, the server's certificate and the TLS server, made once.
    def server
      return @port if @port

      @dir = Dir.mktmpdir('tumbler-sidekiq-tls')
      openssl = lambda do |*args|
        out, status = Open3.capture2e('openssl', *args, chdir: @dir)
        raise "openssl #{args.first}: #{out}" unless status.success?
      end
      ec = %w[-newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes]
      openssl.call('req', '-x509', *ec, '-keyout', 'ca.key', '-out', 'ca.pem', '-days', '2', '-subj', '/CN=tumbler-sidekiq test CA',
                   '-addext', 'basicConstraints=critical,CA:TRUE', '-addext', 'keyUsage=critical,keyCertSign,cRLSign')
      openssl.call('req', *ec, '-keyout', 'server.key', '-out', 'server.csr', '-subj', '/CN=127.0.0.1')
      File.write(File.join(@dir, 'server.ext'),
                 "subjectAltName=IP:127.0.0.1\nbasicConstraints=CA:FALSE\nextendedKeyUsage=serverAuth\n")
      openssl.call('x509', '-req', '-in', 'server.csr', '-CA', 'ca.pem', '-CAkey', 'ca.key', '-CAcreateserial',
                   '-out', 'server.pem', '-days', '2', '-extfile', 'server.ext')
      # Another CA, which did not sign the server's certificate.
      openssl.call('req', '-x509', *ec, '-keyout', 'other.key', '-out', 'other.pem', '-days', '2', '-subj', '/CN=another CA')
      pid, @port = TumblerTest.start_tumbler(SidekiqHarness.redis_port, flags: [
                                               '--tls-cert-file', File.join(@dir, 'server.pem'),
                                               '--tls-key-file', File.join(@dir, 'server.key')
                                             ])
      Minitest.after_run do
        TumblerTest.stop(pid)
        FileUtils.rm_rf(@dir)
      end
      @port
    end
  end

  def port = self.class.server
  def ca = File.join(self.class.dir || (self.class.server && self.class.dir), 'ca.pem')

  # A Tumbler::Client made the way the gem makes its own, from these settings.
  # (A refused one gives up after its timeout: UNAVAILABLE is retried until then.)
  def client_for(timeout: 5, **settings)
    config = Tumbler::Sidekiq::Config.new
    settings.each { |k, v| config.public_send("#{k}=", v) }
    target, credentials = config.channel
    Tumbler::Client.new(target, namespace: SidekiqHarness::NAMESPACE, credentials: credentials, timeout: timeout)
  end

  def reaches?(client)
    name = new_tag('tls-probe')
    client.acquire(name, ttl_ms: 5000).release
  rescue Tumbler::Error
    false
  end

  def test_the_address_and_the_tls_setting_choose_the_channel
    config = Tumbler::Sidekiq::Config.new
    { '127.0.0.1:50051' => false, 'http://127.0.0.1:50051' => false, 'grpc://h:1' => false,
      'https://locks.internal:50051' => true, 'grpcs://locks.internal:443/' => true }.each do |address, tls|
      config.address = address
      target, credentials = config.channel
      assert_equal address.sub(%r{\A\w+://}, '').chomp('/'), target
      assert_equal tls, credentials.is_a?(GRPC::Core::ChannelCredentials), "#{address}: TLS?"
    end
    config.address = '127.0.0.1:50051'
    config.tls = true
    assert_kind_of GRPC::Core::ChannelCredentials, config.channel.last, 'tls: true with a plain host:port'
    config.tls = { ca_file: ca }
    assert_kind_of GRPC::Core::ChannelCredentials, config.channel.last, 'tls: { ca_file: } turns it on'
    config.address = 'https://127.0.0.1:50051'
    config.tls = false
    assert_equal :this_channel_is_insecure, config.channel.last, 'tls: false wins over https://'
    config.tls = { ca: ca }
    assert_raises(ArgumentError) { config.channel }
    config.tls = { cert_file: ca }
    assert_raises(ArgumentError, 'a client certificate without its key') { config.channel }
    config.tls = nil
    config.address = 'ftp://127.0.0.1:50051'
    assert_raises(ArgumentError) { config.channel }
  end

  # The gem's own client gets TLS as files, so its unary calls go over
  # Connect through TLS (a grpc credentials object would keep them on gRPC).
  def test_the_gems_client_speaks_connect_through_tls
    saved = %i[address tls].to_h { |k| [k, Tumbler::Sidekiq.config.public_send(k)] }
    Tumbler::Sidekiq.configure(install: false, address: "https://127.0.0.1:#{port}", tls: { ca_file: ca })
    client = Tumbler::Sidekiq.client
    assert_kind_of Tumbler::ConnectStub, client.unary, 'unary calls over Connect'
    assert reaches?(client), 'through TLS'
    config = Tumbler::Sidekiq::Config.new
    config.address = "https://127.0.0.1:#{port}"
    config.credentials = GRPC::Core::ChannelCredentials.new(File.read(ca))
    assert_equal({ credentials: config.credentials }, config.client_settings.last, 'a credentials object is kept')
  ensure
    Tumbler::Sidekiq.configure(install: false, **saved) if saved
  end

  def test_an_https_address_with_the_ca_reaches_the_tls_server_and_nothing_else_does
    assert reaches?(client_for(address: "https://127.0.0.1:#{port}", tls: { ca_file: ca })), 'https:// + tls: { ca_file: }'
    assert reaches?(client_for(address: "grpcs://127.0.0.1:#{port}", tls: { ca_file: ca })), 'grpcs://'
    assert reaches?(client_for(address: "127.0.0.1:#{port}", tls: { ca_file: ca })), 'host:port + tls: { ca_file: }'
    refute reaches?(client_for(address: "127.0.0.1:#{port}", timeout: 1)), 'plaintext to a TLS port'
    refute reaches?(client_for(address: "https://127.0.0.1:#{port}", timeout: 1,
                               tls: { ca_file: File.join(self.class.dir, 'other.pem') })),
           'a certificate another CA signed is refused'
    refute reaches?(client_for(address: "https://127.0.0.1:#{port}", tls: false, timeout: 1)), 'tls: false over https://'
  end

  # A real Sidekiq whose only tumbler address is the TLS port
  # (TUMBLER_ADDR=https://..., TUMBLER_TLS_CA_FILE): the job takes its
  # lock over, holds it while it runs and releases it, through TLS; this
  # process sees the same locks through the plaintext server on the same Redis.
  def test_a_sidekiq_process_runs_a_job_through_tls
    tag = new_tag('tls')
    queue = "q-#{tag}"
    job = UntilExecutedJob.set(queue: queue)
    digest = digest_for(UntilExecutedJob, queue, [tag, 'gate'])
    jid = job.perform_async(tag, 'gate')
    worker = sidekiq(queue, env: { 'TUMBLER_ADDR' => "https://127.0.0.1:#{port}", 'TUMBLER_TLS_CA_FILE' => ca })
    wait_until('the job to start') { starts(tag).any? }
    run = starts(tag).first
    assert_equal [[jid, run['holder'], run['token']]], held_by(digest), 'the run took the lock over through TLS'
    open_gate(tag)
    wait_until('the job to end') { ends(tag).any? }
    assert_equal [%w[end false]], ends(tag).map { |e| [e['e'], e['lost'].to_s] }
    wait_until('released through TLS') { holders(digest).empty? }
    refute_match(/Tumbler::\w+|certificate/, worker.log_text, 'no tumbler error in the worker')
  end
end
