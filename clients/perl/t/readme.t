use strict;
use warnings;
use FindBin;
use lib "$FindBin::Bin/lib";
use Test::More;
use Tumbler::Client;
use TumblerTestServer;

# Runs the README's guard example against a real server.
my $readme = "$FindBin::Bin/../README.md";
open my $fh, '<', $readme or plan skip_all => "no $readme";
my ($code) = do { local $/; <$fh> } =~ /^```perl\n(.*?)^```/ms;
ok $code, 'the README has a Perl example';

my $server = TumblerTestServer->start
    or plan skip_all => 'no tumbler binary: set TUMBLER_BIN (or cargo build --bin tumbler)';
END { $server->stop if $server }

my $endpoint = $server->endpoint;
ok $code =~ s{http://127\.0\.0\.1:50051}{$endpoint}, 'pointed at the test server';
our (@batches, @written) = (1 .. 3);
sub write_batch { my ($batch, %o) = @_; push @written, [ $batch, $o{fence} ] }
local $ENV{TUMBLER_TOKEN};
my $warned = '';
{
    local $SIG{__WARN__} = sub { $warned .= $_[0] };
    eval "no strict 'vars'; $code; 1" or fail("the example died: $@");
}
is $warned, '', 'no warnings';
is scalar @written, 3, 'every batch written';
like $written[0][1], qr/^\d+$/, 'with the fencing token';
my $check = Tumbler::Client->new(endpoint => $endpoint, namespace => 'billing');
is scalar @{ $check->inspect('nightly-report')->{holders} // [] }, 0, 'released after the example';

done_testing;
