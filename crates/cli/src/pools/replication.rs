//! `sluice send` and `sluice recv`: a snapshot as a checksummed stream (whole, incremental,
//! or the rest of an interrupted receive), and a stream into a volume. On a served pool the
//! stream crosses the control socket (crate::control); here are the two ends that touch the
//! store, which the server runs too.

use sluice_engine::{ReceiveMode, Store, StreamSummary};

use super::output::human;
use super::{pool_of, split_snapshot, split_volume, Ctx};

/// What `sluice send` sends.
#[derive(Clone, Debug)]
pub enum SendWhat {
    /// `POOL/VOL@SNAP`, whole or (`from`) since an older snapshot; `raw` (`-w`): an
    /// encrypted volume as it is stored, with its wrapped key.
    Snapshot { spec: String, from: Option<String>, raw: bool },
    /// `-t TOKEN`: the rest of an interrupted receive's stream.
    Resume(sluice_format::ResumeToken),
}

impl SendWhat {
    pub fn new(
        spec: Option<String>,
        from: Option<String>,
        token: Option<String>,
        raw: bool,
    ) -> anyhow::Result<SendWhat> {
        match (spec, token) {
            (Some(spec), None) => Ok(SendWhat::Snapshot { spec, from, raw }),
            (None, Some(token)) => {
                Ok(SendWhat::Resume(sluice_format::ResumeToken::decode(&token)?))
            }
            _ => anyhow::bail!("send takes POOL/VOL@SNAP, or -t TOKEN to resume a receive"),
        }
    }

    /// The pool the stream comes from.
    pub fn pool(&self) -> String {
        match self {
            SendWhat::Snapshot { spec, .. } => pool_of(spec),
            SendWhat::Resume(token) => pool_of(&token.source),
        }
        .to_owned()
    }

    /// Sends it from `store` into `writer`; returns what was sent, in words.
    pub async fn send_from<W: std::io::Write + Send>(
        &self,
        store: &Store,
        writer: &mut sluice_format::StreamWriter<W>,
    ) -> anyhow::Result<String> {
        let mut emit = |record| writer.write(&record);
        let (what, summary) = match self {
            SendWhat::Snapshot { spec, from, raw } => {
                let (_, volume, snapshot) = split_snapshot(spec)?;
                let from = from.as_deref().map(|f| f.rsplit('@').next().unwrap_or(f));
                let summary = if *raw {
                    store.send_snapshot_raw(volume, snapshot, from, &mut emit).await?
                } else {
                    store.send_snapshot(volume, snapshot, from, &mut emit).await?
                };
                let raw = if *raw && store.volume_info(volume).is_some_and(|v| v.key_family != 0) {
                    " (raw)"
                } else {
                    ""
                };
                (
                    format!(
                        "{spec}{}{raw}",
                        from.map(|f| format!(" from @{f}")).unwrap_or_default()
                    ),
                    summary,
                )
            }
            SendWhat::Resume(token) => {
                let summary = store.send_resume(token, &mut emit).await?;
                (format!("{} from block {} (resumed)", token.source, token.next_block), summary)
            }
        };
        Ok(format!(
            "sent {what}: {} records, {} data blocks ({}), {} frees",
            summary.records + 1,
            summary.data_blocks,
            human(summary.data_bytes),
            summary.free_records
        ))
    }
}

/// `send [-i OLDER] POOL/VOL@SNAP` or `send -t TOKEN` of a pool opened here: the stream to
/// standard output, what was sent on standard error.
pub async fn send(ctx: &mut Ctx<'_>, what: &SendWhat) -> anyhow::Result<()> {
    let store = ctx.hold(&what.pool()).await?;
    let mut writer = sluice_format::StreamWriter::new(std::io::BufWriter::with_capacity(
        1 << 20,
        std::io::stdout(),
    ));
    let said = what.send_from(&store, &mut writer).await?;
    writer.finish()?;
    store.release().await?;
    eprintln!("{said}");
    Ok(())
}

/// `recv [-s] POOL/VOL` into a pool opened here: a stream from standard input.
/// `recv POOL/VOL [-s]`, or with `new_key` into a new encrypted volume.
pub async fn recv(
    ctx: &mut Ctx<'_>,
    spec: &str,
    resumable: bool,
    new_key: Option<sluice_engine::NewKey>,
) -> anyhow::Result<()> {
    let (pool, volume) = split_volume(spec)?;
    let store = ctx.hold(pool).await?;
    store.run_syncer();
    let mut reader = sluice_format::StreamReader::new(std::io::BufReader::with_capacity(
        1 << 20,
        std::io::stdin(),
    ));
    let mode = if resumable { ReceiveMode::Resumable } else { ReceiveMode::Whole };
    let result = {
        let mut next = || reader.next_record();
        match new_key {
            Some(key) if !resumable => store.receive_encrypted(volume, key, &mut next).await,
            Some(_) => Err(not_resumable_encrypted(pool, volume)),
            None => store.receive(volume, mode, &mut next).await,
        }
    };
    let released = store.release().await;
    let summary = result?;
    released?;
    ctx.done(received(spec, &summary));
    Ok(())
}

/// `recv -s --encryption`: refused, not built.
pub fn not_resumable_encrypted(pool: &str, volume: &str) -> sluice_engine::StoreError {
    sluice_engine::StoreError::NotWithEncryption {
        pool: pool.to_owned(),
        volume: volume.to_owned(),
        what: "a resumable receive into a new encrypted volume (receive it without -s)",
    }
}

/// What a receive into `spec` took in, in words.
pub fn received(spec: &str, summary: &StreamSummary) -> String {
    format!(
        "received {spec}: {} records, {} data blocks ({}), {} frees",
        summary.records,
        summary.data_blocks,
        human(summary.data_bytes),
        summary.free_records
    )
}

/// `recv -A POOL/VOL`: drops what an interrupted receive kept.
pub async fn recv_abort(ctx: &mut Ctx<'_>, spec: &str) -> anyhow::Result<()> {
    let (pool, volume) = split_volume(spec)?;
    let store = ctx.hold(pool).await?;
    store.abort_receive(volume).await?;
    store.release().await?;
    ctx.done(format!("dropped the interrupted receive into {spec}"));
    Ok(())
}
