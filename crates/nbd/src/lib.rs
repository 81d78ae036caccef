//! NBD server (fixed newstyle handshake, structured replies) for sluice volumes.
//!
//! Built in the NBD issue on top of the engine's public volume API; empty until volumes exist.
