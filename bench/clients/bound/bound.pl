#!/usr/bin/env perl
# perl bound.pl MODE ADDR PAIRS
#
# The floor under the Perl client (issue 50 item 4): what one call costs
# in Perl doing nothing else, against the same server the client bench
# uses. One caller, sequential calls, a warm-up of 200, then PAIRS
# acquire+release pairs. Prints "MODE: N µs per call". MODE:
#
#   connect-pairs   a bare kept-alive TCP socket (TCP_NODELAY, one write per
#                   request): the same Connect JSON Acquire and Release the
#                   client sends, requests built once, each answer read by
#                   its Content-Length and decoded (Cpanel::JSON::XS or
#                   JSON::XS when installed, else JSON::PP, as the client)
#   httptiny-pairs  the same requests through HTTP::Tiny alone (kept alive,
#                   TCP_NODELAY set), answers decoded alike
#
# A "call" is one acquire or one release (half a pair), as in run.sh.
# Core modules only (an XS JSON module is used when installed).
use strict;
use warnings;
use HTTP::Tiny;
use IO::Socket::INET;
use Socket qw(IPPROTO_TCP TCP_NODELAY);
use Time::HiRes ();

my ($mode, $addr, $n) = @ARGV;
die "usage: bound.pl connect-pairs|httptiny-pairs ADDR PAIRS\n" unless defined $n;
my ($json_class) = grep { eval "require $_; 1" } $ENV{TUMBLER_JSON_PP} ? () : (q(Cpanel::JSON::XS), q(JSON::XS)), q(JSON::PP);
my $json = $json_class->new->utf8;
my $name = "bound-pl-$mode-$$";
my $acq = qq({"name":"$name","holder":"bound-pl","ttlMs":"10000"});
my $rel = qq({"name":"$name","holder":"bound-pl"});

sub now { Time::HiRes::clock_gettime(Time::HiRes::CLOCK_MONOTONIC()) }

my $pair;
if ($mode eq 'connect-pairs') {
    my $sock = IO::Socket::INET->new(PeerAddr => $addr, Proto => 'tcp') or die "connect $addr: $@\n";
    setsockopt($sock, IPPROTO_TCP, TCP_NODELAY, 1) or die "TCP_NODELAY: $!\n";
    binmode $sock;
    my $request = sub {
        my ($method, $body) = @_;
        "POST /tumbler.v1.LockService/$method HTTP/1.1\r\nHost: $addr\r\nContent-Type: application/json\r\n"
            . 'Content-Length: ' . length($body) . "\r\n\r\n" . $body;
    };
    my ($a_req, $r_req) = ($request->(Acquire => $acq), $request->(Release => $rel));
    my $buf = '';
    my $call = sub {
        my $req = shift;
        syswrite($sock, $req) == length $req or die "write: $!\n";
        while (1) {
            my $end = index $buf, "\r\n\r\n";
            if ($end >= 0) {
                my ($len) = substr($buf, 0, $end) =~ /^content-length:\s*(\d+)/mi;
                if (length($buf) >= $end + 4 + $len) {
                    my $body = substr $buf, $end + 4, $len;
                    substr($buf, 0, $end + 4 + $len) = '';
                    return $json->decode($body);
                }
            }
            sysread($sock, $buf, 65536, length $buf) or die "read: $!\n";
        }
    };
    $pair = sub {
        $call->($a_req)->{status} eq 'ACQUIRE_STATUS_ACQUIRED' or die "not acquired\n";
        $call->($r_req)->{status} eq 'RELEASE_STATUS_RELEASED' or die "not released\n";
    };
} elsif ($mode eq 'httptiny-pairs') {
    package NoDelay { our @ISA = ('HTTP::Tiny');
        sub _open_handle { my $h = shift->SUPER::_open_handle(@_); setsockopt($h->{fh}, Socket::IPPROTO_TCP(), Socket::TCP_NODELAY(), 1); $h } }
    my $http = NoDelay->new(keep_alive => 1);
    my %opts = (headers => { 'content-type' => 'application/json' });
    my $url = "http://$addr/tumbler.v1.LockService";
    my $call = sub {
        my $res = $http->request(POST => "$url/$_[0]", { %opts, content => $_[1] });
        $res->{status} == 200 or die "$res->{status} $res->{content}\n";
        return $json->decode($res->{content});
    };
    $pair = sub {
        $call->(Acquire => $acq)->{status} eq 'ACQUIRE_STATUS_ACQUIRED' or die "not acquired\n";
        $call->(Release => $rel)->{status} eq 'RELEASE_STATUS_RELEASED' or die "not released\n";
    };
} else {
    die "unknown mode $mode\n";
}
$pair->() for 1 .. 200;
my $t0 = now();
$pair->() for 1 .. $n;
printf "%s: %.0f µs per call (JSON by %s)\n", $mode, (now() - $t0) / (2 * $n) * 1e6, $json_class;
