# frozen_string_literal: true

# Building the gem without the gRPC tools says which package to install,
# rather than an exit status (`gem build` runs generate.sh).
require 'minitest/autorun'
require 'open3'

class GenerateTest < Minitest::Test
  GENERATE = File.expand_path('../generate.sh', __dir__)

  def test_a_missing_protoc_names_the_package_to_install
    out, status = Open3.capture2e({ 'GRPC_TOOLS_RUBY_PROTOC' => 'no-such-grpc-tools-protoc' }, GENERATE)
    refute status.success?, out
    assert_match(/no-such-grpc-tools-protoc not found/, out)
    assert_match(/apt-get install -y ruby-grpc-tools/, out)
  end
end
