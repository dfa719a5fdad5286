# frozen_string_literal: true

# The tumbler-sidekiq gem: sidekiq-unique-jobs' lock types and conflict
# strategies (and Sidekiq Enterprise's unique_for) on the tumbler lock
# service, through the tumbler-client gem.
require_relative 'lib/tumbler/sidekiq/version'

Gem::Specification.new do |s|
  s.name = 'tumbler-sidekiq'
  s.version = Tumbler::Sidekiq::VERSION
  s.summary = 'Unique Sidekiq jobs on the tumbler lock service: sidekiq-unique-jobs options, leases kept alive while jobs run'
  s.description = 'Client and server middleware with the lock types (until_executing, until_executed, until_expired, ' \
                  'until_and_while_executing, while_executing) and conflict strategies of sidekiq-unique-jobs, ' \
                  "Sidekiq Enterprise's unique_for/unique_until, per-digest concurrency limits and fencing tokens, " \
                  'kept in tumbler instead of the app\'s own Redis.'
  s.authors = ['tumbler']
  s.license = 'MIT'
  s.required_ruby_version = '>= 3.0'
  s.files = Dir.chdir(__dir__) { Dir['lib/**/*.rb'] + ['README.md'] }
  s.require_paths = ['lib']
  s.add_dependency 'sidekiq', '>= 6.4', '< 7'
  s.add_dependency 'tumbler-client', '~> 0.3'
end
