use strict;
use warnings;
use Test::More tests => 3;

use_ok('Tumbler::Error');
use_ok('Tumbler::Lock');
use_ok('Tumbler::Client');
diag("Tumbler::Client $Tumbler::Client::VERSION, perl $], HTTP::Tiny $HTTP::Tiny::VERSION, JSON::PP $JSON::PP::VERSION");
