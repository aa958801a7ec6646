# gpumesh developer commands. `make verify` is read-only and is exactly what CI runs.

.PHONY: verify fmt-check clippy deny test dev

verify: fmt-check clippy deny test

fmt-check:
	cargo fmt --all -- --check

clippy:
	cargo clippy --workspace --all-targets --locked -- -D warnings
	cargo clippy -p gpu-raft-store -p gpu-agent --features gpu-agent/failpoints --lib --bins --locked -- -D warnings

# The dependency policy in deny.toml (licenses, duplicate versions, sources), offline, warnings
# as errors (a skip entry that no longer matches must go). Needs cargo-deny: .ci/run installs
# it (cargo install cargo-deny --version 0.20.2 --locked).
deny:
	cargo deny --frozen check --deny warnings licenses bans sources

test:
	cargo test --workspace --locked

dev:
	cargo run --release --bin gpu-agent -- dev --nodes 3
