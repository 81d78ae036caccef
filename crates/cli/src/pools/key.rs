//! `sluice key load|unload|change` and `vol create --encryption` (ZFS: `zfs load-key`,
//! `unload-key`, `change-key`, `zfs create -o encryption=`): the words of the encryption
//! properties, reading a key from the terminal or a key file, and the commands themselves.
//!
//! The key is read by the process the user runs, never by a server on its behalf: from the
//! prompt (the terminal, with echo off, or standard input when it is not one) or from the
//! file `keylocation` names. It then travels inside the command: over the served pool's
//! control socket (owner-only, control.rs) or to the pool this process opens. Key bytes are
//! zeroed when dropped, and never printed (`KeyMaterial`'s `Debug` says only how long it is).

use std::io::{IsTerminal, Read, Write};

use anyhow::Context;
use serde::{Deserialize, Serialize};
use sluice_engine::{KeyStatus, NewKey, UserKey};
use sluice_format::{KeyFormat, KeyLocation};
use zeroize::Zeroize;

use super::{split_volume, Ctx};

/// Key bytes as the user gave them, carried in a command to the pool: zeroed on drop.
#[derive(Clone, Default, Serialize, Deserialize)]
pub struct KeyMaterial(Vec<u8>);

impl Drop for KeyMaterial {
    fn drop(&mut self) {
        self.0.zeroize();
    }
}

impl std::fmt::Debug for KeyMaterial {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "KeyMaterial({} bytes)", self.0.len())
    }
}

impl KeyMaterial {
    /// The engine's key, holding a copy (zeroed when dropped too).
    fn user_key(&self) -> UserKey {
        UserKey::new(self.0.clone())
    }
}

/// `--encryption`: `off`, or `on` / `aes-256-gcm` (the one suite built).
pub fn parse_encryption(value: &str) -> Result<bool, String> {
    match value {
        "off" => Ok(false),
        "on" | "aes-256-gcm" => Ok(true),
        other => Err(format!(
            "encryption={other} is not a suite sluice builds; use on (aes-256-gcm), aes-256-gcm \
             or off (aes-128/192 and ccm are not built: they would cost as much and protect less)"
        )),
    }
}

/// `--keyformat`.
pub fn parse_keyformat(value: &str) -> Result<KeyFormat, String> {
    match value {
        "raw" => Ok(KeyFormat::Raw),
        "hex" => Ok(KeyFormat::Hex),
        "passphrase" => Ok(KeyFormat::Passphrase),
        other => Err(format!(
            "keyformat={other} is not a key format; use raw (32 bytes), hex (64 hex digits) or \
             passphrase (8 to 512 bytes)"
        )),
    }
}

/// `--keylocation`: `prompt` or `file:///ABSOLUTE/PATH`.
pub fn parse_keylocation(value: &str) -> Result<KeyLocation, String> {
    if value == "prompt" {
        return Ok(KeyLocation::Prompt);
    }
    match value.strip_prefix("file://") {
        Some(path) if path.starts_with('/') => Ok(KeyLocation::File(path.to_owned())),
        Some(path) => Err(format!(
            "keylocation={value}: the path {path:?} is not absolute; write file:///PATH (three \
             slashes), as the server that reads it may run in another directory"
        )),
        None => Err(format!(
            "keylocation={value} is not a key location; use prompt or file:///ABSOLUTE/PATH"
        )),
    }
}

/// [`parse_encryption`] for clap: the checked word.
pub fn check_encryption(value: &str) -> Result<String, String> {
    parse_encryption(value).map(|_| value.to_owned())
}

/// [`parse_keyformat`] for clap: the checked word.
pub fn check_keyformat(value: &str) -> Result<String, String> {
    parse_keyformat(value).map(|_| value.to_owned())
}

/// [`parse_keylocation`] for clap: the checked word.
pub fn check_keylocation(value: &str) -> Result<String, String> {
    parse_keylocation(value).map(|_| value.to_owned())
}

/// `recv`'s options that receive a stream into a new encrypted volume (zfs receive -o
/// encryption=on -o keyformat=… -o keylocation=…), and the key the command read for it.
#[derive(clap::Args, Clone, Debug, Serialize, Deserialize)]
pub struct EncryptArgs {
    /// Receive a full stream that is not raw into a new encrypted volume: on
    /// (aes-256-gcm), aes-256-gcm or off (default). How an existing volume moves into
    /// encryption (`sluice send tank/old@s | sluice recv --encryption on --keyformat
    /// passphrase tank/new`). Needs --keyformat.
    #[arg(long, value_parser = check_encryption, default_value = "off")]
    pub encryption: String,
    /// raw, hex or passphrase, as for `vol create`.
    #[arg(long, value_parser = check_keyformat)]
    pub keyformat: Option<String>,
    /// prompt (default) or file:///ABSOLUTE/PATH, as for `vol create`.
    #[arg(long, value_parser = check_keylocation)]
    pub keylocation: Option<String>,
    /// The key, read by the command before it is sent.
    #[arg(skip)]
    #[serde(default)]
    pub key: Option<KeyMaterial>,
}

impl Default for EncryptArgs {
    fn default() -> EncryptArgs {
        EncryptArgs { encryption: "off".to_owned(), keyformat: None, keylocation: None, key: None }
    }
}

impl EncryptArgs {
    /// The options with the key read for `spec`, if they ask for encryption (a prompt asks
    /// twice for a passphrase). Done by the command the user runs, before anything is sent.
    pub fn with_key(mut self, spec: &str) -> anyhow::Result<EncryptArgs> {
        let settings =
            Encrypt::from_args(&self.encryption, self.keyformat.clone(), self.keylocation.clone())?;
        if let Some(settings) = settings {
            self.key = Some(match settings.location {
                // Standard input carries the stream: a prompt is answered at the terminal.
                KeyLocation::Prompt => read_key_at_terminal(spec, settings.format)?,
                location => read_key(spec, settings.format, &location, true)?,
            });
        }
        Ok(self)
    }

    /// The new volume's key, if the options ask for encryption.
    pub fn new_key(&self, spec: &str) -> anyhow::Result<Option<NewKey>> {
        let settings =
            Encrypt::from_args(&self.encryption, self.keyformat.clone(), self.keylocation.clone())?;
        match settings {
            None => Ok(None),
            Some(settings) => {
                let key = self.key.as_ref().ok_or_else(|| no_key(spec))?;
                Ok(Some(new_key(settings.format, settings.location, key)))
            }
        }
    }
}

/// What `vol create --encryption on` was told of the new key.
#[derive(Clone, Debug)]
pub struct Encrypt {
    pub format: KeyFormat,
    pub location: KeyLocation,
}

impl Encrypt {
    /// The encryption `vol create`'s options ask for, if any: `--keyformat` is needed with
    /// it, and neither key option means anything without it.
    pub fn from_args(
        encryption: &str,
        keyformat: Option<String>,
        keylocation: Option<String>,
    ) -> anyhow::Result<Option<Encrypt>> {
        if !parse_encryption(encryption).map_err(anyhow::Error::msg)? {
            if keyformat.is_some() || keylocation.is_some() {
                anyhow::bail!(
                    "--keyformat and --keylocation are for an encrypted volume: add --encryption on"
                );
            }
            return Ok(None);
        }
        let Some(format) = keyformat else {
            anyhow::bail!(
                "--encryption needs --keyformat raw, hex or passphrase (how the key is given)"
            );
        };
        let format = parse_keyformat(&format).map_err(anyhow::Error::msg)?;
        let location = match keylocation {
            Some(text) => parse_keylocation(&text).map_err(anyhow::Error::msg)?,
            None => KeyLocation::Prompt,
        };
        Ok(Some(Encrypt { format, location }))
    }
}

/// Refuses `--encryption` for a name that is not a volume's: a snapshot shares its volume's
/// key, and cannot be given one.
pub fn check_new_volume_name(spec: &str) -> anyhow::Result<()> {
    if spec.contains('@') {
        anyhow::bail!(
            "{spec} names a snapshot, which is encrypted with its volume's key (or not at all) \
             and cannot be given --encryption of its own"
        );
    }
    Ok(())
}

/// How an encrypted volume's key is kept, as `vol get` reports it.
#[derive(Clone, Debug)]
pub struct KeptKey {
    pub format: KeyFormat,
    pub location: KeyLocation,
}

impl KeptKey {
    /// Reads keyformat and keylocation from `vol get`'s replies.
    pub fn from_replies(spec: &str, replies: &[super::output::Reply]) -> anyhow::Result<KeptKey> {
        let value = |name: &str| {
            replies.iter().find_map(|reply| match reply {
                super::output::Reply::VolProps(props) => {
                    props.properties.iter().find_map(|p| match (&p.value, p.name == name) {
                        (super::output::PropValue::Text(text), true) => Some(text.clone()),
                        _ => None,
                    })
                }
                _ => None,
            })
        };
        let (Some(format), Some(location)) = (value("keyformat"), value("keylocation")) else {
            anyhow::bail!("the pool did not say how {spec}'s key is kept");
        };
        if format == "none" {
            anyhow::bail!("volume {spec} is not encrypted: it has no key");
        }
        Ok(KeptKey {
            format: parse_keyformat(&format).map_err(anyhow::Error::msg)?,
            location: parse_keylocation(&location).map_err(anyhow::Error::msg)?,
        })
    }
}

/// How a key location is written.
pub fn location_text(location: &KeyLocation) -> String {
    match location {
        KeyLocation::Prompt => "prompt".to_owned(),
        KeyLocation::File(path) => format!("file://{path}"),
    }
}

/// Keeps this process's memory, which holds a key from now on, out of core dumps where Linux
/// allows (`PR_SET_DUMPABLE` 0: no core file, and no other user's ptrace or /proc/PID/mem).
/// Called by every process that reads or loads a key: the command that reads it, and the
/// server that holds it.
pub fn keep_keys_out_of_core_dumps() {
    // SAFETY: prctl with PR_SET_DUMPABLE takes integers only and changes no memory.
    unsafe {
        libc::prctl(libc::PR_SET_DUMPABLE, 0, 0, 0, 0);
    }
}

/// Reads `spec`'s key in `format` from `location`. A passphrase typed for a new key is asked
/// for twice (`confirm`), as `zfs create` does.
pub fn read_key(
    spec: &str,
    format: KeyFormat,
    location: &KeyLocation,
    confirm: bool,
) -> anyhow::Result<KeyMaterial> {
    keep_keys_out_of_core_dumps();
    match location {
        KeyLocation::File(path) => {
            let bytes = std::fs::read(path).with_context(|| {
                format!("reading the key of {spec} from {path} (keylocation=file://{path})")
            })?;
            Ok(KeyMaterial(bytes))
        }
        KeyLocation::Prompt => {
            let stdin = std::io::stdin();
            if !stdin.is_terminal() {
                // Piped: raw keys are the bytes as they come; the others end at a newline.
                let mut bytes = Vec::new();
                stdin
                    .lock()
                    .read_to_end(&mut bytes)
                    .context("reading the key from standard input")?;
                if format != KeyFormat::Raw {
                    if let Some(end) = bytes.iter().position(|&b| b == b'\n') {
                        bytes[end..].zeroize();
                        bytes.truncate(end);
                    }
                }
                return Ok(KeyMaterial(bytes));
            }
            let what = match format {
                KeyFormat::Passphrase => "passphrase",
                KeyFormat::Hex => "hex key",
                KeyFormat::Raw => "raw key",
            };
            let first = prompt_hidden(&format!("Enter {what} for '{spec}': "))?;
            if confirm {
                let again = prompt_hidden(&format!("Re-enter {what} for '{spec}': "))?;
                if again.0 != first.0 {
                    anyhow::bail!("the two {what}s for {spec} differ; nothing was changed");
                }
            }
            Ok(first)
        }
    }
}

/// A new key typed at the controlling terminal (`/dev/tty`), twice, for a command whose
/// standard input is taken (`recv`'s stream).
fn read_key_at_terminal(spec: &str, format: KeyFormat) -> anyhow::Result<KeyMaterial> {
    keep_keys_out_of_core_dumps();
    let tty = std::fs::File::open("/dev/tty").with_context(|| {
        format!(
            "the stream comes on standard input, so {spec}'s key is asked at the terminal, and \
             there is none: give it in a file (--keylocation file:///PATH, mode 600)"
        )
    })?;
    let fd = std::os::fd::AsRawFd::as_raw_fd(&tty);
    let mut lines = std::io::BufReader::new(tty);
    let what = if format == KeyFormat::Passphrase { "passphrase" } else { "key" };
    let first = prompt_hidden_on(&format!("Enter {what} for '{spec}': "), fd, &mut lines)?;
    let again = prompt_hidden_on(&format!("Re-enter {what} for '{spec}': "), fd, &mut lines)?;
    if again.0 != first.0 {
        anyhow::bail!("the two {what}s for {spec} differ; nothing was received");
    }
    Ok(first)
}

/// Reads a line from the terminal with echo turned off (restored after, whatever happens).
fn prompt_hidden(prompt: &str) -> anyhow::Result<KeyMaterial> {
    prompt_hidden_on(prompt, libc::STDIN_FILENO, &mut std::io::stdin().lock())
}

/// [`prompt_hidden`] on `input`, the terminal whose descriptor is `fd` (standard input or
/// `/dev/tty`).
fn prompt_hidden_on(
    prompt: &str,
    fd: std::os::fd::RawFd,
    input: &mut dyn std::io::BufRead,
) -> anyhow::Result<KeyMaterial> {
    let mut err = std::io::stderr();
    let _ = write!(err, "{prompt}");
    let _ = err.flush();
    // SAFETY: tcgetattr/tcsetattr on the terminal `fd`, open for this call, with a termios
    // owned here.
    let saved = unsafe {
        let mut t: libc::termios = std::mem::zeroed();
        (libc::tcgetattr(fd, &mut t) == 0).then_some(t)
    };
    if let Some(mut quiet) = saved {
        quiet.c_lflag &= !libc::ECHO;
        // SAFETY: as above.
        unsafe { libc::tcsetattr(fd, libc::TCSANOW, &quiet) };
    }
    let mut line = String::new();
    let read = input.read_line(&mut line);
    if let Some(saved) = saved {
        // SAFETY: as above.
        unsafe { libc::tcsetattr(fd, libc::TCSANOW, &saved) };
    }
    let _ = writeln!(err);
    read.context("reading the key from the terminal")?;
    let mut bytes = std::mem::take(&mut line).into_bytes();
    while bytes.last().is_some_and(|&b| b == b'\n' || b == b'\r') {
        bytes.pop();
    }
    Ok(KeyMaterial(bytes))
}

/// The key `vol create --encryption` (or `key change`, `recv --encryption`) gives a volume,
/// in the process that will hold it.
pub fn new_key(format: KeyFormat, location: KeyLocation, key: &KeyMaterial) -> NewKey {
    keep_keys_out_of_core_dumps();
    NewKey { format, location, key: key.user_key() }
}

/// The refusal of a command that needs a key but was given none: only a bug in the client
/// sends one without (it reads the key before sending the command).
fn no_key(spec: &str) -> anyhow::Error {
    anyhow::anyhow!("no key was given for {spec}")
}

/// `key load POOL/VOL`: checks the key against the volume's family, loads it, and replays
/// the intent-log records its volumes held. On a served pool the volumes are served from
/// now on; on a pool this command opens, the key only proves right (and the log replays):
/// nothing keeps it after the command.
pub async fn load(ctx: &mut Ctx<'_>, spec: &str, key: Option<&KeyMaterial>) -> anyhow::Result<()> {
    let (pool, volume) = split_volume(spec)?;
    let key = key.ok_or_else(|| no_key(spec))?;
    keep_keys_out_of_core_dumps();
    let store = ctx.hold(pool).await?;
    let replayed_before = store.log_stats().records_replayed.get();
    store.load_key(volume, &key.user_key()).await?;
    let replayed = store.log_stats().records_replayed.get() - replayed_before;
    let live = store.is_live();
    store.release().await?;
    let mut said = format!("loaded the key of {spec}");
    if replayed > 0 {
        said.push_str(&format!("; replayed {replayed} intent-log record(s) it held"));
    }
    if live {
        said.push_str("; its volumes are served");
    } else {
        said.push_str(&format!(
            "\npool {pool} is not served, so the key is not kept after this command: `sluice \
             serve {pool}` loads keys kept in files (keylocation=file://…) itself; load the \
             others with `sluice key load` once it serves"
        ));
    }
    ctx.done(said);
    Ok(())
}

/// `key unload POOL/VOL [-f]`: refused while clients are connected to a volume of the family;
/// with `force`, their requests in flight finish and each connection is closed: at its next
/// request, or within a second if idle.
pub async fn unload(ctx: &mut Ctx<'_>, spec: &str, force: bool) -> anyhow::Result<()> {
    let (pool, volume) = split_volume(spec)?;
    let store = ctx.hold(pool).await?;
    let connected = store.family_handles(volume)?;
    if connected > 0 && !force {
        anyhow::bail!(
            "{connected} client connection(s) use volumes of {spec}'s key; disconnect them, or \
             unload with -f, which lets their requests in flight finish and then closes them"
        );
    }
    store.unload_key(volume).await?;
    store.release().await?;
    let closed = if connected > 0 {
        format!("; {connected} client connection(s) are closed (within a second if idle)")
    } else {
        String::new()
    };
    ctx.done(format!("unloaded the key of {spec}{closed}"));
    Ok(())
}

/// `key change POOL/VOL`: rewraps the family's master key under a new user key (its key must
/// be loaded); no data is rewritten.
pub async fn change(
    ctx: &mut Ctx<'_>,
    spec: &str,
    format: Option<String>,
    location: Option<String>,
    key: Option<&KeyMaterial>,
) -> anyhow::Result<()> {
    let (pool, volume) = split_volume(spec)?;
    let key = key.ok_or_else(|| no_key(spec))?;
    let (Some(format), Some(location)) = (format, location) else {
        return Err(no_key(spec));
    };
    let format = parse_keyformat(&format).map_err(anyhow::Error::msg)?;
    let location = parse_keylocation(&location).map_err(anyhow::Error::msg)?;
    let store = ctx.hold(pool).await?;
    if let Some(entry) = store.volume_info(volume) {
        if entry.origin.is_some() && entry.key_family != 0 {
            let root = properties(&store, pool, volume)[4].1.clone();
            anyhow::bail!(
                "{spec} is a clone: it shares the key of its encryption root {root}, whose key \
                 changes for both (`sluice key change {root}`)"
            );
        }
    }
    let text = location_text(&location);
    store.change_key(volume, new_key(format, location, key))?;
    store.release().await?;
    ctx.done(format!(
        "changed the key of {spec} (keyformat={}, keylocation={text}); no data was rewritten",
        format.name()
    ));
    Ok(())
}

/// The encryption properties `vol get` shows: encryption, keyformat, keylocation, keystatus
/// and encryptionroot (`-` for a volume that is not encrypted).
pub fn properties(
    store: &sluice_engine::Store,
    pool: &str,
    volume: &str,
) -> [(&'static str, String); 5] {
    let info = store.encryption(volume).ok().flatten();
    let Some(info) = info else {
        return [
            ("encryption", "off".to_owned()),
            ("keyformat", "none".to_owned()),
            ("keylocation", "none".to_owned()),
            ("keystatus", "-".to_owned()),
            ("encryptionroot", "-".to_owned()),
        ];
    };
    // The family's root: its volume that is no clone (a clone shares its origin's key).
    let root = store
        .volumes()
        .into_iter()
        .filter(|v| v.key_family == info.family)
        .min_by_key(|v| (v.origin.is_some(), v.id))
        .map_or_else(|| "-".to_owned(), |v| format!("{pool}/{}", v.name));
    [
        ("encryption", info.suite.name().to_owned()),
        ("keyformat", info.format.name().to_owned()),
        ("keylocation", location_text(&info.location)),
        ("keystatus", status_text(info.status).to_owned()),
        ("encryptionroot", root),
    ]
}

/// `keystatus` as `vol list` and `vol get` show it.
pub fn status_text(status: KeyStatus) -> &'static str {
    match status {
        KeyStatus::None => "-",
        other => other.name(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The words of the encryption options, and refusals that say what is meant.
    #[test]
    fn options_parse_and_refuse_with_what_to_write() {
        assert_eq!(parse_encryption("on"), Ok(true));
        assert_eq!(parse_encryption("aes-256-gcm"), Ok(true));
        assert_eq!(parse_encryption("off"), Ok(false));
        assert!(parse_encryption("aes-128-ccm").unwrap_err().contains("not a suite"));
        assert_eq!(parse_keyformat("hex"), Ok(KeyFormat::Hex));
        assert!(parse_keyformat("pem").unwrap_err().contains("raw (32 bytes)"));
        assert_eq!(parse_keylocation("prompt"), Ok(KeyLocation::Prompt));
        assert_eq!(parse_keylocation("file:///etc/k"), Ok(KeyLocation::File("/etc/k".to_owned())));
        assert!(parse_keylocation("file://etc/k").unwrap_err().contains("three slashes"));
        assert!(parse_keylocation("https://x/k").unwrap_err().contains("not a key location"));
        assert_eq!(location_text(&KeyLocation::File("/etc/k".into())), "file:///etc/k");
        let no_format = Encrypt::from_args("on", None, None).unwrap_err().to_string();
        assert!(no_format.contains("--keyformat"), "{no_format}");
        let stray = Encrypt::from_args("off", Some("raw".into()), None).unwrap_err().to_string();
        assert!(stray.contains("--encryption on"), "{stray}");
        let made = Encrypt::from_args("on", Some("raw".into()), None).unwrap().unwrap();
        assert_eq!((made.format, made.location), (KeyFormat::Raw, KeyLocation::Prompt));
        assert!(check_new_volume_name("tank/db@s").is_err());
    }

    /// A process that read a key cannot dump core (nor be read by another user).
    #[test]
    fn reading_a_key_makes_the_process_undumpable() {
        keep_keys_out_of_core_dumps();
        // SAFETY: prctl with PR_GET_DUMPABLE reads a flag.
        let dumpable = unsafe { libc::prctl(libc::PR_GET_DUMPABLE, 0, 0, 0, 0) };
        assert_eq!(dumpable, 0);
    }

    /// A key file is read as it is; an unreadable one is named with the volume it was for.
    #[test]
    fn key_files_are_read_whole_and_named_when_missing() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("k");
        std::fs::write(&path, b"0123456789abcdef0123456789abcdef").unwrap();
        let location = KeyLocation::File(path.display().to_string());
        let key = read_key("tank/db", KeyFormat::Raw, &location, false).unwrap();
        assert_eq!(key.0.len(), 32);
        let missing = KeyLocation::File(dir.path().join("nope").display().to_string());
        let error = read_key("tank/db", KeyFormat::Raw, &missing, false).unwrap_err();
        assert!(format!("{error:#}").contains("the key of tank/db"), "{error:#}");
    }
}
