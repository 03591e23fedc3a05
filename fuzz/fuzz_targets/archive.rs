#![no_main]
libfuzzer_sys::fuzz_target!(|data: &[u8]| oomdoc_fuzz::archive(data));
