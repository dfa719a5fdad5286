# frozen_string_literal: true

# The tumbler-client gem. `gem build tumbler-client.gemspec` generates the
# stubs from the repository's proto (generate.sh) into lib/tumbler/v1 and
# packs them; the installed gem never runs protoc.
stubs = File.join(__dir__, 'lib', 'tumbler', 'v1', 'lock_services_pb.rb')
proto = File.join(__dir__, '..', '..', 'proto', 'tumbler', 'v1', 'lock.proto')
if File.exist?(proto) && (!File.exist?(stubs) || File.mtime(stubs) < File.mtime(proto))
  system(File.join(__dir__, 'generate.sh'), exception: true)
end

Gem::Specification.new do |s|
  s.name = 'tumbler-client'
  s.version = '0.3.0'
  s.summary = 'Client for the tumbler lock service: scoped locks kept alive by a lease watchdog, safe retries, fencing tokens'
  s.description = 'Acquire, extend and release tumbler locks (unary calls over Connect on kept-alive HTTP/1.1, streams over gRPC). Client#lock holds a grant for a block, ' \
                  'renews it every third of its lease and raises LockLost in the block the moment it is lost.'
  s.authors = ['tumbler']
  s.license = 'MIT'
  s.required_ruby_version = '>= 3.0'
  s.files = Dir.chdir(__dir__) { Dir['lib/**/*.rb'] + Dir['proto/**/*.proto'] + ['README.md'] }
  s.require_paths = ['lib']
  s.add_dependency 'google-protobuf', '>= 3.21', '< 5'
  s.add_dependency 'grpc', '~> 1.50'
end
