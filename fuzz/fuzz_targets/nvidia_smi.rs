#![no_main]
libfuzzer_sys::fuzz_target!(|data: &[u8]| oomdoc_fuzz::nvidia_smi(data));
