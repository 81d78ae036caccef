//! The command that does what an error advises. The engine's errors say what is wrong and
//! what would help in words any embedder can act on ("import with a rewind", "abort the
//! receive"); the `sluice` command that does it is this module's, added to the message the
//! CLI prints (and to a served pool's answers, which the server computes from the typed
//! error).

use sluice_engine::tunables::TunableError;
use sluice_engine::PoolError;
use sluice_engine::StoreError;
use sluice_engine::VdevError;

/// The message a person reads for `error`: it and its causes (`sluice_engine::error_chain`),
/// then the command that helps, if there is one.
pub fn message(error: &anyhow::Error) -> String {
    let chained: &(dyn std::error::Error + Send + Sync + 'static) = error.as_ref();
    let mut out = sluice_engine::error_chain(chained);
    if let Some(hint) = hint(error) {
        out.push_str(". ");
        out.push_str(&hint);
    }
    out
}

/// The `sluice` command for the first cause in `error`'s chain that has one.
pub fn hint(error: &anyhow::Error) -> Option<String> {
    error.chain().find_map(|cause| {
        if let Some(store) = cause.downcast_ref::<StoreError>() {
            store_hint(store)
        } else if let Some(pool) = cause.downcast_ref::<PoolError>() {
            pool_hint(pool)
        } else if let Some(TunableError::Unknown { .. }) = cause.downcast_ref::<TunableError>() {
            Some("`sluice tunables` lists them all".into())
        } else {
            None
        }
    })
}

fn store_hint(error: &StoreError) -> Option<String> {
    Some(match error {
        StoreError::Pool(pool) => return pool_hint(pool),
        StoreError::NoSuchVolume { pool, .. } => {
            format!("`sluice vol list {pool}` shows its volumes")
        }
        StoreError::NoSuchSnapshot { pool, volume, .. } => {
            format!("`sluice snapshot list {pool}/{volume}` shows its snapshots")
        }
        StoreError::HasClones { pool, .. } => {
            format!("`sluice vol promote {pool}/CLONE` makes a clone the parent")
        }
        StoreError::NoSpaceToReserve { .. } => {
            "`sluice vol create --sparse` makes a thin volume".into()
        }
        StoreError::NoSpace { pool, snapshots_bytes, .. } if *snapshots_bytes > 0 => {
            format!("`sluice snapshot list {pool}` shows what each snapshot holds")
        }
        StoreError::ReceiveInterrupted { pool, volume, token, .. } => format!(
            "resume with `sluice send -t {token} | sluice recv -s {pool}/{volume}`, or abort \
             with `sluice recv -A {pool}/{volume}`"
        ),
        StoreError::ReceiveRefused { pool, volume, reason }
            if reason.contains("resume token") || reason.contains("interrupted receive") =>
        {
            format!(
                "`sluice vol list {pool}` shows the resume token; `sluice send -t TOKEN | \
                 sluice recv -s {pool}/{volume}` resumes, `sluice recv -A {pool}/{volume}` aborts"
            )
        }
        StoreError::DamagedTxg { pool, .. } => format!(
            "`sluice pool import {pool} --rewind --dry-run` says which txg a rewind returns to; \
             `--rewind` imports it"
        ),
        StoreError::UnreadableLog { pool, .. } => format!(
            "`sluice pool import {pool} --discard-unreadable-log` imports without that part of \
             the log"
        ),
        StoreError::NoIntactTxg { .. } => {
            "`sluice pool import NAME -d DIR` searches DIR for the pool's leaves".into()
        }
        _ => return None,
    })
}

fn pool_hint(error: &PoolError) -> Option<String> {
    Some(match error {
        PoolError::RewindNotRecorded { pool, .. } => {
            format!("`sluice pool import {pool} --rewind` rewinds again")
        }
        PoolError::NotMirror { pool, leaf } => {
            format!("`sluice pool replace {pool} {leaf} NEW` swaps it for another device")
        }
        PoolError::LabelsNotWritten { pool, .. } => {
            format!("`sluice pool status {pool}` shows the devices")
        }
        PoolError::Vdev { pool, cause: VdevError::Offline { device, .. } } => {
            format!("`sluice pool online {pool} {device}` brings it back")
        }
        _ => return None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The engine says what to do in words; the CLI adds the command, once.
    #[test]
    fn the_command_follows_the_engines_words() {
        let error = anyhow::Error::new(StoreError::ReceiveInterrupted {
            pool: "tank".into(),
            volume: "w".into(),
            cause: "the stream ended".into(),
            next_block: 7,
            token: "T0K3N".into(),
        });
        let said = message(&error);
        assert!(said.contains("resume it with a send from its resume token, T0K3N"), "{said}");
        assert!(said.ends_with("`sluice recv -A tank/w`"), "{said}");
        assert_eq!(said.matches("sluice send -t T0K3N").count(), 1, "{said}");
        let plain = anyhow::Error::new(StoreError::VolumeExists {
            pool: "tank".into(),
            volume: "v".into(),
        });
        assert_eq!(message(&plain), "volume tank/v already exists");
    }
}
