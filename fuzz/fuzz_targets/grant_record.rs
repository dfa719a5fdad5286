//! Fuzz target `grant_record`: see `tumbler_fuzz::grant_record` (fuzz/src/lib.rs).
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| tumbler_fuzz::grant_record(data));
