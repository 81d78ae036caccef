//! What the format tests share: golden files.

use std::path::PathBuf;

/// Checks `bytes` against tests/golden/`name`, or writes it there under `SLUICE_BLESS=1`
/// (after an intended format change).
pub fn golden(name: &str, bytes: &[u8]) {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/golden").join(name);
    if std::env::var_os("SLUICE_BLESS").is_some() {
        std::fs::write(&path, bytes).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        return;
    }
    let expected = std::fs::read(&path).unwrap_or_else(|e| {
        panic!("{}: {e}; run with SLUICE_BLESS=1 to create it", path.display())
    });
    assert!(expected == bytes, "{name} changed: the on-disk layout moved (see the file's doc)");
}
