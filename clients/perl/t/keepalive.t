use strict;
use warnings;
use FindBin;
use lib "$FindBin::Bin/lib";
use Test::More;
use Time::HiRes ();
use Tumbler::Client;
use TumblerTestServer;

# The small-write stall: a request written as head and body in two writes,
# on a kept-alive connection without TCP_NODELAY, waits for the server's
# delayed ACK (about 40 ms on Linux) before its body leaves. A call on
# loopback takes well under a millisecond without it; 10 ms is far from
# both, so this tests the stall, not the machine's speed.
my $server = TumblerTestServer->start
    or plan skip_all => 'no tumbler binary: set TUMBLER_BIN (or cargo build --bin tumbler)';
END { $server->stop if $server }

sub now { Time::HiRes::clock_gettime(Time::HiRes::CLOCK_MONOTONIC()) }
sub median { my @s = sort { $a <=> $b } @_; return $s[ $#s / 2 ] }

# The local port of the client's kept-alive connection (its own for http,
# HTTP::Tiny's for https).
sub local_port {
    my $c = shift;
    my $fh = $c->{wire} ? $c->{wire}{fh} : $c->{http}{handle} && $c->{http}{handle}{fh};
    return $fh ? $fh->sockport : undef;
}

my $client = Tumbler::Client->new(endpoint => $server->endpoint, timeout => 5);
$client->inspect('stall');   # the connection's first call
my $port = local_port($client);
ok $port, 'a connection is open after the first call';

my @ms;
for (1 .. 20) {
    my $t0 = now();
    my $g = $client->acquire('stall', ttl_ms => 5000);
    my $t1 = now();
    ok $client->release('stall', holder => $g->{holder}, fencing_token => $g->{fencing_token}), 'released'
        or last;
    push @ms, ($t1 - $t0) * 1000, (now() - $t1) * 1000;
}
is local_port($client), $port, 'every call went on the one kept-alive connection';
my $median = median(@ms);
cmp_ok $median, '<', 10, sprintf('a kept-alive call waits on no delayed ACK: median of %d calls %.2f ms (max %.2f)',
    scalar @ms, $median, (sort { $b <=> $a } @ms)[0]);

done_testing;
