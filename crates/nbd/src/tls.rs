//! TLS for NBD connections: the credentials a server offers, the handshake after a client's
//! `NBD_OPT_STARTTLS`, and who the client proved to be (docs/tls.md).
//!
//! Two kinds of credentials, alone or together, read once at startup:
//! - x509, from a directory laid out like qemu's `tls-creds-x509` and nbdkit's
//!   `--tls-certificates`: `server-cert.pem`, `server-key.pem`, and optionally `ca-cert.pem`
//!   (client certificates are asked for, and checked against it, only when it exists) and
//!   `ca-crl.pem`.
//! - pre-shared keys, from a file in the format GnuTLS's `psktool` writes (`IDENTITY:HEXKEY`
//!   lines), the `keys.psk` of qemu's `tls-creds-psk` and nbdkit's `--tls-psk`.
//!
//! Why OpenSSL and not rustls: rustls has no external pre-shared keys (its issue #174), and
//! the NBD clients people use with PSK (qemu, and libnbd's nbdinfo/nbdcopy) speak it through
//! GnuTLS, so a server without PSK would leave those users with certificates only. OpenSSL's
//! TLS 1.2 style PSK callback also serves TLS 1.3 (it then treats the key as a SHA-256 PSK,
//! which is what GnuTLS clients offer), and tokio-openssl gives the async stream.
//!
//! Nothing is reloaded at runtime: a changed file takes effect at the next start.

use std::collections::{BTreeMap, HashMap};
use std::fmt;
use std::path::{Path, PathBuf};
use std::pin::Pin;

use openssl::error::ErrorStack;
use openssl::nid::Nid;
use openssl::ssl::{
    Ssl, SslContext, SslContextBuilder, SslFiletype, SslMethod, SslOptions, SslSessionCacheMode,
    SslVerifyMode, SslVersion,
};
use openssl::x509::store::{X509Lookup, X509StoreBuilder};
use openssl::x509::verify::X509VerifyFlags;
use openssl::x509::{X509NameRef, X509};
use tokio::io::{AsyncRead, AsyncWrite};
use tokio_openssl::SslStream;

/// Bytes of one pre-shared key: OpenSSL's limit (`PSK_MAX_PSK_LEN`).
const PSK_KEY_BYTES_MAX: usize = 512;
/// Bytes of one PSK identity: GnuTLS's limit for a username, the stricter of the two libraries.
const PSK_IDENTITY_BYTES_MAX: usize = 128;

/// How long a client has to finish the TLS handshake once its STARTTLS is acknowledged.
const HANDSHAKE_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(30);

/// TLS 1.2 cipher suites: forward-secret AEAD suites for certificates, and ECDHE-PSK for
/// pre-shared keys (GnuTLS clients with PSK enable ECDHE-PSK; OpenSSL's default list would
/// leave PSK-only servers nothing to agree on). No DHE: it would need parameters configured.
const TLS12_CIPHERS: &str = "ECDHE+AESGCM:ECDHE+CHACHA20:kECDHEPSK+CHACHA20:kECDHEPSK+AES:\
                             !SHA1:!aNULL:!eNULL:!DSS";

/// TLS 1.3 suites, SHA-256 ones first, chosen in the server's order. OpenSSL's TLS 1.2 style
/// PSK callback gives TLS 1.3 a key bound to SHA-256, and OpenSSL drops the PSK when the
/// suite it picked hashes with SHA-384: with OpenSSL's default order (AES-256-GCM-SHA384
/// first) and a certificate configured, a GnuTLS PSK client (nbdinfo, qemu) failed with
/// "Insufficient credentials". OpenSSL reorders by itself only when it has no certificate.
const TLS13_SUITES: &str =
    "TLS_AES_128_GCM_SHA256:TLS_CHACHA20_POLY1305_SHA256:TLS_AES_256_GCM_SHA384";

/// Why TLS could not be set up from what was given. Each names the file and what is wrong.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum TlsError {
    #[error("reading {}: {cause}", path.display())]
    Read { path: PathBuf, cause: std::io::Error },
    #[error(
        "{} line {line}: {problem} (each line is IDENTITY:HEXKEY, as `psktool -u IDENTITY -p \
         FILE` writes it)",
        path.display()
    )]
    PskLine { path: PathBuf, line: usize, problem: PskProblem },
    #[error(
        "{} line {line}: identity {identity:?} was already given on line {first}; each identity \
         has one key",
        path.display()
    )]
    PskDuplicate { path: PathBuf, line: usize, first: usize, identity: String },
    #[error(
        "{} holds no keys: add IDENTITY:HEXKEY lines (`psktool -u IDENTITY -p FILE` makes one)",
        path.display()
    )]
    PskEmpty { path: PathBuf },
    #[error("{} is missing: {why}", path.display())]
    Missing { path: PathBuf, why: &'static str },
    #[error("{}: {problem}", path.display())]
    Certificate { path: PathBuf, problem: String },
    #[error(
        "TLS needs credentials: --tls-certificates DIR (server-cert.pem, server-key.pem, \
         ca-cert.pem) and/or --tls-psk FILE (IDENTITY:HEXKEY lines)"
    )]
    NoCredentials,
    #[error("--tls-verify-peer needs client certificates to check, so --tls-certificates DIR")]
    VerifyWithoutCertificates,
    #[error("--tls-allow {entry:?}: {problem}")]
    Allow { entry: String, problem: String },
    #[error("setting up TLS: {0}")]
    Openssl(ErrorStack),
}

// Not `#[from]`: that would make the inner error this one's `source()` as well as part of its
// message, and a chain would print it twice.
impl From<ErrorStack> for TlsError {
    fn from(error: ErrorStack) -> Self {
        TlsError::Openssl(error)
    }
}

/// What is wrong with one line of a PSK file.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum PskProblem {
    #[error("no ':' between identity and key")]
    NoColon,
    #[error("the identity is empty")]
    EmptyIdentity,
    #[error("the identity is {0} bytes, over {PSK_IDENTITY_BYTES_MAX}")]
    IdentityTooLong(usize),
    #[error("the key is empty")]
    EmptyKey,
    #[error("the key is not hexadecimal (character {0:?})")]
    NotHex(char),
    #[error("the key has an odd number of hex digits")]
    OddHex,
    #[error("the key is {0} bytes, over {PSK_KEY_BYTES_MAX}")]
    KeyTooLong(usize),
}

/// Pre-shared keys by identity.
#[derive(Clone, Default)]
pub struct PskKeys {
    keys: HashMap<String, Vec<u8>>,
}

impl fmt::Debug for PskKeys {
    /// Identities only: keys never reach a log.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut identities: Vec<&String> = self.keys.keys().collect();
        identities.sort();
        f.debug_struct("PskKeys").field("identities", &identities).finish_non_exhaustive()
    }
}

impl PskKeys {
    /// Reads a psktool-format file.
    pub fn read(path: &Path) -> Result<PskKeys, TlsError> {
        let text = std::fs::read_to_string(path)
            .map_err(|source| TlsError::Read { path: path.to_owned(), cause: source })?;
        PskKeys::parse(&text, path)
    }

    /// Parses `IDENTITY:HEXKEY` lines (`path` names the file in errors). Blank lines are
    /// skipped; the identity ends at the first ':' (as GnuTLS reads it, so it holds none).
    pub fn parse(text: &str, path: &Path) -> Result<PskKeys, TlsError> {
        let mut keys = HashMap::new();
        let mut first_line = HashMap::new();
        for (index, line) in text.lines().enumerate() {
            let number = index + 1;
            let line = line.trim_end();
            if line.is_empty() {
                continue;
            }
            let bad = |problem| TlsError::PskLine { path: path.to_owned(), line: number, problem };
            let (identity, hex) = line.split_once(':').ok_or(bad(PskProblem::NoColon))?;
            if identity.is_empty() {
                return Err(bad(PskProblem::EmptyIdentity));
            }
            if identity.len() > PSK_IDENTITY_BYTES_MAX {
                return Err(bad(PskProblem::IdentityTooLong(identity.len())));
            }
            let key = decode_hex(hex).map_err(bad)?;
            if let Some(&first) = first_line.get(identity) {
                return Err(TlsError::PskDuplicate {
                    path: path.to_owned(),
                    line: number,
                    first,
                    identity: identity.to_owned(),
                });
            }
            first_line.insert(identity.to_owned(), number);
            keys.insert(identity.to_owned(), key);
        }
        if keys.is_empty() {
            return Err(TlsError::PskEmpty { path: path.to_owned() });
        }
        Ok(PskKeys { keys })
    }

    /// How many identities there are.
    pub fn len(&self) -> usize {
        self.keys.len()
    }

    /// Whether there are none (never, for keys read from a file).
    pub fn is_empty(&self) -> bool {
        self.keys.is_empty()
    }

    fn get(&self, identity: &str) -> Option<&[u8]> {
        self.keys.get(identity).map(Vec::as_slice)
    }
}

fn decode_hex(hex: &str) -> Result<Vec<u8>, PskProblem> {
    if hex.is_empty() {
        return Err(PskProblem::EmptyKey);
    }
    if let Some(c) = hex.chars().find(|c| !c.is_ascii_hexdigit()) {
        return Err(PskProblem::NotHex(c));
    }
    if hex.len() % 2 != 0 {
        return Err(PskProblem::OddHex);
    }
    if hex.len() / 2 > PSK_KEY_BYTES_MAX {
        return Err(PskProblem::KeyTooLong(hex.len() / 2));
    }
    // Every character is an ASCII hex digit (checked above), so each pair is one byte.
    let digit = |b: u8| (b as char).to_digit(16).unwrap_or(0) as u8;
    Ok(hex.as_bytes().chunks_exact(2).map(|pair| digit(pair[0]) << 4 | digit(pair[1])).collect())
}

/// Which clients may open which exports (`--tls-allow EXPORT=NAME[,NAME...]`). An entry for a
/// volume covers its snapshots (`VOL@SNAP`) too: a snapshot holds the volume's data.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct AllowList {
    entries: BTreeMap<String, Vec<String>>,
}

impl AllowList {
    /// Parses `EXPORT=NAME[,NAME...]` entries; entries for the same export add up.
    pub fn parse<S: AsRef<str>>(entries: &[S]) -> Result<AllowList, TlsError> {
        let mut list = AllowList::default();
        for entry in entries {
            let entry = entry.as_ref();
            let bad = |problem: &str| TlsError::Allow {
                entry: entry.to_owned(),
                problem: problem.to_owned(),
            };
            let (export, names) =
                entry.split_once('=').ok_or_else(|| bad("write it EXPORT=NAME[,NAME...]"))?;
            if export.is_empty() {
                return Err(bad("the export name is empty"));
            }
            if export.contains('@') {
                return Err(bad(
                    "name the volume, not a snapshot: an entry for a volume covers its snapshots",
                ));
            }
            let names: Vec<String> = names.split(',').map(str::to_owned).collect();
            if names.iter().any(String::is_empty) {
                return Err(bad("a client name is empty (names are PSK identities or \
                                certificate common names, separated by commas; `psk:NAME` or \
                                `cert:NAME` says which)"));
            }
            let listed = list.entries.entry(export.to_owned()).or_default();
            for name in names {
                if !listed.contains(&name) {
                    listed.push(name);
                }
            }
        }
        Ok(list)
    }

    /// Whether no export is restricted.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// The exports it restricts.
    pub fn exports(&self) -> impl Iterator<Item = &str> {
        self.entries.keys().map(String::as_str)
    }

    /// Whether `peer` may open `export`; the error says why not, for the client.
    pub fn admits(&self, export: &str, peer: &Peer) -> Result<(), String> {
        let volume = export.split('@').next().unwrap_or(export);
        let Some(names) = self.entries.get(volume) else { return Ok(()) };
        // `psk:NAME` matches only that PSK identity, `cert:NAME` only a verified certificate
        // of that common name; a bare NAME matches either.
        let admitted = names.iter().any(|entry| match (entry.split_once(':'), peer) {
            (Some(("psk", name)), Peer::Psk(identity)) => name == identity,
            (Some(("cert", name)), Peer::Certificate(common)) => name == common,
            (Some(("psk" | "cert", _)), _) => false,
            (_, Peer::Psk(name) | Peer::Certificate(name)) => entry == name,
            (_, Peer::Anonymous) => false,
        });
        if admitted {
            return Ok(());
        }
        Err(format!(
            "export {export:?} is open only to the clients its --tls-allow entry names, and this \
             connection is {peer}"
        ))
    }
}

/// Who a TLS client proved to be.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum Peer {
    /// The identity of the pre-shared key it used.
    Psk(String),
    /// The common name of the certificate it presented (verified against `ca-cert.pem`).
    Certificate(String),
    /// No client credential: it checked the server's certificate, but showed none of its own.
    Anonymous,
}

impl fmt::Display for Peer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Peer::Psk(identity) => write!(f, "PSK identity {identity:?}"),
            Peer::Certificate(name) => write!(f, "certificate {name:?}"),
            Peer::Anonymous => f.write_str("without a client certificate or PSK"),
        }
    }
}

/// Where the credentials are, and the policy; [`TlsServer::new`] reads and checks them.
#[derive(Clone, Debug, Default)]
pub struct TlsSettings {
    /// Every option but STARTTLS (and ABORT) is refused until TLS is up (`--tls require`);
    /// otherwise plain clients are served as before and TLS is the client's choice.
    pub require: bool,
    /// The x509 directory (`server-cert.pem`, `server-key.pem`, `ca-cert.pem`, `ca-crl.pem`).
    pub certificates: Option<PathBuf>,
    /// Every x509 client must present a certificate signed by `ca-cert.pem`.
    pub verify_peer: bool,
    /// The PSK file.
    pub psk: Option<PathBuf>,
    /// Exports open only to some clients (needs `require`: a plain client has no name).
    pub allow: AllowList,
}

/// A server's TLS credentials and policy, shared by all its connections.
pub struct TlsServer {
    context: SslContext,
    require: bool,
    allow: AllowList,
    psk_identity: openssl::ex_data::Index<Ssl, String>,
    summary: String,
}

impl fmt::Debug for TlsServer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TlsServer")
            .field("require", &self.require)
            .field("allow", &self.allow)
            .field("summary", &self.summary)
            .finish_non_exhaustive()
    }
}

impl TlsServer {
    /// Reads and checks the credentials; every error names the file and what is wrong.
    pub fn new(settings: &TlsSettings) -> Result<TlsServer, TlsError> {
        if settings.certificates.is_none() && settings.psk.is_none() {
            return Err(TlsError::NoCredentials);
        }
        if settings.verify_peer && settings.certificates.is_none() {
            return Err(TlsError::VerifyWithoutCertificates);
        }
        if !settings.require && !settings.allow.is_empty() {
            let entries: Vec<String> = settings
                .allow
                .entries
                .iter()
                .map(|(export, names)| format!("{export}={}", names.join(",")))
                .collect();
            return Err(TlsError::Allow {
                entry: entries.join(" "),
                problem: String::from(
                    "an allow-list needs --tls require (a plain-text client has no name to \
                     check); serve with --tls require",
                ),
            });
        }
        let mut builder = SslContextBuilder::new(SslMethod::tls_server())?;
        // The NBD spec asks for TLS 1.2 at least.
        builder.set_min_proto_version(Some(SslVersion::TLS1_2))?;
        builder.set_cipher_list(TLS12_CIPHERS)?;
        builder.set_ciphersuites(TLS13_SUITES)?;
        builder.set_options(
            SslOptions::NO_COMPRESSION
                | SslOptions::NO_RENEGOTIATION
                | SslOptions::CIPHER_SERVER_PREFERENCE
                | SslOptions::NO_TICKET,
        );
        // No resumption: every connection proves itself in full, so the PSK callback (which
        // records the identity) and certificate verification run for each one. NBD clients
        // keep a connection for a session; a full handshake per connection costs nothing
        // worth saving.
        builder.set_session_cache_mode(SslSessionCacheMode::OFF);
        builder.set_num_tickets(0)?;
        // OpenSSL runs a TLS 1.3 PSK handshake as a resumption, and refuses any resumption on
        // a server that asks for client certificates without a session id context ("session
        // id context uninitialized"): PSK clients failed whenever ca-cert.pem was present.
        builder.set_session_id_context(b"sluice-nbd")?;
        let mut parts = Vec::new();
        if let Some(dir) = &settings.certificates {
            parts.push(load_x509(&mut builder, dir, settings.verify_peer)?);
        }
        let psk_identity = Ssl::new_ex_index::<String>()?;
        if let Some(path) = &settings.psk {
            let keys = PskKeys::read(path)?;
            parts.push(format!("PSK ({} identities from {})", keys.len(), path.display()));
            builder.set_psk_server_callback(move |ssl, identity, out| {
                // 0 bytes: no key for this identity, and the handshake fails (or, in TLS 1.3
                // with a certificate, goes on without the PSK and fails for a PSK-only client).
                let Some(identity) = identity.and_then(|i| std::str::from_utf8(i).ok()) else {
                    return Ok(0);
                };
                let Some(key) = keys.get(identity) else { return Ok(0) };
                let Some(slot) = out.get_mut(..key.len()) else { return Ok(0) };
                slot.copy_from_slice(key);
                ssl.set_ex_data(psk_identity, identity.to_owned());
                Ok(key.len())
            });
        }
        let mode = if settings.require { "required" } else { "offered" };
        let mut summary = format!("TLS {mode}: {}", parts.join(" and "));
        if !settings.allow.is_empty() {
            let exports: Vec<&str> = settings.allow.entries.keys().map(String::as_str).collect();
            summary.push_str(&format!("; allow-list on {}", exports.join(", ")));
        }
        Ok(TlsServer {
            context: builder.build(),
            require: settings.require,
            allow: settings.allow.clone(),
            psk_identity,
            summary,
        })
    }

    /// Whether plain-text clients are refused everything but STARTTLS.
    pub fn required(&self) -> bool {
        self.require
    }

    /// One line for the server's log: the mode and the credentials in use.
    pub fn summary(&self) -> &str {
        &self.summary
    }

    /// Its allow-list.
    pub fn allow_list(&self) -> &AllowList {
        &self.allow
    }

    /// Whether `peer` may open `export` (see [`AllowList::admits`]).
    pub fn admits(&self, export: &str, peer: &Peer) -> Result<(), String> {
        self.allow.admits(export, peer)
    }

    /// The server side of the handshake on `stream`, and who the client is.
    pub async fn accept<S>(&self, stream: S) -> Result<(SslStream<S>, Peer), HandshakeError>
    where
        S: AsyncRead + AsyncWrite + Unpin,
    {
        let ssl = Ssl::new(&self.context)?;
        let mut stream = SslStream::new(ssl, stream)?;
        // A client that stalls mid-handshake (or sends what looks like the start of a huge
        // record) would otherwise hold its connection for as long as it likes.
        tokio::time::timeout(HANDSHAKE_TIMEOUT, Pin::new(&mut stream).accept())
            .await
            .map_err(|_| HandshakeError::Timeout(HANDSHAKE_TIMEOUT))?
            .map_err(HandshakeError::Tls)?;
        let ssl = stream.ssl();
        // The callback records an identity when it finds its key, before OpenSSL checks that
        // the client knows the key; OpenSSL then drops the PSK if the suite it chose hashes
        // with another function, and goes on with a certificate handshake. So the identity
        // counts only if the key was used: a TLS 1.3 PSK handshake is a resumption (the cache
        // is off, so nothing else is), a TLS 1.2 one has a PSK suite.
        let psk_used = match ssl.version2() {
            Some(SslVersion::TLS1_3) => ssl.session_reused(),
            _ => ssl.current_cipher().is_some_and(|c| c.name().contains("PSK")),
        };
        let identity = ssl.ex_data(self.psk_identity).filter(|_| psk_used);
        let peer = if let Some(identity) = identity {
            Peer::Psk(identity.clone())
        } else if let Some(name) =
            ssl.peer_certificate().and_then(|c| common_name(c.subject_name()))
        {
            Peer::Certificate(name)
        } else {
            Peer::Anonymous
        };
        Ok((stream, peer))
    }
}

/// Why a TLS handshake failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum HandshakeError {
    #[error("starting TLS: {0}")]
    Setup(ErrorStack),
    #[error("TLS handshake: {0}")]
    Tls(openssl::ssl::Error),
    #[error("TLS handshake not finished within {0:?}")]
    Timeout(std::time::Duration),
}

// Not `#[from]`: that would make the inner error this one's `source()` as well as part of its
// message, and a chain would print it twice.
impl From<ErrorStack> for HandshakeError {
    fn from(error: ErrorStack) -> Self {
        HandshakeError::Setup(error)
    }
}

fn common_name(name: &X509NameRef) -> Option<String> {
    let entry = name.entries_by_nid(Nid::COMMONNAME).next()?;
    entry.data().to_string().ok()
}

/// Loads the x509 directory into `builder`; returns a description for the log.
fn load_x509(
    builder: &mut SslContextBuilder,
    dir: &Path,
    verify_peer: bool,
) -> Result<String, TlsError> {
    let problem = |path: &Path, what: &str, e: ErrorStack| TlsError::Certificate {
        path: path.to_owned(),
        problem: format!("{what}: {e}"),
    };
    if !dir.is_dir() {
        return Err(TlsError::Missing {
            path: dir.to_owned(),
            why: "--tls-certificates names a directory holding server-cert.pem, server-key.pem \
                  and ca-cert.pem",
        });
    }
    let cert = dir.join("server-cert.pem");
    let key = dir.join("server-key.pem");
    let ca = dir.join("ca-cert.pem");
    let crl = dir.join("ca-crl.pem");
    if !cert.exists() {
        return Err(TlsError::Missing {
            path: cert,
            why: "the server's certificate (PEM; any intermediate certificates after it)",
        });
    }
    if !key.exists() {
        return Err(TlsError::Missing {
            path: key,
            why: "the private key of server-cert.pem (PEM, not encrypted)",
        });
    }
    let server =
        X509::from_pem(&read(&cert)?).map_err(|e| problem(&cert, "not a PEM certificate", e))?;
    builder
        .set_certificate_chain_file(&cert)
        .map_err(|e| problem(&cert, "not a PEM certificate chain", e))?;
    builder.set_private_key_file(&key, SslFiletype::PEM).map_err(|e| {
        problem(&key, "not a PEM private key (an encrypted key is not supported)", e)
    })?;
    builder
        .check_private_key()
        .map_err(|e| problem(&key, "this key does not belong to server-cert.pem", e))?;
    let server_name = common_name(server.subject_name()).unwrap_or_else(|| String::from("?"));
    let mut description = format!("x509 ({} CN={server_name}", dir.display());
    if ca.exists() {
        let cas = X509::stack_from_pem(&read(&ca)?)
            .map_err(|e| problem(&ca, "not PEM certificates", e))?;
        if cas.is_empty() {
            return Err(TlsError::Certificate {
                path: ca,
                problem: String::from("holds no certificate"),
            });
        }
        let mut store = X509StoreBuilder::new()?;
        for ca_cert in &cas {
            // The CAs' names tell the client which certificate to present.
            builder.add_client_ca(ca_cert).map_err(|e| problem(&ca, "a CA certificate", e))?;
            store.add_cert(ca_cert.clone()).map_err(|e| problem(&ca, "a CA certificate", e))?;
        }
        if crl.exists() {
            // X509_load_crl_file takes the path as a C string: it must be UTF-8 here.
            if crl.to_str().is_none() {
                return Err(TlsError::Certificate {
                    path: crl,
                    problem: String::from("the path is not UTF-8; move the directory"),
                });
            }
            let lookup = store.add_lookup(X509Lookup::file())?;
            lookup
                .load_crl_file(&crl, SslFiletype::PEM)
                .map_err(|e| problem(&crl, "not a PEM certificate revocation list", e))?;
            store.set_flags(X509VerifyFlags::CRL_CHECK)?;
            description.push_str(", revocations from ca-crl.pem");
        }
        builder.set_verify_cert_store(store.build())?;
        // Asked for whenever a CA can check it, so the allow-list can name certificates; a
        // certificate that does not verify fails the handshake. With --tls-verify-peer an x509
        // client without one fails too (a PSK client is asked for none: its key proves it).
        let mode = if verify_peer {
            description.push_str(", client certificates required");
            SslVerifyMode::PEER | SslVerifyMode::FAIL_IF_NO_PEER_CERT
        } else {
            description.push_str(", client certificates checked when presented");
            SslVerifyMode::PEER
        };
        builder.set_verify(mode);
    } else if verify_peer {
        return Err(TlsError::Missing {
            path: ca,
            why: "--tls-verify-peer checks client certificates against this CA certificate",
        });
    } else if crl.exists() {
        return Err(TlsError::Missing {
            path: ca,
            why: "ca-crl.pem revokes client certificates, which are checked only against a CA",
        });
    }
    description.push(')');
    Ok(description)
}

fn read(path: &Path) -> Result<Vec<u8>, TlsError> {
    std::fs::read(path).map_err(|source| TlsError::Read { path: path.to_owned(), cause: source })
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use super::{AllowList, Peer, PskKeys, PskProblem, TlsError};

    fn parse(text: &str) -> Result<PskKeys, TlsError> {
        PskKeys::parse(text, Path::new("keys.psk"))
    }

    fn line_problem(text: &str) -> (usize, PskProblem) {
        match parse(text) {
            Err(TlsError::PskLine { line, problem, .. }) => (line, problem),
            other => panic!("{text:?} gave {other:?}"),
        }
    }

    #[test]
    fn psk_files_parse_as_psktool_writes_them() {
        let keys = parse("alice:00ff10AB\n\nbob:0123456789abcdef0123456789abcdef\r\n").unwrap();
        assert_eq!(keys.len(), 2);
        assert_eq!(keys.get("alice"), Some(&[0x00, 0xff, 0x10, 0xab][..]));
        assert_eq!(keys.get("bob").map(<[u8]>::len), Some(16));
        assert_eq!(keys.get("carol"), None);
        // Keys stay out of debug output.
        assert!(!format!("{keys:?}").contains("ab"), "{keys:?}");
    }

    #[test]
    fn bad_psk_lines_name_the_line_and_the_problem() {
        assert_eq!(line_problem("alice:00\nbob 00\n"), (2, PskProblem::NoColon));
        assert_eq!(line_problem(":00ff"), (1, PskProblem::EmptyIdentity));
        assert_eq!(line_problem("alice:"), (1, PskProblem::EmptyKey));
        assert_eq!(line_problem("alice:0g"), (1, PskProblem::NotHex('g')));
        assert_eq!(line_problem("alice:abc"), (1, PskProblem::OddHex));
        assert_eq!(line_problem("alice:00 11"), (1, PskProblem::NotHex(' ')));
        let long = format!("{}:00", "a".repeat(129));
        assert_eq!(line_problem(&long), (1, PskProblem::IdentityTooLong(129)));
        let big = format!("alice:{}", "00".repeat(513));
        assert_eq!(line_problem(&big), (1, PskProblem::KeyTooLong(513)));
        let message = parse("alice:zz").unwrap_err().to_string();
        assert!(message.contains("keys.psk line 1") && message.contains("psktool"), "{message}");
    }

    #[test]
    fn duplicate_identities_and_empty_files_are_refused() {
        match parse("alice:00\nbob:11\nalice:22\n") {
            Err(TlsError::PskDuplicate { line: 3, first: 1, identity, .. }) => {
                assert_eq!(identity, "alice")
            }
            other => panic!("{other:?}"),
        }
        assert!(matches!(parse(""), Err(TlsError::PskEmpty { .. })));
        assert!(matches!(parse("\n  \n"), Err(TlsError::PskEmpty { .. })));
    }

    #[test]
    fn allow_lists_cover_volumes_and_their_snapshots() {
        let list = AllowList::parse(&["vol0=client1,alice", "vol0=bob", "other=carol"]).unwrap();
        let alice = Peer::Psk("alice".into());
        let client1 = Peer::Certificate("client1".into());
        let carol = Peer::Psk("carol".into());
        assert!(list.admits("vol0", &alice).is_ok());
        assert!(list.admits("vol0", &client1).is_ok());
        assert!(list.admits("vol0", &Peer::Psk("bob".into())).is_ok());
        assert!(list.admits("vol0@snap", &client1).is_ok());
        let refusal = list.admits("vol0", &carol).unwrap_err();
        assert!(refusal.contains("PSK identity \"carol\""), "{refusal}");
        assert!(list.admits("vol0@snap", &carol).is_err());
        assert!(list.admits("vol0", &Peer::Anonymous).is_err());
        // A bare name matches a certificate and a PSK identity alike; a kind says which.
        assert!(list.admits("other", &Peer::Certificate("carol".into())).is_ok());
        let kinds = AllowList::parse(&["db=psk:alice,cert:client1"]).unwrap();
        assert!(kinds.admits("db", &alice).is_ok());
        assert!(kinds.admits("db", &client1).is_ok());
        assert!(kinds.admits("db", &Peer::Certificate("alice".into())).is_err());
        assert!(kinds.admits("db", &Peer::Psk("client1".into())).is_err());
        assert!(list.admits("unlisted", &Peer::Anonymous).is_ok());
        for bad in ["vol0", "=alice", "vol0=", "vol0=a,,b", "vol0@snap=alice"] {
            assert!(
                matches!(AllowList::parse(&[bad]), Err(TlsError::Allow { .. })),
                "{bad} was accepted"
            );
        }
    }
}
