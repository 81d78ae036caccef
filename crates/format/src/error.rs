//! Errors of the on-disk codecs. Every variant names the structure it was decoding, so a
//! message says what on the disk is damaged.

/// A structure could not be encoded or decoded.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum FormatError {
    #[error("{what}: {have} bytes, need {need}")]
    Truncated { what: &'static str, need: usize, have: usize },
    #[error("{what}: bad magic {found:#018x}; this is not a sluice {what} (or it is damaged)")]
    BadMagic { what: &'static str, found: u64 },
    #[error("{what}: format version {found} is not supported by this build of sluice")]
    UnsupportedVersion { what: &'static str, found: u16 },
    #[error("{what}: unknown checksum algorithm {found}")]
    UnknownChecksum { what: &'static str, found: u8 },
    #[error("{what}: checksum mismatch (damaged or torn write)")]
    ChecksumMismatch { what: &'static str },
    #[error("{what}: reserved byte at offset {offset} is not zero")]
    NonZeroReserved { what: &'static str, offset: usize },
    #[error("{what}: field {field} has invalid value {value}")]
    Invalid { what: &'static str, field: &'static str, value: u64 },
    #[error("{what}: encoded size {len} exceeds the {max} bytes available")]
    TooLarge { what: &'static str, len: usize, max: usize },
    /// The structure names features this build does not know: a newer sluice wrote it, and
    /// reading it as if they were absent would misread it.
    #[error(
        "{what} needs feature(s) {}, which this build of sluice does not know (a newer sluice \
         wrote it)",
        .names.join(", ")
    )]
    UnknownFeatures { what: &'static str, names: Vec<String> },
}
