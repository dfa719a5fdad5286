//! Fuzz target `page_token`: see `tumbler_fuzz::page_token` (fuzz/src/lib.rs).
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| tumbler_fuzz::page_token(data));
