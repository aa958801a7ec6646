//! Mutual TLS between agents and from tools: the cluster CA (`pki`), key material on disk
//! (`files`), the listener (`server`), outgoing connections (`client`).
//! The per-request identity check is the API's (`api/auth/peer.rs`). How an agent gets its certificate is in `enroll`.

pub(crate) mod ca_keeper;
pub mod client;
pub(crate) mod enroll;
pub mod files;
pub mod pki;
pub mod registry_login;
pub mod rotation;
pub mod sealing;
pub(crate) mod server;
pub mod signature;

pub use enroll::TlsIdentity;
pub use files::{NodeTls, TlsDir};
pub use pki::{KeyedCert, Subject};
