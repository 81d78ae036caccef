//! Exit codes by what kind of failure an error is, so a script can tell "no such pool" from
//! "no space" without reading the message (`sluice --help` lists them: [`HELP`]).
//!
//! The kind comes from the engine's errors (`sluice_engine::ErrorKind`, through
//! `StoreError::kind` and `PoolError::kind`), from errors the CLI decides itself
//! ([`refuse`]), and, for a command a served pool's server ran, from the kind its answer
//! carries (crate::control). An error of no known kind exits 1; clap's usage errors exit 2.

use sluice_engine::ErrorKind;
use sluice_engine::PoolError;
use sluice_engine::StoreError;

/// What `sluice --help` says of exit codes.
pub const HELP: &str = "\
Exit codes:
  0   success
  1   any other failure
  2   usage: unknown command, missing or malformed argument
  3   not found: no such pool, volume, snapshot or leaf
  4   exists: the name is taken
  5   no space: the pool has no room for it
  6   invalid: refused as asked (out of range, not allowed in this state)
  7   suspended: the pool stopped serving until it is imported again
  8   checksum: data failed its checksum on every copy
  9   I/O: a device failed
  10  read only: a snapshot cannot be written
  11  protocol: the pool's running server speaks another control protocol";

/// Exit code of a failure of no known kind.
const OTHER: u8 = 1;
/// Exit code when the running server and this command speak different control protocols.
pub const PROTOCOL: u8 = 11;

/// An error the CLI decides itself, with its kind.
#[derive(Debug, thiserror::Error)]
#[error("{message}")]
pub struct Refused {
    pub kind: ErrorKind,
    pub message: String,
}

/// The control protocol of the pool's server is not this command's.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct ProtocolMismatch(pub String);

/// An error of `kind` saying `message`.
pub fn refuse(kind: ErrorKind, message: impl Into<String>) -> anyhow::Error {
    anyhow::Error::new(Refused { kind, message: message.into() })
}

/// The kind of the first cause in `error`'s chain that has one.
pub fn kind_of(error: &anyhow::Error) -> Option<ErrorKind> {
    error.chain().find_map(|cause| {
        if let Some(refused) = cause.downcast_ref::<Refused>() {
            Some(refused.kind)
        } else if let Some(store) = cause.downcast_ref::<StoreError>() {
            Some(store.kind())
        } else {
            cause.downcast_ref::<PoolError>().map(PoolError::kind)
        }
    })
}

/// The exit code for `error` (see [`HELP`]).
pub fn code(error: &anyhow::Error) -> u8 {
    if error.chain().any(|cause| cause.is::<ProtocolMismatch>()) {
        return PROTOCOL;
    }
    match kind_of(error) {
        Some(ErrorKind::NotFound) => 3,
        Some(ErrorKind::Exists) => 4,
        Some(ErrorKind::NoSpace) => 5,
        Some(ErrorKind::Invalid) => 6,
        Some(ErrorKind::Suspended) => 7,
        Some(ErrorKind::Checksum) => 8,
        Some(ErrorKind::Io) => 9,
        Some(ErrorKind::ReadOnly) => 10,
        _ => OTHER,
    }
}

/// `kind` as the control protocol spells it.
pub fn kind_name(kind: ErrorKind) -> &'static str {
    match kind {
        ErrorKind::NoSpace => "no-space",
        ErrorKind::Invalid => "invalid",
        ErrorKind::NotFound => "not-found",
        ErrorKind::Exists => "exists",
        ErrorKind::Suspended => "suspended",
        ErrorKind::Checksum => "checksum",
        ErrorKind::Io => "io",
        ErrorKind::ReadOnly => "read-only",
        _ => "other",
    }
}

/// Every kind this command knows (the engine's `ErrorKind` may grow).
const KINDS: [ErrorKind; 8] = [
    ErrorKind::NoSpace,
    ErrorKind::Invalid,
    ErrorKind::NotFound,
    ErrorKind::Exists,
    ErrorKind::Suspended,
    ErrorKind::Checksum,
    ErrorKind::Io,
    ErrorKind::ReadOnly,
];

/// The kind a control answer names, if it is one this command knows.
pub fn kind_named(name: &str) -> Option<ErrorKind> {
    KINDS.into_iter().find(|&kind| kind_name(kind) == name)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Kinds survive the control protocol's names, and each kind has a code of its own,
    /// listed in the help.
    #[test]
    fn kinds_round_trip_and_have_distinct_codes() {
        let mut codes = Vec::new();
        for kind in KINDS {
            assert_eq!(kind_named(kind_name(kind)), Some(kind));
            let code = code(&refuse(kind, "x"));
            assert!(HELP.contains(&format!("\n  {code:<4}")), "code {code} of {kind:?} in HELP");
            codes.push(code);
        }
        codes.sort_unstable();
        codes.dedup();
        assert_eq!(codes.len(), KINDS.len());
        assert_eq!(code(&anyhow::anyhow!("plain")), OTHER);
        let wrapped = refuse(ErrorKind::NotFound, "gone").context("pool status");
        assert_eq!(code(&wrapped), 3, "the kind is found under context");
    }
}
