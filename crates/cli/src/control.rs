//! The control socket of `sluice serve`: while a pool is served, its leaves are locked by the
//! server, so `sluice pool status|scrub`, `sluice vol
//! create|list|get|set|rename|resize|rollback|promote|destroy`, `sluice snapshot
//! create|list|destroy` and `sluice clone` naming that pool are sent to the server, which
//! runs them against its live store (a volume created this way is exported at once) and sends
//! back their output. `sluice pool iostat` sends the hidden
//! `pool stats` for the live counters (crate::iostat).
//!
//! The socket sits next to the pool cache file, named after the pool. One request per
//! connection: a [`Request`] as a JSON object on one line, `{"protocol": N, "args": [...]}`;
//! the answer is an [`Answer`] as a JSON object on one line, `{"protocol": N, "ok": bool,
//! "out": text, "error": text, "kind": name}`, `kind` naming what kind of failure it was
//! (crate::exit, so the client exits with the code the server's error calls for). Both sides
//! say their protocol version, [`PROTOCOL`]: a command and a server of different versions
//! refuse each other with an error that says so, rather than misreading each other (a request
//! of the first, unnumbered protocol was a bare JSON array). For `pool stats`, `out` is a
//! `crate::snapshot::PoolSnapshot` in JSON.

use std::io::{BufRead, BufReader, Write};
use std::os::unix::net::UnixStream;
use std::path::PathBuf;
use std::sync::Arc;

use anyhow::Context;
use serde::{Deserialize, Serialize};
use sluice_engine::rt::Env;
use sluice_engine::txg::{ReceiveMode, Store};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt};

use crate::{exit, pools};

/// The control protocol's version. 2: requests and answers say their version; answers say
/// what kind of failure they carry.
pub const PROTOCOL: u32 = 2;

/// One command for the server: its arguments as the command line has them.
#[derive(Debug, Serialize, Deserialize)]
pub struct Request {
    pub protocol: u32,
    pub args: Vec<String>,
}

/// The server's answer to one command.
#[derive(Debug, Default, Serialize, Deserialize)]
pub struct Answer {
    /// The server's protocol version (0 from a server of the unnumbered first protocol).
    #[serde(default)]
    pub protocol: u32,
    /// Whether the command succeeded.
    pub ok: bool,
    /// What the command printed (on failure too: what it printed before failing).
    #[serde(default)]
    pub out: String,
    /// Why it failed, when it did.
    #[serde(default)]
    pub error: String,
    /// What kind of failure it was (crate::exit's names), when known.
    #[serde(default)]
    pub kind: Option<String>,
}

impl Answer {
    fn done(out: String) -> Answer {
        Answer { protocol: PROTOCOL, ok: true, out, ..Answer::default() }
    }

    /// A failure: what was printed before it, and the error with its kind.
    fn failed(out: String, error: &anyhow::Error) -> Answer {
        Answer {
            protocol: PROTOCOL,
            ok: false,
            out,
            error: crate::hints::message(error),
            kind: if error.chain().any(|c| c.is::<exit::ProtocolMismatch>()) {
                Some(PROTOCOL_KIND.to_owned())
            } else {
                exit::kind_of(error).map(|kind| exit::kind_name(kind).to_owned())
            },
        }
    }

    /// The client's side: the answer's error as an error of its kind.
    fn into_error(self) -> anyhow::Error {
        if self.kind.as_deref() == Some(PROTOCOL_KIND) {
            return anyhow::Error::new(exit::ProtocolMismatch(self.error));
        }
        match self.kind.as_deref().and_then(exit::kind_named) {
            Some(kind) => exit::refuse(kind, self.error),
            None => anyhow::anyhow!("{}", self.error),
        }
    }

    /// The answer as the one line the socket carries.
    fn to_line(&self) -> String {
        // Strings and a bool: serializing cannot fail; were it to, the client reads a refusal.
        let mut line = serde_json::to_string(self).unwrap_or_else(|e| {
            let error = format!("the server could not encode its answer: {e}");
            serde_json::json!({ "protocol": PROTOCOL, "ok": false, "out": "", "error": error })
                .to_string()
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

/// The kind an answer gives a protocol mismatch.
const PROTOCOL_KIND: &str = "protocol";

/// Writes a request: the command line `args` as one JSON line.
fn send_request(stream: &UnixStream, args: &[String]) -> anyhow::Result<()> {
    let request = Request { protocol: PROTOCOL, args: args.to_vec() };
    let mut line = serde_json::to_string(&request)?;
    line.push('\n');
    Ok((&*stream).write_all(line.as_bytes())?)
}

/// The server's side: the arguments of a request line, or why it is refused (a request of
/// another protocol, or not a request at all).
fn parse_request(line: &str) -> anyhow::Result<Vec<String>> {
    let mismatch = |theirs: String| {
        anyhow::Error::new(exit::ProtocolMismatch(format!(
            "this server speaks control protocol {PROTOCOL} and the sluice command that sent \
             the request speaks {theirs}: run the sluice that started the server ({})",
            std::env::current_exe().map_or_else(|_| "sluice".into(), |p| p.display().to_string())
        )))
    };
    match serde_json::from_str::<serde_json::Value>(line) {
        // The first protocol sent the arguments alone.
        Ok(serde_json::Value::Array(_)) => Err(mismatch("the first, unnumbered one".into())),
        Ok(value) => match serde_json::from_value::<Request>(value) {
            Ok(request) if request.protocol == PROTOCOL => Ok(request.args),
            Ok(request) => Err(mismatch(request.protocol.to_string())),
            Err(e) => Err(anyhow::anyhow!("bad request (a JSON object on one line): {e}")),
        },
        Err(e) => Err(anyhow::anyhow!("bad request (a JSON object on one line): {e}")),
    }
}

/// The client's side: refuses the answer of a server of another protocol.
fn check_protocol(answer: &Answer, path: &std::path::Path) -> anyhow::Result<()> {
    if answer.protocol == PROTOCOL {
        return Ok(());
    }
    let theirs = match answer.protocol {
        // A server of the first protocol answers a numbered request with "bad request".
        0 => "the first, unnumbered one".to_owned(),
        n => n.to_string(),
    };
    Err(anyhow::Error::new(exit::ProtocolMismatch(format!(
        "the server on {} speaks control protocol {theirs} and this sluice speaks {PROTOCOL}: \
         run the sluice that started it, or restart the server with this one",
        path.display()
    ))))
}

/// Sends `args` to the server of `pool`, if there is one; returns its output.
pub fn forward(pool: &str, args: &[String]) -> Option<anyhow::Result<String>> {
    let path = socket_path(pool);
    let stream = UnixStream::connect(&path).ok()?;
    Some((|| {
        send_request(&stream, args)?;
        let mut answer = String::new();
        BufReader::new(&stream).read_line(&mut answer)?;
        let answer: Answer = serde_json::from_str(&answer)
            .with_context(|| format!("reading the answer of the server on {}", path.display()))?;
        check_protocol(&answer, &path)?;
        if answer.ok {
            Ok(answer.out)
        } else {
            print!("{}", answer.out);
            if answer.error.is_empty() {
                anyhow::bail!("the server on {} refused the command", path.display())
            }
            Err(answer.into_error())
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
            let stream = match listener.accept().await {
                Ok((stream, _)) => stream,
                Err(error) => {
                    // Out of descriptors (EMFILE) or a connection gone before it was taken:
                    // the listener stays readable, so retrying at once would spin a core.
                    eprintln!("sluice: control socket of pool {name}: accept failed: {error}");
                    tokio::time::sleep(std::time::Duration::from_millis(100)).await;
                    continue;
                }
            };
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
                let answer = match parse_request(&line) {
                    Ok(args) if is_streaming(&args) => {
                        // Bytes the line reader took past the request belong to the stream.
                        let buffered = reader.get_ref().buffer().to_vec();
                        let read_half = reader.into_inner().into_inner();
                        let Ok(stream) = read_half.reunite(writer) else { return };
                        let Ok(stream) = stream.into_std() else { return };
                        let handle = tokio::runtime::Handle::current();
                        let _ = tokio::task::spawn_blocking(move || {
                            stream_command(&handle, &store, &args, buffered, stream)
                        })
                        .await;
                        return;
                    }
                    Ok(args) => run(&env, store, args).await,
                    Err(e) => Answer::failed(String::new(), &e),
                };
                let _ = writer.write_all(answer.to_line().as_bytes()).await;
            });
        }
    }))
}

/// `send` and `recv` carry a stream after the request line (`recv`) or before the answer
/// (`send`), in the same connection; `recv -A` reads no stream.
fn is_streaming(args: &[String]) -> bool {
    match args.first().map(String::as_str) {
        Some("send") => true,
        Some("recv") => !args.iter().any(|a| a == "-A"),
        _ => false,
    }
}

/// A streaming request, parsed as the command line it came from.
enum Streaming {
    Send(pools::SendWhat),
    Recv { spec: String, resumable: bool },
}

fn streaming_request(args: &[String]) -> anyhow::Result<Streaming> {
    let cli = <crate::Cli as clap::Parser>::try_parse_from(
        std::iter::once("sluice".to_owned()).chain(args.iter().cloned()),
    )?;
    match cli.command {
        crate::Command::Send { spec, from, token } => {
            Ok(Streaming::Send(pools::SendWhat::new(spec, from, token)?))
        }
        crate::Command::Recv { spec, resumable, abort: false } => {
            pools::split_volume_spec(&spec)?;
            Ok(Streaming::Recv { spec, resumable })
        }
        _ => anyhow::bail!("not a streaming request: {args:?}"),
    }
}

/// Runs a streaming command on a blocking thread, the connection switched to blocking I/O.
/// `send`: an answer line, the stream, then a second answer line once the stream is whole (a
/// failure part way ends the connection without the end record, which the client and any
/// receiver refuse). `recv`: the stream from the client, then one answer line.
fn stream_command(
    handle: &tokio::runtime::Handle,
    store: &Arc<Store>,
    args: &[String],
    buffered: Vec<u8>,
    stream: UnixStream,
) {
    use std::io::Read;
    if stream.set_nonblocking(false).is_err() {
        return;
    }
    let answer_line = |ok: bool, out: String, error: String| {
        Answer { protocol: PROTOCOL, ok, out, error, kind: None }.to_line()
    };
    let (spec, resumable) = match streaming_request(args) {
        Ok(Streaming::Recv { spec, resumable }) => (spec, resumable),
        Ok(Streaming::Send(what)) => {
            let mut out = std::io::BufWriter::with_capacity(1 << 20, &stream);
            if out.write_all(answer_line(true, String::new(), String::new()).as_bytes()).is_err() {
                return;
            }
            let mut writer = sluice_format::StreamWriter::new(out);
            match handle.block_on(what.send_from(store, &mut writer)) {
                Ok(said) => {
                    let Ok(_) = writer.finish() else { return };
                    let _ = (&stream).write_all(answer_line(true, said, String::new()).as_bytes());
                }
                Err(e) => {
                    eprintln!(
                        "sluice: send from pool {} failed part way: {}",
                        what.pool(),
                        crate::hints::message(&e)
                    )
                }
            }
            return;
        }
        Err(e) => {
            let _ = (&stream).write_all(Answer::failed(String::new(), &e).to_line().as_bytes());
            return;
        }
    };
    let volume = match pools::split_volume_spec(&spec) {
        Ok((_, volume)) => volume.to_owned(),
        Err(_) => return,
    };
    let Ok(read_half) = stream.try_clone() else { return };
    let input = std::io::Cursor::new(buffered).chain(read_half);
    let mut reader =
        sluice_format::StreamReader::new(std::io::BufReader::with_capacity(1 << 20, input));
    let result = {
        let mut next = || reader.next_record();
        let mode = if resumable { ReceiveMode::Resumable } else { ReceiveMode::Whole };
        handle.block_on(store.receive(&volume, mode, &mut next))
    };
    let line = match result {
        Ok(summary) => answer_line(
            true,
            format!("received {spec}: {}\n", pools::store_snapshot_note(&summary)),
            String::new(),
        ),
        Err(e) => Answer::failed(String::new(), &anyhow::Error::new(e)).to_line(),
    };
    let _ = (&stream).write_all(line.as_bytes());
}

/// `sluice send` of a served pool: the server's stream, checked record by record as it is
/// copied to `out`; `Some` if the pool is served.
pub fn forward_send(
    pool: &str,
    args: &[String],
    out: &mut dyn Write,
) -> Option<anyhow::Result<()>> {
    let path = socket_path(pool);
    let stream = UnixStream::connect(&path).ok()?;
    Some((|| {
        send_request(&stream, args)?;
        let mut input = BufReader::with_capacity(1 << 20, &stream);
        let answer = read_answer(&mut input, &path)?;
        if !answer.ok {
            return Err(answer.into_error());
        }
        {
            let mut reader = sluice_format::StreamReader::new(Tee { input: &mut input, out });
            while reader.next_record()?.is_some() {}
        }
        let answer = read_answer(&mut input, &path)?;
        eprint!("{}", answer.out);
        if !answer.out.ends_with('\n') {
            eprintln!();
        }
        Ok(())
    })())
}

/// `sluice recv` into a served pool: standard input to the server, then its answer.
pub fn forward_recv(
    pool: &str,
    args: &[String],
    input: &mut dyn std::io::Read,
) -> Option<anyhow::Result<String>> {
    let path = socket_path(pool);
    let stream = UnixStream::connect(&path).ok()?;
    Some((|| {
        send_request(&stream, args)?;
        // A server that refuses early stops reading: its answer says why.
        let _ = std::io::copy(input, &mut &stream);
        let _ = stream.shutdown(std::net::Shutdown::Write);
        let answer = read_answer(&mut BufReader::new(&stream), &path)?;
        if answer.ok {
            Ok(answer.out)
        } else {
            Err(answer.into_error())
        }
    })())
}

fn read_answer(input: &mut impl BufRead, path: &std::path::Path) -> anyhow::Result<Answer> {
    let mut line = String::new();
    input.read_line(&mut line)?;
    if line.is_empty() {
        anyhow::bail!(
            "the server on {} ended the connection without an answer; its log says why",
            path.display()
        );
    }
    let answer: Answer = serde_json::from_str(&line)
        .with_context(|| format!("reading the answer of the server on {}", path.display()))?;
    check_protocol(&answer, path)?;
    Ok(answer)
}

/// Copies what it reads to `out`.
struct Tee<'a, R> {
    input: R,
    out: &'a mut dyn Write,
}

impl<R: std::io::Read> std::io::Read for Tee<'_, R> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let n = self.input.read(buf)?;
        self.out.write_all(&buf[..n])?;
        Ok(n)
    }
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
        Ok(()) => Answer::done(ctx.out),
        Err(e) => Answer::failed(ctx.out, &e),
    }
}
