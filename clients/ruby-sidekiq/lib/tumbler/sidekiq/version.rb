# frozen_string_literal: true

module Tumbler
  module Sidekiq
    VERSION = '0.1.0'
  end
end
