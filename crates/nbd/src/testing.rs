//! A test client for the NBD server: the handshake, requests, and a PSK TLS client, against a
//! real store on instant simulated disks.

use std::sync::Arc;

use sluice_engine::device::sim::SimOptions;
use sluice_engine::device::{SimDevice, SimProfile};
use sluice_engine::pool::{LeafSpec, Pool, PoolSpec, TopSpec};
use sluice_engine::tunables::Tunables;
use sluice_engine::txg::Store;
use sluice_engine::Volume;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};

use crate::proto::{self, Request};
use crate::server::Exports;
use crate::tls::{TlsServer, TlsSettings};

/// A connection's client end: plain, or inside TLS.
pub(crate) trait Client: AsyncRead + AsyncWrite + Unpin {}
impl<S: AsyncRead + AsyncWrite + Unpin> Client for S {}

pub(crate) struct OneVolume(pub(crate) Arc<Store>);

impl Exports for OneVolume {
    fn names(&self) -> Vec<String> {
        vec!["vol0".into()]
    }

    fn open(&self, _name: &str) -> Option<Volume> {
        Volume::open(&self.0, "vol0").ok()
    }
}

pub(crate) async fn store() -> Arc<Store> {
    store_in(&sluice_host::tokio_env(3)).await
}

/// [`store`] whose tasks run where `env` spawns them.
pub(crate) async fn store_in(env: &sluice_engine::rt::Env) -> Arc<Store> {
    let device = SimDevice::new(env, "leaf0", SimProfile::Instant, 64 << 20, SimOptions::default());
    let leaf = LeafSpec { path: "leaf0".into(), device: Arc::new(device) };
    let spec = PoolSpec { name: "t".into(), ashift: 12, top: vec![TopSpec::Leaf(leaf)] };
    let tunables = Tunables::default();
    let pool = Pool::create(env, spec, &tunables).await.unwrap();
    let store = Arc::new(Store::create(pool, &tunables));
    store.create_volume("vol0", 16 << 20, 4096).unwrap();
    store
}

pub(crate) async fn option(client: &mut impl Client, option: u32, data: &[u8]) {
    client.write_u64(proto::OPTS_MAGIC).await.unwrap();
    client.write_u32(option).await.unwrap();
    client.write_u32(data.len() as u32).await.unwrap();
    client.write_all(data).await.unwrap();
}

/// One option reply: (option, kind, data).
pub(crate) async fn reply(client: &mut impl Client) -> (u32, u32, Vec<u8>) {
    assert_eq!(client.read_u64().await.unwrap(), proto::REP_MAGIC);
    let option = client.read_u32().await.unwrap();
    let kind = client.read_u32().await.unwrap();
    let len = client.read_u32().await.unwrap();
    let mut data = vec![0u8; len as usize];
    client.read_exact(&mut data).await.unwrap();
    (option, kind, data)
}

/// Reads option replies up to and including the final one (ACK or an error).
pub(crate) async fn option_replies(client: &mut impl Client) {
    loop {
        let (_option, kind, data) = reply(client).await;
        assert!(kind & (1 << 31) == 0, "option refused: {}", String::from_utf8_lossy(&data));
        if kind == proto::REP_ACK {
            return;
        }
    }
}

/// Fixed newstyle with structured replies and base:allocation, then GO.
pub(crate) async fn connect(client: &mut impl Client) {
    hello(client).await;
    go(client).await;
}

/// The greeting and the client's flags.
pub(crate) async fn hello(client: &mut impl Client) {
    let mut hello = [0u8; 18];
    client.read_exact(&mut hello).await.unwrap();
    client.write_u32(proto::CLIENT_FIXED_NEWSTYLE | proto::CLIENT_NO_ZEROES).await.unwrap();
}

/// Structured replies and base:allocation, then GO for vol0.
pub(crate) async fn go(client: &mut impl Client) {
    go_to(client, "vol0").await
}

/// Structured replies and base:allocation, then GO for the export `name`.
pub(crate) async fn go_to(client: &mut impl Client, name: &str) {
    let name = name.as_bytes();
    option(client, proto::OPT_STRUCTURED_REPLY, &[]).await;
    option_replies(client).await;
    let mut context = (name.len() as u32).to_be_bytes().to_vec();
    context.extend_from_slice(name);
    context.extend_from_slice(&1u32.to_be_bytes());
    context.extend_from_slice(&(proto::META_BASE_ALLOCATION.len() as u32).to_be_bytes());
    context.extend_from_slice(proto::META_BASE_ALLOCATION.as_bytes());
    option(client, proto::OPT_SET_META_CONTEXT, &context).await;
    option_replies(client).await;
    option(client, proto::OPT_GO, &go_data(name)).await;
    option_replies(client).await;
}

/// The data of OPT_GO (or OPT_INFO) for the export `name`, asking for no information.
pub(crate) fn go_data(name: &[u8]) -> Vec<u8> {
    let mut go = (name.len() as u32).to_be_bytes().to_vec();
    go.extend_from_slice(name);
    go.extend_from_slice(&0u16.to_be_bytes());
    go
}

/// Sends one request and returns the error of its reply (0 on success), reading past any
/// structured chunks.
pub(crate) async fn request(client: &mut impl Client, request: Request, payload: &[u8]) -> u32 {
    client.write_all(&request.encode()).await.unwrap();
    client.write_all(payload).await.unwrap();
    loop {
        match client.read_u32().await.unwrap() {
            proto::SIMPLE_REPLY_MAGIC => {
                let error = client.read_u32().await.unwrap();
                assert_eq!(client.read_u64().await.unwrap(), request.cookie);
                if request.kind == proto::CMD_READ && error == 0 {
                    let mut data = vec![0u8; request.len as usize];
                    client.read_exact(&mut data).await.unwrap();
                }
                return error;
            }
            proto::STRUCTURED_REPLY_MAGIC => {
                let flags = client.read_u16().await.unwrap();
                let kind = client.read_u16().await.unwrap();
                assert_eq!(client.read_u64().await.unwrap(), request.cookie);
                let len = client.read_u32().await.unwrap();
                let mut data = vec![0u8; len as usize];
                client.read_exact(&mut data).await.unwrap();
                if kind == proto::REPLY_TYPE_ERROR {
                    return u32::from_be_bytes([data[0], data[1], data[2], data[3]]);
                }
                if flags & proto::REPLY_FLAG_DONE != 0 {
                    return 0;
                }
            }
            magic => panic!("reply magic {magic:#x}"),
        }
    }
}

pub(crate) const KEY: [u8; 32] = [0x5a; 32];

/// A server with one PSK identity, alice, whose key is KEY.
pub(crate) fn tls(dir: &std::path::Path, require: bool) -> Arc<TlsServer> {
    let hex: String = KEY.iter().map(|b| format!("{b:02x}")).collect();
    let psk = dir.join("keys.psk");
    std::fs::write(&psk, format!("alice:{hex}\n")).unwrap();
    let settings = TlsSettings { require, psk: Some(psk), ..TlsSettings::default() };
    Arc::new(TlsServer::new(&settings).unwrap())
}

/// The client side of a PSK handshake (OpenSSL's client, as identity `identity`).
pub(crate) async fn psk_handshake<S: Client>(
    stream: S,
    identity: &'static str,
    key: [u8; 32],
) -> Result<tokio_openssl::SslStream<S>, openssl::ssl::Error> {
    psk_handshake_up_to(stream, identity, key, None).await
}

/// [`psk_handshake`] offering TLS versions up to `max` only.
pub(crate) async fn psk_handshake_up_to<S: Client>(
    stream: S,
    identity: &'static str,
    key: [u8; 32],
    max: Option<openssl::ssl::SslVersion>,
) -> Result<tokio_openssl::SslStream<S>, openssl::ssl::Error> {
    use openssl::ssl::{SslConnector, SslMethod, SslVerifyMode};
    let mut builder = SslConnector::builder(SslMethod::tls_client()).unwrap();
    builder.set_verify(SslVerifyMode::NONE);
    builder.set_max_proto_version(max).unwrap();
    // The PSK suites a TLS 1.2 client of ours would offer (OpenSSL's client default has
    // none that this PSK-only server accepts).
    builder.set_cipher_list("kECDHEPSK").unwrap();
    builder.set_psk_client_callback(move |_, _, id, psk| {
        id[..identity.len()].copy_from_slice(identity.as_bytes());
        id[identity.len()] = 0;
        psk[..key.len()].copy_from_slice(&key);
        Ok(key.len())
    });
    let ssl = builder.build().configure().unwrap().into_ssl("localhost").unwrap();
    let mut stream = tokio_openssl::SslStream::new(ssl, stream).unwrap();
    std::pin::Pin::new(&mut stream).connect().await?;
    Ok(stream)
}

/// Every volume of a store, by name.
pub(crate) struct ByName(pub(crate) Arc<Store>);

impl Exports for ByName {
    fn names(&self) -> Vec<String> {
        Vec::new()
    }

    fn open(&self, name: &str) -> Option<Volume> {
        Volume::open(&self.0, name).ok()
    }
}
