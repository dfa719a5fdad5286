#!/usr/bin/env perl
# What a call costs: sequential acquire+release pairs on one kept-alive
# connection, after a warm-up, in µs per call.
#
#   perl -Ilib bench/pairs.pl http://127.0.0.1:50051 2000
use strict;
use warnings;
use Time::HiRes ();
use Tumbler::Client;

my $endpoint = $ARGV[0] // 'http://127.0.0.1:50051';
my $pairs    = $ARGV[1] // 2000;
my $client   = Tumbler::Client->new(endpoint => $endpoint, timeout => 10, ca_file => $ENV{TUMBLER_CA_FILE});

sub pair {
    my $g = $client->acquire('perl-bench', ttl_ms => 10_000);
    $client->release('perl-bench', holder => $g->{holder}, fencing_token => $g->{fencing_token})
        or die "not released\n";
}
pair() for 1 .. 20;
my $t0 = Time::HiRes::clock_gettime(Time::HiRes::CLOCK_MONOTONIC());
pair() for 1 .. $pairs;
my $s = Time::HiRes::clock_gettime(Time::HiRes::CLOCK_MONOTONIC()) - $t0;
printf "%d pairs in %.3f s: %.0f pairs/s, %.0f µs per call\n", $pairs, $s, $pairs / $s, $s / $pairs / 2 * 1e6;
