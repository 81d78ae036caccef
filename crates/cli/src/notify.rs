//! Readiness for a service manager (systemd's `sd_notify` protocol): under a unit of
//! `Type=notify`, `sluice serve` says `READY=1` once the pool is imported and every listener
//! is open, so units ordered after it (a VM that attaches the volume) start only when it
//! answers, and `STOPPING=1` when a signal has it finish requests, sync and export.
//!
//! The protocol is one datagram of `KEY=VALUE` lines to the Unix socket named by
//! `$NOTIFY_SOCKET` (a path, or an abstract name after `@`). That is a dozen lines on std, so
//! no crate is taken for it. Without the variable (not run by systemd) nothing is sent; a send
//! that fails is reported on stderr and otherwise ignored, as the service manager gives up
//! waiting on its own.

use std::os::unix::net::UnixDatagram;

/// Sends `state` (newline-separated `KEY=VALUE` lines) to the service manager, if one asked
/// for notifications.
pub fn notify(state: &str) {
    let Some(socket) = std::env::var_os("NOTIFY_SOCKET") else { return };
    if let Err(error) = send(&socket, state) {
        eprintln!(
            "sluice: telling the service manager {state:?} through NOTIFY_SOCKET={}: {error}",
            socket.to_string_lossy()
        );
    }
}

fn send(socket: &std::ffi::OsStr, state: &str) -> std::io::Result<()> {
    use std::os::unix::ffi::OsStrExt;
    let datagram = UnixDatagram::unbound()?;
    let bytes = socket.as_bytes();
    match bytes.strip_prefix(b"@") {
        Some(name) => {
            use std::os::linux::net::SocketAddrExt;
            let address = std::os::unix::net::SocketAddr::from_abstract_name(name)?;
            datagram.send_to_addr(state.as_bytes(), &address)?;
        }
        None => {
            datagram.send_to(state.as_bytes(), std::path::Path::new(socket))?;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    /// What a service manager listening on a path receives.
    #[test]
    fn sends_one_datagram_to_the_socket() {
        let dir = std::env::temp_dir().join(format!("sluice-notify-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("notify.sock");
        let _ = std::fs::remove_file(&path);
        let manager = UnixDatagram::bind(&path).unwrap();
        send(path.as_os_str(), "READY=1\nSTATUS=serving pool tank").unwrap();
        let mut buf = [0u8; 256];
        let n = manager.recv(&mut buf).unwrap();
        assert_eq!(&buf[..n], b"READY=1\nSTATUS=serving pool tank");
        // An abstract name works too.
        let name = format!("sluice-notify-test-{}", std::process::id());
        use std::os::linux::net::SocketAddrExt;
        let address = std::os::unix::net::SocketAddr::from_abstract_name(name.as_bytes()).unwrap();
        let abstract_manager = UnixDatagram::bind_addr(&address).unwrap();
        send(std::ffi::OsStr::new(&format!("@{name}")), "STOPPING=1").unwrap();
        let n = abstract_manager.recv(&mut buf).unwrap();
        assert_eq!(&buf[..n], b"STOPPING=1");
        // No listener: an error, not a panic or a hang.
        drop(manager);
        assert!(send(path.as_os_str(), "READY=1").is_err());
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
