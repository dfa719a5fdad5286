//! Fuzz target `metadata`: see `tumbler_fuzz::metadata` (fuzz/src/lib.rs).
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| tumbler_fuzz::metadata(data));
