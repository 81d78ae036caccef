//! The control socket of `sluice serve`: while a pool is served, its leaves are locked by the
//! server, so `sluice pool status|scrub`, `sluice vol
//! create|list|get|set|rename|resize|rollback|promote|destroy`, `sluice snapshot
//! create|list|destroy` and `sluice clone` naming that pool are sent to the server, which
//! runs them against its live store (a volume created this way is exported at once) and sends
//! back their output. `sluice pool iostat` sends the hidden
//! `pool stats` for the live counters (crate::iostat).
//!
//! The socket sits next to the pool cache file, named after the pool. One request per
//! connection: the command's arguments as a JSON array on one line; the answer is an
//! [`Answer`] as a JSON object on one line, `{"ok": bool, "out": text, "error": text}`. For
//! `pool stats`, `out` is a `crate::snapshot::PoolSnapshot` in JSON.

use std::io::{BufRead, BufReader, Write};
use std::os::unix::net::UnixStream;
use std::path::PathBuf;
use std::sync::Arc;

use anyhow::Context;
use serde::{Deserialize, Serialize};
use sluice_engine::rt::Env;
use sluice_engine::txg::Store;
use tokio::io::{AsyncBufReadExt, AsyncWriteExt};

use crate::pools;

/// The server's answer to one command.
#[derive(Debug, Default, Serialize, Deserialize)]
pub struct Answer {
    /// Whether the command succeeded.
    pub ok: bool,
    /// What the command printed (on failure too: what it printed before failing).
    #[serde(default)]
    pub out: String,
    /// Why it failed, when it did.
    #[serde(default)]
    pub error: String,
}

impl Answer {
    /// The answer as the one line the socket carries.
    fn to_line(&self) -> String {
        // Strings and a bool: serializing cannot fail; were it to, the client reads a refusal.
        let mut line = serde_json::to_string(self).unwrap_or_else(|e| {
            let error = format!("the server could not encode its answer: {e}");
            serde_json::json!({ "ok": false, "out": "", "error": error }).to_string()
        });
        line.push('\n');
        line
    }
}

/// Where the control socket of pool `name` is.
pub fn socket_path(name: &str) -> PathBuf {
    pools::cache_path().with_file_name(format!("{name}.control"))
}

/// Whether a server is serving `name` now.
pub fn is_served(name: &str) -> bool {
    UnixStream::connect(socket_path(name)).is_ok()
}

/// Sends `args` to the server of `pool`, if there is one; returns its output.
pub fn forward(pool: &str, args: &[String]) -> Option<anyhow::Result<String>> {
    let path = socket_path(pool);
    let stream = UnixStream::connect(&path).ok()?;
    Some((|| {
        let mut stream = stream;
        let mut line = serde_json::to_string(args)?;
        line.push('\n');
        stream.write_all(line.as_bytes())?;
        let mut answer = String::new();
        BufReader::new(&stream).read_line(&mut answer)?;
        let answer: Answer = serde_json::from_str(&answer)
            .with_context(|| format!("reading the answer of the server on {}", path.display()))?;
        if answer.ok {
            Ok(answer.out)
        } else {
            print!("{}", answer.out);
            if answer.error.is_empty() {
                anyhow::bail!("the server on {} refused the command", path.display())
            }
            anyhow::bail!("{}", answer.error)
        }
    })())
}

/// Listens on the control socket of the served pool until the task is dropped.
pub async fn serve(env: Env, store: Arc<Store>) -> anyhow::Result<tokio::task::JoinHandle<()>> {
    let name = store.pool().name().to_owned();
    let path = socket_path(&name);
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    }
    if path.exists() {
        if is_served(&name) {
            anyhow::bail!("pool {name} is already served (control socket {})", path.display());
        }
        std::fs::remove_file(&path)
            .with_context(|| format!("removing stale {}", path.display()))?;
    }
    let listener = tokio::net::UnixListener::bind(&path)
        .with_context(|| format!("listening on {}", path.display()))?;
    Ok(tokio::spawn(async move {
        loop {
            let Ok((stream, _)) = listener.accept().await else { continue };
            let (env, store) = (env.clone(), Arc::clone(&store));
            tokio::spawn(async move {
                let (reader, mut writer) = stream.into_split();
                let mut line = String::new();
                // A request is a few arguments; a client that sends more than this without a
                // newline gets an error instead of growing the server's memory.
                let mut reader = tokio::io::AsyncReadExt::take(
                    tokio::io::BufReader::new(reader),
                    REQUEST_BYTES_MAX,
                );
                if reader.read_line(&mut line).await.is_err() {
                    return;
                }
                let answer = match serde_json::from_str::<Vec<String>>(&line) {
                    Ok(args) => run(&env, store, args).await,
                    Err(e) => Answer {
                        ok: false,
                        out: String::new(),
                        error: format!("bad request (a JSON array of arguments on one line): {e}"),
                    },
                };
                let _ = writer.write_all(answer.to_line().as_bytes()).await;
            });
        }
    }))
}

/// Longest control request taken, newline included.
const REQUEST_BYTES_MAX: u64 = 64 << 10;

/// Removes the control socket (at shutdown).
pub fn remove(name: &str) {
    let _ = std::fs::remove_file(socket_path(name));
}

async fn run(env: &Env, store: Arc<Store>, args: Vec<String>) -> Answer {
    let mut ctx = pools::Ctx { env, live: Some(store), out: String::new() };
    let result = crate::run_pool_command(&mut ctx, args).await;
    match result {
        Ok(()) => Answer { ok: true, out: ctx.out, error: String::new() },
        Err(e) => Answer { ok: false, out: ctx.out, error: format!("{e:#}") },
    }
}
