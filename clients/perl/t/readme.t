use strict;
use warnings;
use FindBin;
use lib "$FindBin::Bin/lib";
use Test::More;
use Tumbler::Client;
use TumblerTestServer;

# Runs the runnable examples of the README's Examples section (```perl
# blocks; ```perl no-run ones are shown only) against a real server.
my $readme = "$FindBin::Bin/../README.md";
open my $fh, '<', $readme or plan skip_all => "no $readme";
my ($section) = do { local $/; <$fh> } =~ /^## Examples\n(.*?)^## /ms;
my @blocks = ($section // '') =~ /^```perl\n(.*?)^```/msg;
is scalar @blocks, 2, 'the README has two runnable Perl examples';

my $server = TumblerTestServer->start
    or plan skip_all => 'no tumbler binary: set TUMBLER_BIN (or cargo build --bin tumbler)';
END { $server->stop if $server }
my $endpoint = $server->endpoint;

sub run_block {
    my ($code) = @_;
    ok $code =~ s{http://127\.0\.0\.1:50051}{$endpoint}, 'pointed at the test server';
    my ($warned, $out) = ('', '');
    {
        local $SIG{__WARN__} = sub { $warned .= $_[0] };
        open my $save, '>&', \*STDOUT or die "dup: $!";
        close STDOUT;
        open STDOUT, '>', \$out or die "capture: $!";
        my $ok = eval "no strict 'vars'; $code; 1";
        my $err = $@;
        close STDOUT;
        open STDOUT, '>&', $save or die "restore: $!";
        fail("the example died: $err") unless $ok;
    }
    is $warned, '', 'no warnings';
    return $out;
}

our (@batches, @written) = (1 .. 3);
sub write_batch { my ($batch, %o) = @_; push @written, [ $batch, $o{fence} ] }
local $ENV{TUMBLER_TOKEN};
my $out = run_block($blocks[0]);
like $out, qr/fencing token \d+/, "the guard example prints its token: $out";
is scalar @written, 3, 'every batch written';
like $written[0][1], qr/^\d+$/, 'with the fencing token';
my $check = Tumbler::Client->new(endpoint => $endpoint, namespace => 'billing');
is scalar @{ $check->inspect('nightly-report')->{holders} // [] }, 0, 'released after the example';

$out = run_block($blocks[1]);
like $out, qr/^worker slot 1, fencing token \d+$/m, "the concurrency limit example: $out";
$check = Tumbler::Client->new(endpoint => $endpoint);
is scalar @{ $check->inspect('report-workers')->{holders} // [] }, 0, 'its slot released';

done_testing;
