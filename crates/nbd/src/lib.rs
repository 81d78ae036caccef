//! NBD server for sluice volumes (docs/design.md, "NBD server").
//!
//! [`proto`] is the wire format as pure functions (what the fuzz target drives), [`server`]
//! one connection (handshake, then transmission with out-of-order replies), `command` one
//! request run against its volume and its reply encoded, and [`listen`]
//! the ways a server is reached: Unix sockets, TCP, an inherited listening socket (systemd's
//! `LISTEN_FDS`), or NBD on stdin/stdout for one client (libnbd's `nbd_connect_command`).
//! [`placement`] moves each connection, once it has chosen its export, to its volume's core.
//! [`tls`] is STARTTLS's other half: credentials (x509, pre-shared keys) and the handshake.
//! Written here rather than taken from a crate: the Rust NBD crates lack structured replies or
//! are GPL, and the durability semantics of FUA and FLUSH are ours.

mod command;
pub mod listen;
pub mod placement;
pub mod proto;
pub mod server;
#[cfg(test)]
mod testing;
pub mod tls;

pub use server::{serve_connection, serve_connection_tls, ConnectionError, Exports};
