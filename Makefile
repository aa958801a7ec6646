# gpumesh developer commands. `make verify` is read-only and is exactly what CI runs.

.PHONY: verify fmt-check clippy test dev

verify: fmt-check clippy test

fmt-check:
	cargo fmt --all -- --check

clippy:
	cargo clippy --workspace --all-targets --locked -- -D warnings
	cargo clippy -p gpu-raft-store -p gpu-agent --features gpu-agent/failpoints --lib --bins --locked -- -D warnings

test:
	cargo test --workspace --locked

dev:
	cargo run --release --bin gpu-agent -- dev --nodes 3
