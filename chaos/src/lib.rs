//! gpu-chaos: the fault-injection harness and history checkers (the [chaos] issue). Not built
//! yet; the multi-agent harness it will grow from is `gpu-tests` (`tests/src/lib.rs`).
