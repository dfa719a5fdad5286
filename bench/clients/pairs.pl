#!/usr/bin/env perl
# perl pairs.pl TARGET ADDR CALLERS PAIRS SECS
#
# The Perl arms of bench/clients/run.sh: acquire+release pairs, try-once,
# each caller on its own lock name. TARGET `tumbler` (Tumbler::Client:
# Connect JSON on one kept-alive HTTP::Tiny connection) or `redis` (Redis.pm,
# Debian's libredis-perl: SET key token NX PX ttl, then compare-and-delete
# by EVALSHA). Perl programs run side by side as processes (what
# IPC::ConcurrencyLimit limits), so CALLERS > 1 forks that many processes,
# each with its own client and connection, started together after their
# warm-up. A warm-up of 20 pairs per caller, then up to PAIRS pairs in all,
# cut at SECS seconds. Prints "pairs=N secs=S"; a pair not granted and
# released fails the run.
use strict;
use warnings;
use POSIX ();
use Time::HiRes ();

use constant TTL_MS => 10_000;
use constant UNLOCK => "if redis.call('get',KEYS[1])==ARGV[1] then return redis.call('del',KEYS[1]) end return 0";

my ($target, $addr, $callers, $pairs, $secs) = @ARGV;
die "usage: pairs.pl tumbler|redis ADDR CALLERS PAIRS SECS\n" unless defined $secs;

sub now { Time::HiRes::clock_gettime(Time::HiRes::CLOCK_MONOTONIC()) }

# A caller: its own client, and the pair it runs.
sub make_pair {
    if ($target eq 'tumbler') {
        require Tumbler::Client;
        my $client = Tumbler::Client->new(endpoint => "http://$addr");
        return sub {
            my $name = shift;
            my $g = $client->acquire($name, ttl_ms => TTL_MS);
            $client->release($name, holder => $g->{holder}, fencing_token => $g->{fencing_token})
                or die "release $name: not held\n";
        };
    }
    if ($target eq 'redis') {
        require Redis;
        my $r = Redis->new(server => $addr, reconnect => 0);
        my $sha = $r->script_load(UNLOCK);
        return sub {
            my $name = shift;
            my $token = sprintf '%08x%08x%08x%08x', map { int rand 2**32 } 1 .. 4;
            my $ok = $r->set($name, $token, 'NX', 'PX', TTL_MS);
            die "SET $name: not acquired\n" unless defined $ok && $ok eq 'OK';
            $r->evalsha($sha, 1, $name, $token) == 1 or die "unlock $name: not held\n";
        };
    }
    die "unknown target $target\n";
}

sub share { my $i = shift; int($pairs / $callers) + ($i < $pairs % $callers ? 1 : 0) }

# Runs up to $n pairs until $deadline; the number done.
sub loop {
    my ($pair, $name, $n, $deadline) = @_;
    my $done = 0;
    for (1 .. $n) {
        last if defined $deadline && now() >= $deadline;
        $pair->($name);
        $done++;
    }
    return $done;
}

if ($callers == 1) {
    my $pair = make_pair();
    my $name = "bench-perl-$$-0";
    loop($pair, $name, 20);
    my $start = now();
    my $done = loop($pair, $name, $pairs, $start + $secs);
    printf "pairs=%d secs=%.6f\n", $done, now() - $start;
    exit 0;
}

# CALLERS processes: each reports "ready" after its warm-up, waits for the
# go pipe to close, runs its share and reports its count.
pipe(my $ready_r, my $ready_w) or die "pipe: $!";
pipe(my $go_r, my $go_w) or die "pipe: $!";
pipe(my $done_r, my $done_w) or die "pipe: $!";
my @pids;
for my $i (0 .. $callers - 1) {
    my $pid = fork // die "fork: $!";
    if (!$pid) {
        close $_ for $ready_r, $go_w, $done_r;
        my $ok = eval {
            my $pair = make_pair();
            my $name = "bench-perl-$$-$i";
            loop($pair, $name, 20);
            syswrite $ready_w, "r";
            sysread($go_r, my $buf, 1);    # EOF: go
            my $done = loop($pair, $name, share($i), now() + $secs);
            syswrite $done_w, "$done\n";
            1;
        };
        print STDERR "perl $target caller $i: $@" unless $ok;
        POSIX::_exit($ok ? 0 : 1);
    }
    push @pids, $pid;
}
close $_ for $ready_w, $go_r, $done_w;
my $got = 0;
while ($got < $callers) {
    my $n = sysread($ready_r, my $buf, $callers);
    last unless $n;
    $got += $n;
}
my $start = now();
close $go_w;
my $done = 0;
while (my $line = <$done_r>) { $done += $line }
my $failed = 0;
for my $pid (@pids) { waitpid $pid, 0; $failed++ if $? }
my $elapsed = now() - $start;
die "perl $target: $failed of $callers callers failed\n" if $failed || $got < $callers;
printf "pairs=%d secs=%.6f\n", $done, $elapsed;
