//! Fuzz target `lua_reply`: see `tumbler_fuzz::lua_reply` (fuzz/src/lib.rs).
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| tumbler_fuzz::lua_reply(data));
