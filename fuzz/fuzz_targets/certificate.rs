#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| gpu_tests::fuzz::certificate(data));
