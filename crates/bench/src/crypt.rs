//! Encryption's cost on this CPU (`sluice-bench crypt`): how many bytes a second one core
//! seals and opens through the encrypt and decrypt stages' own code (`zio::crypt::FamilyKey`:
//! a block key derived with BLAKE3, a random nonce, AES-256-GCM through OpenSSL), per block
//! size, and what a passphrase's Argon2id costs at a key load. No I/O: the figures are the
//! code's ceiling, not a pool's.

use std::time::Instant;

use sluice_engine::zio::crypt::{FamilyKey, MasterKey, UserKey, WrappingKey};
use sluice_format::KeyFormat;

/// One block size's figures.
#[derive(Debug, serde::Serialize)]
pub struct Row {
    pub block_bytes: u64,
    /// GB/s sealed (encrypt and tag), median of the runs, and each run's.
    pub seal_gb_per_s: f64,
    pub seal_runs: Vec<f64>,
    /// GB/s opened (verify and decrypt).
    pub open_gb_per_s: f64,
    pub open_runs: Vec<f64>,
    /// Microseconds per block sealed, from the median.
    pub seal_us_per_block: f64,
}

#[derive(Debug, serde::Serialize)]
pub struct Report {
    pub openssl: String,
    pub cpu_flags: Vec<String>,
    pub seconds_per_run: f64,
    pub rows: Vec<Row>,
    /// Milliseconds one Argon2id derivation takes at the parameters new passphrases get.
    pub argon2_ms: f64,
}

impl Report {
    pub fn markdown(&self) -> String {
        let mut out = format!(
            "{}; CPU flags that AES-GCM code paths use: {}. One core, {} runs of {:.1} s each; \
             GB/s of block data, median (range).\n\n| block | seal GB/s | range | open GB/s | \
             range | µs per block sealed |\n|---|---:|---|---:|---|---:|\n",
            self.openssl,
            self.cpu_flags.join(", "),
            self.rows.first().map_or(0, |r| r.seal_runs.len()),
            self.seconds_per_run
        );
        let range = crate::range_of;
        for row in &self.rows {
            out += &format!(
                "| {} KiB | {:.2} | {} | {:.2} | {} | {:.1} |\n",
                row.block_bytes >> 10,
                row.seal_gb_per_s,
                range(&row.seal_runs),
                row.open_gb_per_s,
                range(&row.open_runs),
                row.seal_us_per_block
            );
        }
        out += &format!(
            "\nArgon2id at the parameters new passphrases get (64 MiB, 3 passes, 1 lane): {:.0} ms \
             per key load or key change.\n",
            self.argon2_ms
        );
        out
    }
}

/// The CPU flags x86-64 AES-GCM code chooses its path by, as /proc/cpuinfo lists them.
fn cpu_flags() -> Vec<String> {
    let info = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
    let flags: Vec<&str> = info
        .lines()
        .find(|l| l.starts_with("flags"))
        .map(|l| l.split_whitespace().collect())
        .unwrap_or_default();
    ["aes", "pclmulqdq", "avx", "avx2", "movbe", "vaes", "vpclmulqdq", "avx512f", "gfni"]
        .iter()
        .map(|f| if flags.contains(f) { (*f).to_owned() } else { format!("no {f}") })
        .collect()
}

pub fn run(sizes: &[u64], seconds: f64, runs: usize) -> anyhow::Result<Report> {
    let family = FamilyKey::new(MasterKey::generate()?)?;
    let mut rows = Vec::new();
    for &size in sizes {
        let plain: Vec<u8> = (0..size).map(|i| (i * 31 % 251) as u8).collect();
        let mut data = plain.clone();
        let seal_runs: Vec<f64> = (0..runs)
            .map(|_| {
                crate::rate_gb_per_s(size, seconds, || {
                    family.seal(&mut data, b"aad", false).expect("seal");
                })
            })
            .collect();
        let mut sealed = plain.clone();
        let sealing = family.seal(&mut sealed, b"aad", false)?;
        let mut work = sealed.clone();
        let open_runs: Vec<f64> = (0..runs)
            .map(|_| {
                crate::rate_gb_per_s(size, seconds, || {
                    work.copy_from_slice(&sealed);
                    family.open(&mut work, b"aad", &sealing).expect("open");
                })
            })
            .collect();
        anyhow::ensure!(work == plain, "a {size}-byte block did not open to its data");
        let seal = crate::median_of(&seal_runs);
        rows.push(Row {
            block_bytes: size,
            seal_gb_per_s: seal,
            seal_runs,
            open_gb_per_s: crate::median_of(&open_runs),
            open_runs,
            seal_us_per_block: size as f64 / (seal * 1e9) * 1e6,
        });
    }
    let kdf = WrappingKey::new_kdf()?;
    let start = Instant::now();
    WrappingKey::derive(
        KeyFormat::Passphrase,
        Some(&kdf),
        &UserKey::new(b"a passphrase to time".to_vec()),
    )?;
    let argon2_ms = start.elapsed().as_secs_f64() * 1e3;
    Ok(Report {
        openssl: openssl::version::version().to_owned(),
        cpu_flags: cpu_flags(),
        seconds_per_run: seconds,
        rows,
        argon2_ms,
    })
}
