use strict;
use warnings;
use Test::More tests => 6;

use_ok('Tumbler::Error');
use_ok('Tumbler::Lock');
use_ok('Tumbler::LockSet');
use_ok('Tumbler::Client');
use_ok('Tumbler::ConcurrencyLimit');
use_ok('IPC::ConcurrencyLimit::Lock::Tumbler');
diag("Tumbler::Client $Tumbler::Client::VERSION, perl $], HTTP::Tiny $HTTP::Tiny::VERSION, JSON::PP $JSON::PP::VERSION, JSON by $Tumbler::Client::JSON_CLASS " . ($Tumbler::Client::JSON_CLASS->VERSION));
