use strict;
use warnings;
use FindBin;
use lib "$FindBin::Bin/lib";
use Test::More;
use File::Temp ();
use IO::Socket::INET;
use POSIX ();
use Scalar::Util qw(blessed);
use Time::HiRes ();
use Tumbler::Client;
use TumblerTestServer;

# TLS that verifies: the server's certificate must chain to the CA given
# (or the system's) and name the host; a man in the middle is refused
# before anything, the bearer token above all, is sent to it.

subtest 'https without the TLS modules: an error that names them' => sub {
    my $hide = 'unshift @INC, sub { die "hidden for the test\n" if $_[1] =~ m{^(?:IO/Socket/SSL|Net/SSLeay)\.pm$}; return };';
    my $out = `$^X -I$FindBin::Bin/../lib -e '$hide require Tumbler::Client; Tumbler::Client->new(endpoint => "https://127.0.0.1:1")' 2>&1`;
    isnt $?, 0, 'new dies';
    like $out, qr/https needs IO::Socket::SSL .* and Net::SSLeay /, "it names both modules: $out";
    $out = `$^X -I$FindBin::Bin/../lib -e '$hide require Tumbler::Client; Tumbler::Client->new(endpoint => "http://127.0.0.1:1"); print "ok"' 2>&1`;
    is $out, 'ok', 'plain http does not need them';
};

sub skip_the_rest { note "skipped: $_[0]"; done_testing; exit 0 }
eval { require IO::Socket::SSL; require Net::SSLeay; 1 }
    or skip_the_rest('IO::Socket::SSL and Net::SSLeay are needed (Debian: libio-socket-ssl-perl libnet-ssleay-perl)');
`openssl version 2>/dev/null` =~ /^OpenSSL (?:1\.1\.1|[3-9])/
    or skip_the_rest('the openssl command (1.1.1 or later) is needed to make the certificates');

my $dir = File::Temp->newdir;
sub openssl {
    my @args = @_;
    my $out = `openssl @args 2>&1`;
    die "openssl @args: $out" if $?;
}

# A CA, a server certificate it signs for 127.0.0.1 and localhost, one it
# signs for another name, a client certificate it signs, and a
# self-signed one for another name.
my $ec = '-newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes';
openssl("req -x509 $ec -keyout $dir/ca.key -out $dir/ca.pem -days 2 -subj /CN=tumbler-test-ca"
    . " -addext basicConstraints=critical,CA:TRUE -addext keyUsage=critical,keyCertSign,cRLSign");
sub signed {
    my ($name, $san, $usage) = @_;
    openssl("req $ec -keyout $dir/$name.key -out $dir/$name.csr -subj /CN=$name");
    open my $fh, '>', "$dir/$name.ext" or die $!;
    print $fh "subjectAltName=$san\nbasicConstraints=CA:FALSE\nextendedKeyUsage=" . ($usage // 'serverAuth') . "\n";
    close $fh;
    openssl("x509 -req -in $dir/$name.csr -CA $dir/ca.pem -CAkey $dir/ca.key -CAcreateserial"
        . " -out $dir/$name.pem -days 2 -extfile $dir/$name.ext");
    return ("$dir/$name.pem", "$dir/$name.key");
}
my @server_cert = signed(localhost => 'IP:127.0.0.1,DNS:localhost');
my @other_cert  = signed('evil.example' => 'DNS:evil.example');
my @client_cert = signed('perl-client' => 'DNS:perl-client', 'clientAuth');
openssl("req -x509 $ec -keyout $dir/self.key -out $dir/self.pem -days 2 -subj /CN=evil.example"
    . " -addext subjectAltName=DNS:evil.example");
my @self_cert = ("$dir/self.pem", "$dir/self.key");

my $server = TumblerTestServer->start(tls => \@server_cert)
    or skip_the_rest('no tumbler binary: set TUMBLER_BIN (or cargo build --bin tumbler)');
END { $server->stop if $server }
like $server->endpoint, qr{^https://127\.0\.0\.1:\d+$}, 'the server speaks https';

my %mitms;   # pid => 1: stopped at the end, whatever happens
END { kill 'TERM', $_ and waitpid $_, 0 for keys %mitms }

sub error_of(&) { my $code = shift; return eval { $code->(); 1 } ? undef : $@ }
sub now { Time::HiRes::clock_gettime(Time::HiRes::CLOCK_MONOTONIC()) }

subtest 'the server\'s certificate verified against ca_file' => sub {
    my $client = Tumbler::Client->new(endpoint => $server->endpoint, ca_file => "$dir/ca.pem", timeout => 5);
    my $lock = $client->lock('tls', ttl_ms => 5000);
    like $lock->fencing_token, qr/^\d+$/, 'a lock over TLS';
    ok $lock->release, 'released';

    # The same kept-alive connection, and no delayed-ACK stall over TLS.
    my @ms;
    for (1 .. 20) {
        my $t0 = now();
        my $g = $client->acquire('tls', ttl_ms => 5000);
        $client->release('tls', holder => $g->{holder}, fencing_token => $g->{fencing_token});
        push @ms, (now() - $t0) * 1000 / 2;
    }
    my $median = (sort { $a <=> $b } @ms)[ $#ms / 2 ];
    cmp_ok $median, '<', 10, sprintf('a kept-alive TLS call waits on no delayed ACK (median %.2f ms)', $median);

    my $localhost = Tumbler::Client->new(endpoint => 'https://localhost:' . $server->{port},
        ca_file => "$dir/ca.pem", timeout => 5);
    ok eval { $localhost->inspect('tls'); 1 }, 'by the name localhost too' or diag $@;
    unlike $server->log_text, qr/Illegal SNI/, 'no IP address sent as a server name (SNI)';
};

subtest 'verified by default: the system\'s CAs do not know the test CA' => sub {
    my $client = Tumbler::Client->new(endpoint => $server->endpoint, timeout => 5);
    my $t0 = now();
    my $e = error_of { $client->inspect('tls') };
    ok blessed($e) && $e->isa('Tumbler::Error::TLS'), 'Tumbler::Error::TLS' or diag $e;
    is $e && $e->kind, 'tls', 'kind tls';
    like "$e", qr/certificate verify failed/, 'the message says why';
    cmp_ok now() - $t0, '<', 2, 'not retried as an unavailable server';
};

subtest 'ca_file that cannot be read' => sub {
    my $e = error_of { Tumbler::Client->new(endpoint => $server->endpoint, ca_file => "$dir/none.pem") };
    like $e, qr{ca_file '\Q$dir\E/none\.pem' is not a readable file}, 'new dies naming it';
};

subtest 'a client certificate (ssl_options) for a server that asks for one' => sub {
    my $mtls = TumblerTestServer->start(tls => [ @server_cert, "$dir/ca.pem" ]);
    my %with = (endpoint => $mtls->endpoint, ca_file => "$dir/ca.pem", timeout => 5);
    my $client = Tumbler::Client->new(%with, ssl_options => { SSL_cert_file => $client_cert[0], SSL_key_file => $client_cert[1] });
    ok eval { $client->inspect('tls'); 1 }, 'answered' or diag $@;
    ok !eval { Tumbler::Client->new(%with, timeout => 1)->inspect('tls'); 1 }, 'not without it';
    $mtls->stop;
};

# A man in the middle on another port, with the given certificate: it
# completes what TLS handshakes it can and writes whatever it is sent
# afterwards to a file.
sub mitm {
    my ($cert, $key) = @_;
    my $listen = IO::Socket::INET->new(LocalAddr => '127.0.0.1', LocalPort => 0, Listen => 5, ReuseAddr => 1)
        or die "listen: $!";
    my $log = File::Temp->new;
    my $pid = fork // die "fork: $!";
    if (!$pid) {
        while (my $c = $listen->accept) {
            IO::Socket::SSL->start_SSL($c, SSL_server => 1, SSL_cert_file => $cert, SSL_key_file => $key,
                Timeout => 5) or next;
            my $got = '';
            while (sysread $c, my $buf, 65536) {
                $got .= $buf;
                last if $got =~ /\r\n\r\n/;
            }
            open my $fh, '>>', $log->filename or POSIX::_exit(1);
            print $fh $got;
            close $fh;
            print $c "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 2\r\nConnection: close\r\n\r\n{}";
            close $c;
        }
        POSIX::_exit(0);
    }
    $mitms{$pid} = 1;
    my $port = $listen->sockport;
    close $listen;
    return ($port, $pid, $log);
}

sub seen { open my $fh, '<', $_[0]->filename or return ''; local $/; return scalar <$fh> }

for my $case ([ 'a self-signed certificate for another name', @self_cert ],
              [ 'a certificate of the trusted CA for another name', @other_cert ]) {
    my ($what, @cert) = @$case;
    subtest "a man in the middle with $what is refused" => sub {
        my ($port, $pid, $log) = mitm(@cert);
        my $client = Tumbler::Client->new(endpoint => "https://127.0.0.1:$port", ca_file => "$dir/ca.pem",
            token => 'tumbler-test-secret', timeout => 5);
        my $e = error_of { $client->acquire('tls', ttl_ms => 5000) };
        ok blessed($e) && $e->isa('Tumbler::Error::TLS'), "refused: $e";
        unlike seen($log), qr/tumbler-test-secret|authorization/i, 'the man in the middle got no bearer token';

        # The same man in the middle, to a client that does not verify: he
        # would have seen it, so the check above can fail.
        HTTP::Tiny->new(verify_SSL => 0)->post("https://127.0.0.1:$port/tumbler.v1.LockService/Inspect",
            { headers => { authorization => 'Bearer control-secret' }, content => '{}' });
        like seen($log), qr/^authorization: Bearer control-secret\r$/mi, 'an unverified client does hand it over';
        kill 'TERM', $pid;
        waitpid $pid, 0;
        delete $mitms{$pid};
    };
}

done_testing;
