# frozen_string_literal: true

# require 'tumbler' loads the client of the tumbler lock service.
require 'tumbler/client'
