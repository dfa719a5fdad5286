package TumblerTestServer;
# Starts `tumbler dev` (a private Redis beside it) on a free port for the
# tests and stops it by pid. The binary: $TUMBLER_BIN, else
# ../../target/debug/tumbler from the distribution's directory.
# start(tls => [$cert_file, $key_file]) serves gRPC over TLS (https);
# a third file, a CA, asks clients for certificates it signed.
use strict;
use warnings;
use File::Spec;
use IO::Socket::INET;
use POSIX ();
use Time::HiRes ();

sub free_port {
    my $s = IO::Socket::INET->new(LocalAddr => '127.0.0.1', LocalPort => 0, Proto => 'tcp', Listen => 1)
        or die "no free port: $!";
    my $port = $s->sockport;
    close $s;
    return $port;
}

sub start {
    my ($class, %opts) = @_;
    my $bin = $ENV{TUMBLER_BIN} // File::Spec->rel2abs('../../target/debug/tumbler');
    return undef unless -x $bin || defined $ENV{TUMBLER_BIN};
    die "TUMBLER_BIN=$bin is not an executable\n" unless -x $bin;
    my $port = free_port();
    my $log = File::Spec->catfile(File::Spec->tmpdir, "tumbler-perl-test-$$-$port.log");
    my $pid = fork // die "fork: $!";
    if (!$pid) {
        open STDOUT, '>', $log or POSIX::_exit(127);
        open STDERR, '>&', \*STDOUT or POSIX::_exit(127);
        my ($cert, $key, $client_ca) = @{ $opts{tls} // [] };
        my @tls = (($cert ? ('--tls-cert-file', $cert, '--tls-key-file', $key) : ()),
                   ($client_ca ? ('--tls-client-ca-file', $client_ca) : ()));
        { exec $bin, 'dev', '--listen', "127.0.0.1:$port", '--http-listen', 'off', '--log-level', 'warn', @tls }
        POSIX::_exit(127);
    }
    my $self = bless { pid => $pid, port => $port, log => $log, scheme => $opts{tls} ? 'https' : 'http' }, $class;
    my $until = Time::HiRes::time() + 30;
    while (Time::HiRes::time() < $until) {
        if (waitpid($pid, POSIX::WNOHANG()) == $pid) {
            delete $self->{pid};
            die "tumbler dev exited: " . $self->log_text;
        }
        if ($self->log_text =~ /gRPC on 127\.0\.0\.1:$port/
            && IO::Socket::INET->new(PeerAddr => "127.0.0.1:$port", Timeout => 1)) {
            return $self;
        }
        Time::HiRes::sleep(0.05);
    }
    $self->stop;
    die "tumbler dev did not start within 30 s: " . $self->log_text;
}

sub endpoint { "$_[0]{scheme}://127.0.0.1:$_[0]{port}" }

sub log_text {
    my $self = shift;
    open my $fh, '<', $self->{log} or return '';
    local $/;
    return scalar <$fh>;
}

sub stop {
    my $self = shift;
    my $pid = delete $self->{pid} or return;
    kill 'INT', $pid;   # tumbler dev stops its private Redis with it
    for (1 .. 100) {
        return unlink $self->{log} if waitpid($pid, POSIX::WNOHANG()) == $pid;
        Time::HiRes::sleep(0.05);
    }
    kill 'KILL', $pid;
    waitpid($pid, 0);
    unlink $self->{log};
}

sub DESTROY { $_[0]->stop }

1;
