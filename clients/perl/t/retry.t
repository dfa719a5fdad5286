use strict;
use warnings;
use FindBin;
use lib "$FindBin::Bin/lib";
use Test::More;
use File::Temp ();
use IO::Socket::INET;
use JSON::PP ();
use POSIX ();
use Tumbler::Client;

# A scripted HTTP server in a child process: it answers the requests in
# turn with the given responses and records each request (headers and body)
# for the test. No tumbler server is needed.
sub scripted {
    my @responses = @_;
    my $listen = IO::Socket::INET->new(LocalAddr => '127.0.0.1', LocalPort => 0, Listen => 5, ReuseAddr => 1)
        or die "listen: $!";
    my $log = File::Temp->new;
    my $pid = fork // die "fork: $!";
    if (!$pid) {
        for my $r (@responses) {
            my $c = $listen->accept or last;
            my $head = '';
            while (defined(my $line = <$c>)) { $head .= $line; last if $line eq "\r\n" }
            my ($len) = $head =~ /^content-length:\s*(\d+)/mi;
            read $c, my $body, $len // 0;
            open my $fh, '>>', $log->filename; print $fh JSON::PP->new->canonical->encode({ head => $head, body => $body }), "\n"; close $fh;
            my ($status, $json) = @$r;
            print $c "HTTP/1.1 $status X\r\nContent-Type: application/json\r\nContent-Length: "
                . length($json) . "\r\nConnection: close\r\n\r\n$json";
            close $c;
        }
        POSIX::_exit(0);
    }
    my $port = $listen->sockport;
    close $listen;
    return ("http://127.0.0.1:$port", $pid, $log);
}

sub requests {
    my $log = shift;
    open my $fh, '<', $log->filename or return ();
    return map { JSON::PP->new->decode($_) } <$fh>;
}

subtest '503 unavailable is retried with the same holder' => sub {
    my $unavailable = '{"code":"unavailable","message":"unavailable: no redis connection"}';
    my ($endpoint, $pid, $log) = scripted(
        [ 503, $unavailable ], [ 503, $unavailable ],
        [ 200, '{"status":"ACQUIRE_STATUS_ACQUIRED","grant":{"holder":"h","fencingToken":"1795670745624591","ttlMs":"1000"},"holders":1}' ],
    );
    my $client = Tumbler::Client->new(endpoint => $endpoint, timeout => 5, token => 's3cret');
    my $g = $client->acquire('r', ttl_ms => 1000);
    is $g->{fencing_token}, '1795670745624591', 'acquired on the third attempt';
    waitpid $pid, 0;
    my @req = requests($log);
    is scalar @req, 3, 'three requests';
    my @holders = map { JSON::PP->new->decode($_->{body})->{holder} } @req;
    ok defined $holders[0] && length $holders[0], 'a holder made by the client';
    is_deeply \@holders, [ ($holders[0]) x 3 ], 'the same holder on every attempt';
    like $req[0]{head}, qr{^POST /tumbler\.v1\.LockService/Acquire HTTP/1\.1\r\n}, 'the Connect route';
    like $req[0]{head}, qr{^content-type: application/json\r$}mi, 'JSON';
    like $req[0]{head}, qr{^authorization: Bearer s3cret\r$}mi, 'the bearer token';
    like $req[0]{head}, qr{^connect-timeout-ms: \d+\r$}mi, 'the deadline';
    is(JSON::PP->new->decode($req[0]{body})->{ttlMs}, '1000', 'ttlMs as a string');
};

subtest 'denied and other errors are not retried' => sub {
    my ($endpoint, $pid, $log) = scripted(
        [ 401, '{"code":"unauthenticated","message":"missing bearer token"}' ],
        [ 403, '{"code":"permission_denied","message":"token may not use namespace other"}' ],
        [ 500, 'not json' ],
    );
    my $client = Tumbler::Client->new(endpoint => $endpoint, timeout => 5);
    for my $want ([ 'unauthenticated', 401 ], [ 'permission_denied', 403 ]) {
        my $e = eval { $client->inspect('r'); 1 } ? undef : $@;
        isa_ok $e, 'Tumbler::Error::Denied';
        is $e->kind, 'denied', 'kind denied';
        is $e->code, $want->[0], "code $want->[0]";
        is $e->http_status, $want->[1], "HTTP $want->[1]";
    }
    my $e = eval { $client->inspect('r'); 1 } ? undef : $@;
    isa_ok $e, 'Tumbler::Error';
    is $e->code, 'unknown', 'a body that is not Connect\'s: the code from the HTTP status';
    waitpid $pid, 0;
    is scalar(my @r = requests($log)), 3, 'one request each';
};

# The raw answers the client's own HTTP/1.1 reading meets: chunked, a
# body ended by the connection's close, and a kept-alive connection the
# server closed between two calls (the next call opens another).
subtest 'chunked, read-to-close, and a kept-alive connection closed by the server' => sub {
    my $listen = IO::Socket::INET->new(LocalAddr => '127.0.0.1', LocalPort => 0, Listen => 5, ReuseAddr => 1)
        or die "listen: $!";
    my @answers = (
        "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n"
            . "7\r\n{\"name\"\r\nb\r\n:\"chunked\"}\r\n0\r\n\r\n",
        "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n\r\n{\"name\":\"to-close\"}",
        "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 16\r\n\r\n{\"name\":\"again\"}",
    );
    my $pid = fork // die "fork: $!";
    if (!$pid) {
        # The first answer on a connection kept open, then closed by the
        # server; the second on a new one, ended by its close; the third.
        for my $i (0 .. 2) {
            my $c = $listen->accept or last;
            my $head = '';
            while (defined(my $line = <$c>)) { $head .= $line; last if $line eq "\r\n" }
            my ($len) = $head =~ /^content-length:\s*(\d+)/mi;
            read $c, my $body, $len // 0;
            print $c $answers[$i];
            close $c;
        }
        POSIX::_exit(0);
    }
    my $port = $listen->sockport;
    close $listen;
    my $client = Tumbler::Client->new(endpoint => "http://127.0.0.1:$port", timeout => 5, backoff => 5);
    is $client->inspect('r')->{name}, 'chunked', 'a chunked answer';
    select undef, undef, undef, 0.2;   # the server has closed the kept-alive connection
    is $client->inspect('r')->{name}, 'to-close', 'a closed kept-alive connection is not used: a new one, read to its close';
    is $client->inspect('r')->{name}, 'again', 'and a third';
    waitpid $pid, 0;
};

done_testing;
