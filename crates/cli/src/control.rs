//! The control socket of `sluice serve`: while a pool is served, its leaves are locked by the
//! server, so the commands about that pool that can run on a live store (`sluice pool
//! status|list|sync|scrub|offline|online|clear|attach|detach|replace`, `sluice vol ...`,
//! `sluice snapshot ...`, `sluice clone`, `sluice send`, `sluice recv`) are sent to the
//! server, which runs them against its store (a volume created this way is exported at once)
//! and sends back what they said. `sluice pool iostat` sends the hidden `pool stats` for the
//! live counters (crate::iostat).
//!
//! The socket sits next to the pool cache file, named after the pool. One request per
//! connection, then frames until the end; each is a JSON object on one line whose first field
//! is `protocol`, the sender's version ([`PROTOCOL`]), which the receiver checks before it
//! reads anything else: a command and a server of different versions refuse each other with
//! an error that says so and what to run (exit code 11), rather than misreading each other.
//!
//! - The request, [`Request`]: `{"protocol": 6, "command": C}`, C being the command line's
//!   own parsed subcommand (`crate::command::Command`) in its serde form, for example
//!   `{"pool": {"pool": {"scrub": {"name": "tank", "pause": false, "stop": false, "wait":
//!   true}}}}` (the outer `pool` is the subcommand, the inner its field). The
//!   server does not parse a command line.
//! - Frames, [`Frame`], in order: `{"protocol": 6, "progress": P}` while a command waits for a
//!   scrub or resilver (`crate::pools::output::Progress`, printed by the command as it
//!   arrives); `{"protocol": 6, "reply": R}` for each thing the command said
//!   (`crate::pools::output::Reply`: typed values such as a pool's status or a volume list,
//!   which the command renders as text, `-H` or `--json` exactly as it renders them for a pool
//!   it opened itself; `pool stats` is a `Reply::Stats` carrying the `PoolSnapshot`); and last
//!   `{"protocol": 6, "ok": true}`, or `{"protocol": 6, "ok": false, "error": message,
//!   "kind": name}`, `kind` naming what kind of failure it was (crate::exit's names, so the
//!   client exits with the code the server's error calls for).
//! - `send` and `recv` carry a stream in the same connection: `send`'s server answers
//!   `{"ok": true}` (or a refusal), then the stream, then its frames; `recv`'s client sends
//!   the stream after the request and reads the frames once the server has taken it all.
//!
//! Versions: 1 sent the argument list as a bare JSON array; 2 sent `{"protocol": 2, "args":
//! [...]}`, which the server parsed as a command line, and answered with pre-rendered text. A
//! server of version 2 answers a version 3 request with a version 2 refusal, and this command
//! reports the mismatch; a version 2 command reads this server's refusal, which has the fields
//! it knows (`ok`, `error`, `kind`), and reports it likewise.

use std::io::{BufRead, BufReader, Write};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use anyhow::Context;
use serde::{Deserialize, Serialize};
use sluice_engine::rt::Env;
use sluice_engine::{ReceiveMode, Store};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt};

use crate::command::Command;
use crate::pools::output::{render_progress, Progress, Reply};
use crate::pools::replication::{received, SendWhat};
use crate::{exit, pools};

/// The control protocol's version. 2: requests and answers say their version; answers say
/// what kind of failure they carry. 3: the request is the typed command, the answer typed
/// replies and progress frames, rendered by the command. 4: `key load|unload|change` and `vol
/// create`'s encryption, whose commands carry key material (never printed, zeroed on drop).
/// 5: `pool events`, whose `-f` answers with a reply frame per event until the client goes.
/// 6: `pool get` and `pool set`; snapshot rows say whether a schedule took them.
pub const PROTOCOL: u32 = 6;

/// One command for the server.
#[derive(Serialize, Deserialize)]
pub struct Request {
    pub protocol: u32,
    pub command: Command,
}

/// One line from the server: a progress report, a reply, or the end (`ok`).
#[derive(Debug, Default, Serialize, Deserialize)]
pub struct Frame {
    /// The server's protocol version (absent from a server of the unnumbered first protocol).
    #[serde(default)]
    pub protocol: u32,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub progress: Option<Progress>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reply: Option<Reply>,
    /// Present on the last frame: whether the command succeeded.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ok: Option<bool>,
    /// Why it failed, when it did.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    /// What kind of failure it was (crate::exit's names), when known.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kind: Option<String>,
}

impl Frame {
    fn progress(progress: Progress) -> Frame {
        Frame { protocol: PROTOCOL, progress: Some(progress), ..Frame::default() }
    }

    fn reply(reply: Reply) -> Frame {
        Frame { protocol: PROTOCOL, reply: Some(reply), ..Frame::default() }
    }

    /// The end of a command that succeeded (for `send`, also: the stream follows).
    fn done() -> Frame {
        Frame { protocol: PROTOCOL, ok: Some(true), ..Frame::default() }
    }

    /// The end of a command that failed: the error with its kind.
    fn failed(error: &anyhow::Error) -> Frame {
        Frame {
            protocol: PROTOCOL,
            ok: Some(false),
            error: Some(crate::hints::message(error)),
            kind: if error.chain().any(|c| c.is::<exit::ProtocolMismatch>()) {
                Some(PROTOCOL_KIND.to_owned())
            } else {
                exit::kind_of(error).map(|kind| exit::kind_name(kind).to_owned())
            },
            ..Frame::default()
        }
    }

    /// The client's side of a last frame: success, or the error of its kind.
    fn end(self, path: &Path) -> anyhow::Result<()> {
        let error = match (self.ok, self.error) {
            (Some(true), _) => return Ok(()),
            (Some(false), Some(error)) if !error.is_empty() => error,
            (Some(false), _) => format!("the server on {} refused the command", path.display()),
            (None, _) => anyhow::bail!(
                "the server on {} sent a frame this sluice does not read",
                path.display()
            ),
        };
        if self.kind.as_deref() == Some(PROTOCOL_KIND) {
            return Err(anyhow::Error::new(exit::ProtocolMismatch(error)));
        }
        match self.kind.as_deref().and_then(exit::kind_named) {
            Some(kind) => Err(exit::refuse(kind, error)),
            None => Err(anyhow::anyhow!("{error}")),
        }
    }

    /// The frame as the one line the socket carries.
    fn to_line(&self) -> String {
        let mut line = serde_json::to_string(self).unwrap_or_else(|e| {
            // Plain data: serializing cannot fail; were it to, the client reads a refusal.
            let error = format!("the server could not encode its answer: {e}");
            serde_json::json!({ "protocol": PROTOCOL, "ok": false, "error": error }).to_string()
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

/// The kind a frame gives a protocol mismatch.
const PROTOCOL_KIND: &str = "protocol";

/// Writes a request: `command` as one JSON line.
fn send_request(stream: &UnixStream, command: &Command) -> anyhow::Result<()> {
    let request = Request { protocol: PROTOCOL, command: clone_command(command)? };
    let mut line = serde_json::to_string(&request)?;
    line.push('\n');
    Ok((&*stream).write_all(line.as_bytes())?)
}

/// A copy of `command` (clap's types are not `Clone`; their serde form is the copy).
fn clone_command(command: &Command) -> anyhow::Result<Command> {
    Ok(serde_json::from_value(serde_json::to_value(command)?)?)
}

/// The version a JSON line says it speaks: its `protocol` field; 0 for a line of the first,
/// unnumbered protocol (an array, or an object without one).
fn version_of(value: &serde_json::Value) -> u64 {
    value.get("protocol").and_then(serde_json::Value::as_u64).unwrap_or(0)
}

/// Names a version for a mismatch message.
fn version_name(version: u64) -> String {
    match version {
        0 => "the first, unnumbered one".to_owned(),
        n => n.to_string(),
    }
}

/// The server's side: the command of a request line, or why it is refused (a request of
/// another protocol, or not a request at all).
fn parse_request(line: &str) -> anyhow::Result<Command> {
    let bad =
        |e: serde_json::Error| anyhow::anyhow!("bad request (a JSON object on one line): {e}");
    let value: serde_json::Value = serde_json::from_str(line).map_err(bad)?;
    let theirs = version_of(&value);
    if theirs != u64::from(PROTOCOL) {
        return Err(anyhow::Error::new(exit::ProtocolMismatch(format!(
            "this server speaks control protocol {PROTOCOL} and the sluice command that sent \
             the request speaks {}: run the sluice that started the server ({})",
            version_name(theirs),
            std::env::current_exe().map_or_else(|_| "sluice".into(), |p| p.display().to_string())
        ))));
    }
    Ok(serde_json::from_value::<Request>(value).map_err(bad)?.command)
}

/// The client's side: the next frame, refusing one of another protocol before reading it.
fn read_frame(input: &mut impl BufRead, path: &Path) -> anyhow::Result<Frame> {
    let mut line = String::new();
    input.read_line(&mut line)?;
    if line.is_empty() {
        anyhow::bail!(
            "the server on {} ended the connection without an answer; its log says why",
            path.display()
        );
    }
    let reading = || format!("reading the answer of the server on {}", path.display());
    let value: serde_json::Value = serde_json::from_str(&line).with_context(reading)?;
    let theirs = version_of(&value);
    if theirs != u64::from(PROTOCOL) {
        return Err(anyhow::Error::new(exit::ProtocolMismatch(format!(
            "the server on {} speaks control protocol {} and this sluice speaks {PROTOCOL}: \
             run the sluice that started it, or restart the server with this one",
            path.display(),
            version_name(theirs)
        ))));
    }
    serde_json::from_value(value).with_context(reading)
}

/// Reads frames to the last: progress is printed as it comes (standard error), replies are
/// added to `replies`; the last frame's success or error is the result.
fn read_to_end(
    input: &mut impl BufRead,
    path: &Path,
    replies: &mut Vec<Reply>,
) -> anyhow::Result<()> {
    loop {
        let frame = read_frame(input, path)?;
        if let Some(progress) = &frame.progress {
            eprintln!("{}", render_progress(progress));
        } else if let Some(reply) = frame.reply {
            replies.push(reply);
        } else {
            return frame.end(path);
        }
    }
}

/// Sends `command` to the server of `pool`, if there is one (`None` if not): its replies are
/// added to `replies`, its progress printed as it comes.
pub fn forward(
    pool: &str,
    command: &Command,
    replies: &mut Vec<Reply>,
) -> Option<anyhow::Result<()>> {
    let path = socket_path(pool);
    let stream = UnixStream::connect(&path).ok()?;
    Some((|| {
        send_request(&stream, command)?;
        read_to_end(&mut BufReader::new(&stream), &path, replies)
    })())
}

/// As [`forward`], for a command whose replies come as things happen (`pool events -f`):
/// each is handed to `each` as it arrives, until the server ends the command.
pub fn forward_each(
    pool: &str,
    command: &Command,
    mut each: impl FnMut(Reply),
) -> Option<anyhow::Result<()>> {
    let path = socket_path(pool);
    let stream = UnixStream::connect(&path).ok()?;
    Some((|| {
        send_request(&stream, command)?;
        let mut input = BufReader::new(&stream);
        loop {
            let frame = read_frame(&mut input, &path)?;
            if let Some(progress) = &frame.progress {
                eprintln!("{}", render_progress(progress));
            } else if let Some(reply) = frame.reply {
                each(reply);
            } else {
                return frame.end(&path);
            }
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
    // The owner only: a request may carry a volume's key (`key load`), and any request changes
    // the pool. (Connecting to a Unix socket needs write permission on it.)
    {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600))
            .with_context(|| format!("making {} owner-only", path.display()))?;
    }
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
                match parse_request(&line) {
                    Ok(command @ (Command::Send { .. } | Command::Recv { abort: false, .. })) => {
                        // Bytes the line reader took past the request belong to the stream.
                        let buffered = reader.get_ref().buffer().to_vec();
                        let read_half = reader.into_inner().into_inner();
                        let Ok(stream) = read_half.reunite(writer) else { return };
                        let Ok(stream) = stream.into_std() else { return };
                        let handle = tokio::runtime::Handle::current();
                        let _ = tokio::task::spawn_blocking(move || {
                            stream_command(&handle, &store, command, buffered, stream)
                        })
                        .await;
                    }
                    Ok(Command::Pool {
                        pool: crate::command::PoolCommand::Events { name, follow: true, .. },
                    }) => follow_events(&store, &name, reader, &mut writer).await,
                    Ok(command) => run(&env, store, command, &mut writer).await,
                    Err(e) => {
                        let _ = writer.write_all(Frame::failed(&e).to_line().as_bytes()).await;
                    }
                }
            });
        }
    }))
}

/// `pool events -f`: the events kept, then each new one as it is posted, each as a reply
/// frame, until the client goes (its end of the socket closes: it sends nothing after its
/// request) or the pool is closed.
async fn follow_events(
    store: &Store,
    name: &str,
    mut reader: impl tokio::io::AsyncRead + Unpin,
    writer: &mut tokio::net::unix::OwnedWriteHalf,
) {
    use futures::StreamExt;
    use tokio::io::AsyncReadExt;
    if store.pool().name() != name {
        let error = anyhow::anyhow!("this server serves pool {}, not {name}", store.pool().name());
        let _ = writer.write_all(Frame::failed(&error).to_line().as_bytes()).await;
        return;
    }
    let (kept, mut new) = store.pool().events().follow();
    let views = kept.iter().map(|e| crate::events::EventView::of(e)).collect();
    let first = Frame::reply(Reply::Events(crate::events::EventList { events: views }));
    if writer.write_all(first.to_line().as_bytes()).await.is_err() {
        return;
    }
    let mut byte = [0u8; 1];
    loop {
        tokio::select! {
            event = new.next() => {
                let Some(event) = event else {
                    let _ = writer.write_all(Frame::done().to_line().as_bytes()).await;
                    return;
                };
                let events = vec![crate::events::EventView::of(&event)];
                let frame = Frame::reply(Reply::Events(crate::events::EventList { events }));
                if writer.write_all(frame.to_line().as_bytes()).await.is_err() {
                    return;
                }
            }
            // The client sends nothing more: a read ends only when it has gone.
            _ = reader.read(&mut byte) => return,
        }
    }
}

/// Runs `command` against the live store, writing its progress frames while it runs, then
/// its replies and its end. A client gone part way stops reading; the command still ends as
/// it would have.
async fn run(
    env: &Env,
    store: Arc<Store>,
    command: Command,
    writer: &mut tokio::net::unix::OwnedWriteHalf,
) {
    let (progress, mut reports) = tokio::sync::mpsc::unbounded_channel();
    let work = async move {
        let mut ctx = pools::Ctx::serving(env, store, progress);
        let result = crate::run_pool_command(&mut ctx, command).await;
        (ctx.replies, result)
    };
    tokio::pin!(work);
    let mut gone = false;
    let (replies, result) = loop {
        tokio::select! {
            done = &mut work => break done,
            Some(report) = reports.recv() => {
                let line = Frame::progress(report).to_line();
                gone = gone || writer.write_all(line.as_bytes()).await.is_err();
            }
        }
    };
    let mut rest: Vec<Frame> = Vec::new();
    while let Ok(report) = reports.try_recv() {
        rest.push(Frame::progress(report));
    }
    rest.extend(replies.into_iter().map(Frame::reply));
    rest.push(match &result {
        Ok(()) => Frame::done(),
        Err(e) => Frame::failed(e),
    });
    if gone {
        return;
    }
    for frame in rest {
        if writer.write_all(frame.to_line().as_bytes()).await.is_err() {
            return;
        }
    }
}

/// Runs a streaming command on a blocking thread, the connection switched to blocking I/O.
/// `send`: an `ok` frame, the stream, then its frames once the stream is whole (a failure
/// part way ends the connection without the end record, which the client and any receiver
/// refuse). `recv`: the stream from the client, then the frames.
fn stream_command(
    handle: &tokio::runtime::Handle,
    store: &Arc<Store>,
    command: Command,
    buffered: Vec<u8>,
    stream: UnixStream,
) {
    use std::io::Read;
    if stream.set_nonblocking(false).is_err() {
        return;
    }
    let write = |frames: &[Frame]| {
        let text: String = frames.iter().map(Frame::to_line).collect();
        let _ = (&stream).write_all(text.as_bytes());
    };
    let (spec, resumable, new_key) = match command {
        Command::Recv { spec, resumable, encrypt, .. } => {
            let new_key = match encrypt.new_key(&spec) {
                Ok(key) => key,
                Err(e) => return write(&[Frame::failed(&e)]),
            };
            (spec, resumable, new_key)
        }
        Command::Send { spec, from, token, raw } => {
            let what = match SendWhat::new(spec, from, token, raw) {
                Ok(what) => what,
                Err(e) => return write(&[Frame::failed(&e)]),
            };
            let (started, abandoned) = (AtomicBool::new(false), AtomicBool::new(false));
            let first = OkFirst { stream: &stream, started: &started, abandoned: &abandoned };
            let out = std::io::BufWriter::with_capacity(1 << 20, first);
            let mut writer = sluice_format::StreamWriter::new(out);
            match handle.block_on(what.send_from(store, &mut writer)) {
                Ok(said) => {
                    let Ok(_) = writer.finish() else { return };
                    write(&[Frame::reply(Reply::done(said)), Frame::done()]);
                }
                // Refused before any of the stream went out: the client reads why.
                Err(e) if !started.load(Ordering::Relaxed) => {
                    abandoned.store(true, Ordering::Relaxed);
                    drop(writer);
                    write(&[Frame::failed(&e)]);
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
        _ => return,
    };
    let volume = match pools::split_volume(&spec) {
        Ok((_, volume)) => volume.to_owned(),
        Err(e) => return write(&[Frame::failed(&e)]),
    };
    let Ok(read_half) = stream.try_clone() else { return };
    let input = std::io::Cursor::new(buffered).chain(read_half);
    let mut reader =
        sluice_format::StreamReader::new(std::io::BufReader::with_capacity(1 << 20, input));
    let result = {
        let mut next = || reader.next_record();
        let mode = if resumable { ReceiveMode::Resumable } else { ReceiveMode::Whole };
        match new_key {
            Some(key) if !resumable => {
                handle.block_on(store.receive_encrypted(&volume, key, &mut next))
            }
            Some(_) => Err(crate::pools::replication::not_resumable_encrypted(
                store.pool().name(),
                &volume,
            )),
            None => handle.block_on(store.receive(&volume, mode, &mut next)),
        }
    };
    match result {
        Ok(summary) => {
            write(&[Frame::reply(Reply::done(received(&spec, &summary))), Frame::done()])
        }
        Err(e) => write(&[Frame::failed(&anyhow::Error::new(e))]),
    }
}

/// `sluice send` of a served pool: the server's stream, checked record by record as it is
/// copied to `out`, then what the server says of it on standard error; `Some` if the pool is
/// served.
pub fn forward_send(
    pool: &str,
    command: &Command,
    out: &mut dyn Write,
) -> Option<anyhow::Result<()>> {
    let path = socket_path(pool);
    let stream = UnixStream::connect(&path).ok()?;
    Some((|| {
        send_request(&stream, command)?;
        let mut input = BufReader::with_capacity(1 << 20, &stream);
        // The server's `ok` (the stream follows) or its refusal.
        read_frame(&mut input, &path)?.end(&path)?;
        {
            let mut reader = sluice_format::StreamReader::new(Tee { input: &mut input, out });
            while reader.next_record()?.is_some() {}
        }
        let mut replies = Vec::new();
        let result = read_to_end(&mut input, &path, &mut replies);
        eprint!("{}", pools::output::render_all(replies, pools::output::Format::Text));
        result
    })())
}

/// A send's connection as the stream goes out: the server's `ok` (the stream follows) is
/// written before the stream's first byte, so a send refused before its first record (no
/// such snapshot, an encrypted volume sent without -w) answers with its refusal instead, which
/// the command reports; once `abandoned`, nothing more is written.
struct OkFirst<'a> {
    stream: &'a UnixStream,
    started: &'a AtomicBool,
    abandoned: &'a AtomicBool,
}

impl Write for OkFirst<'_> {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        let started = self.started.load(Ordering::Relaxed);
        if self.abandoned.load(Ordering::Relaxed) && !started {
            return Ok(buf.len());
        }
        if !started {
            (&*self.stream).write_all(Frame::done().to_line().as_bytes())?;
            self.started.store(true, Ordering::Relaxed);
        }
        (&*self.stream).write(buf)
    }

    fn flush(&mut self) -> std::io::Result<()> {
        (&*self.stream).flush()
    }
}

/// `sluice recv` into a served pool: standard input to the server, then its replies.
pub fn forward_recv(
    pool: &str,
    command: &Command,
    input: &mut dyn std::io::Read,
) -> Option<anyhow::Result<Vec<Reply>>> {
    let path = socket_path(pool);
    let stream = UnixStream::connect(&path).ok()?;
    Some((|| {
        send_request(&stream, command)?;
        // A server that refuses early stops reading: its answer says why.
        let _ = std::io::copy(input, &mut &stream);
        let _ = stream.shutdown(std::net::Shutdown::Write);
        let mut replies = Vec::new();
        read_to_end(&mut BufReader::new(&stream), &path, &mut replies)?;
        Ok(replies)
    })())
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::command::{PoolCommand, VolCommand};

    fn request_line(command: Command) -> String {
        serde_json::to_string(&Request { protocol: PROTOCOL, command }).unwrap()
    }

    /// The request is the parsed command itself, version first; the server reads it back
    /// without a command line.
    #[test]
    fn requests_are_the_typed_command() {
        let scrub =
            PoolCommand::Scrub { name: "tank".into(), pause: false, stop: false, wait: true };
        let line = request_line(Command::Pool { pool: scrub });
        assert!(
            line.starts_with("{\"protocol\":6,\"command\":{\"pool\":{\"pool\":{\"scrub\":"),
            "{line}"
        );
        match parse_request(&line).unwrap() {
            Command::Pool { pool: PoolCommand::Scrub { name, wait: true, .. } } => {
                assert_eq!(name, "tank")
            }
            _ => panic!("not the scrub sent: {line}"),
        }
        let cli = <crate::command::Cli as clap::Parser>::try_parse_from([
            "sluice",
            "vol",
            "create",
            "tank/v",
            "--size",
            "1.5G",
            "--compression",
            "zstd-7",
        ])
        .unwrap();
        let line = request_line(cli.command);
        assert!(
            line.contains("\"compression\":\"zstd-7\"") && line.contains("1610612736"),
            "{line}"
        );
        match parse_request(&line).unwrap() {
            Command::Vol { vol: VolCommand::Create { size, compression, .. } } => {
                assert_eq!((size, compression.name()), (3 << 29, "zstd-7".to_owned()))
            }
            _ => panic!("not the create sent: {line}"),
        }
    }

    /// A key travels inside its command (the socket is the owner's only) and is read back
    /// whole; its `Debug` says how long it is, never what it is.
    #[test]
    fn a_key_crosses_the_socket_in_its_command_and_is_never_printed() {
        let key: pools::key::KeyMaterial =
            serde_json::from_str("[115,101,99,114,101,116,33,33]").unwrap();
        assert_eq!(format!("{key:?}"), "KeyMaterial(8 bytes)");
        let load = crate::command::KeyCommand::Load {
            spec: "tank/db".into(),
            location: None,
            key: Some(key),
        };
        let line = request_line(Command::Key { key: load });
        assert!(line.contains("[115,101,99,114,101,116,33,33]"), "{line}");
        match parse_request(&line).unwrap() {
            Command::Key { key: crate::command::KeyCommand::Load { spec, key: Some(key), .. } } => {
                assert_eq!(spec, "tank/db");
                assert_eq!(format!("{key:?}"), "KeyMaterial(8 bytes)");
            }
            _ => panic!("not the key load sent"),
        }
    }

    /// Requests of the first and second protocols are refused as such, with kind
    /// `protocol`, and nothing else of them is read.
    #[test]
    fn older_requests_are_refused_as_another_protocol() {
        for (line, theirs) in [
            ("[\"pool\", \"status\", \"tank\"]", "speaks the first, unnumbered one"),
            ("{\"protocol\":2,\"args\":[\"pool\",\"status\",\"tank\"]}", "speaks 2"),
        ] {
            let Err(error) = parse_request(line) else { panic!("{line} was taken") };
            assert!(error.to_string().contains(theirs), "{error}");
            let frame = Frame::failed(&error);
            assert_eq!(frame.kind.as_deref(), Some(PROTOCOL_KIND));
            assert_eq!(exit::code(&frame.end(Path::new("x")).unwrap_err()), exit::PROTOCOL);
        }
        let Err(bad) = parse_request("{\"protocol\":6,\"args\":[]}") else { panic!("taken") };
        assert!(bad.to_string().contains("bad request"), "{bad}");
    }

    /// What a server of the second protocol answers a request of this one (it finds no
    /// `args`) is read as a mismatch, not as a failure of the command.
    #[test]
    fn a_second_protocol_server_is_named_as_such() {
        let answer = "{\"protocol\":2,\"ok\":false,\"out\":\"\",\"error\":\"bad request (a JSON \
                      object on one line): missing field `args`\",\"kind\":null}\n";
        let error = read_frame(&mut answer.as_bytes(), Path::new("/s/tank.control")).unwrap_err();
        assert_eq!(exit::code(&error), exit::PROTOCOL);
        let said = error.to_string();
        assert!(
            said.contains(&format!("speaks control protocol 2 and this sluice speaks {PROTOCOL}")),
            "{said}"
        );
    }

    /// Frames in order: progress, replies, the end with the failure's kind.
    #[test]
    fn frames_carry_progress_replies_and_the_kind_of_failure() {
        let failure = exit::refuse(sluice_engine::ErrorKind::NotFound, "no pool named x");
        let progress = Progress {
            pool: "tank".into(),
            func: "scrub".into(),
            fraction: 0.5,
            examined_bytes: 1,
            total_bytes: 2,
            issued_bytes: 1,
            errors: 0,
            seconds: 1,
        };
        let text: String =
            [Frame::progress(progress), Frame::reply(Reply::done("said")), Frame::failed(&failure)]
                .iter()
                .map(Frame::to_line)
                .collect();
        let mut replies = Vec::new();
        let error = read_to_end(&mut text.as_bytes(), Path::new("x"), &mut replies).unwrap_err();
        assert_eq!(replies, [Reply::done("said")]);
        assert_eq!(exit::code(&error), 3, "{error}");
        let mut replies = Vec::new();
        let ok = Frame::done().to_line();
        assert_eq!(ok, "{\"protocol\":6,\"ok\":true}\n");
        read_to_end(&mut ok.as_bytes(), Path::new("x"), &mut replies).unwrap();
    }
}
