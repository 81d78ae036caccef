//! The `sluice-bench` command: the engine benchmark (`sluice-bench engine`, real time on file
//! leaves), RAID-Z's parity code (`sluice-bench raidz`), encryption's cost (`sluice-bench crypt`),
//! compression's cost (`sluice-bench compress`) and the seeds' experiments
//! (`sluice-bench seeds ddt|mirror|queue|zil|zvol`; ddt in real time, the others in virtual
//! time under the simulator). A binary of its own, not a
//! subcommand of `sluice`, so that the served binary does not link the simulator.

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Context;
use clap::{Parser, Subcommand, ValueEnum};
use sluice_bench::{engine, seeds};

#[derive(Parser)]
#[command(
    name = "sluice-bench",
    version,
    about = "sluice's benchmarks: the engine through its API, and the seeds' experiments"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Volume throughput through the engine API on file leaves (real time), beside the same
    /// patterns on a raw file.
    Engine {
        /// Directory for the benchmark's files (on the disk to measure).
        #[arg(long, default_value = ".")]
        dir: PathBuf,
        #[arg(long, value_parser = parse_size, default_value = "512M")]
        volume_size: u64,
        #[arg(long, default_value_t = 20000)]
        random_ops: u64,
        #[arg(long, default_value_t = 16)]
        queue_depth: usize,
        #[arg(long)]
        json: bool,
    },
    /// RAID-Z's parity code on one core: parity generation (each path this CPU runs, and the
    /// byte reference they are checked against) and rebuilds, in GB/s of block data.
    Raidz {
        #[arg(long, value_parser = parse_size, default_value = "1M")]
        block_size: u64,
        /// Seconds per run.
        #[arg(long, default_value_t = 1.0)]
        seconds: f64,
        /// Runs per figure (the table gives medians).
        #[arg(long, default_value_t = 5)]
        runs: usize,
        #[arg(long)]
        json: bool,
    },
    /// Encryption's cost on one core: sealing and opening blocks through the encrypt and
    /// decrypt stages' code (AES-256-GCM), by block size, and a passphrase's Argon2id.
    Crypt {
        /// Block sizes to measure.
        #[arg(long, value_parser = parse_size, value_delimiter = ',', default_value = "4K,16K,128K")]
        block_sizes: Vec<u64>,
        /// Seconds per run.
        #[arg(long, default_value_t = 1.0)]
        seconds: f64,
        /// Runs per figure (the table gives medians).
        #[arg(long, default_value_t = 5)]
        runs: usize,
        #[arg(long)]
        json: bool,
    },
    /// Compression's cost on one core: the write pipeline's compress stage (blocks in runs of 1
    /// MiB, the early abort planned over each run) and decompression, by algorithm, block size
    /// and kind of data (random, half compressible as fio's --buffer_compress_percentage=50
    /// writes it, zeros).
    Compress {
        /// Algorithms to measure (lz4, zstd or zstd-N).
        #[arg(
            long,
            value_parser = parse_compression,
            value_delimiter = ',',
            default_value = "lz4,zstd"
        )]
        algorithms: Vec<sluice_format::Compression>,
        /// Block sizes to measure. A 4K block is stored as it is without a look on the default
        /// 4 KiB allocation unit (compressing it could not save a unit).
        #[arg(long, value_parser = parse_size, value_delimiter = ',', default_value = "16K,128K")]
        block_sizes: Vec<u64>,
        /// Seconds per run.
        #[arg(long, default_value_t = 0.5)]
        seconds: f64,
        /// Runs per figure (the table gives medians).
        #[arg(long, default_value_t = 5)]
        runs: usize,
        #[arg(long)]
        json: bool,
    },
    /// How the allocator places a txg sync's blocks on a pool aged by random writes: the
    /// engine's allocator driven as the sync drives it, no I/O; bytes per device write once
    /// the layout has settled, per leaf size (how much room the pool has beside the volume).
    Alloc {
        /// Leaf sizes to run (one data vdev each).
        #[arg(long, value_parser = parse_size, value_delimiter = ',', default_value = "4G,6G,8G,16G")]
        leaf_sizes: Vec<u64>,
        /// The volume, written whole first (bench/peers.sh's is 2G on a leaf twice its size).
        #[arg(long, value_parser = parse_size, default_value = "2G")]
        volume_size: u64,
        #[arg(long, value_parser = parse_size, default_value = "16K")]
        block_size: u64,
        /// Random block writes per txg (8 clients of 4 KiB write + flush: about 8,000 a second,
        /// a sync every 1.5 s).
        #[arg(long, default_value_t = 12_000)]
        writes_per_txg: u64,
        /// Txgs of random writes; the figures are the second half's.
        #[arg(long, default_value_t = 200)]
        txgs: u64,
        /// Which blocks the writes pick: the same seed, the same blocks.
        #[arg(long, default_value_t = 1)]
        seed: u64,
        #[arg(long)]
        json: bool,
    },
    /// Reproduce a seed document's experiment in virtual time, ours beside the published figures.
    Seeds {
        /// Which experiment.
        #[arg(value_enum)]
        experiment: Experiment,
        /// Print one JSON document instead of a markdown table.
        #[arg(long)]
        json: bool,
        /// Virtual seconds per measured point.
        #[arg(long, default_value_t = 20.0)]
        seconds: f64,
        /// Simulator seed: the same seed gives the same figures.
        #[arg(long, default_value_t = 1)]
        seed: u64,
        /// Extra tunables for every point, as name=value (repeatable). Settings the experiment
        /// itself varies (the read policy, the queue settings) are applied after these.
        #[arg(long = "set", value_name = "NAME=VALUE")]
        settings: Vec<String>,
        /// zil only: pool sizes to run (disks per pool).
        #[arg(long, value_delimiter = ',', default_value = "1,2,4,8")]
        disks: Vec<usize>,
        /// zil only: the largest writer count (powers of two from 1).
        #[arg(long, default_value_t = 1024)]
        max_writers: usize,
        /// zil only: after the table, fail (exit 1) if the auto policy falls more than 5% short
        /// of the better fixed policy anywhere (IOPS, or latency by more than 5% and 20 us).
        #[arg(long)]
        check: bool,
        /// mirror only: how far ahead each sequential reader's prefetch runs, in MiB (ZFS's
        /// zfetch_max_distance).
        #[arg(
            long,
            default_value_t = seeds::mirror::PREFETCH_BYTES >> 20,
            value_parser = clap::value_parser!(u64).range(1..=1024)
        )]
        prefetch_mib: u64,
        /// zvol only: the pools to run, ssd and/or hdd (each a 2-way mirror).
        #[arg(long, value_delimiter = ',', default_value = "ssd,hdd")]
        media: Vec<String>,
        /// ddt only: concurrent writer tasks.
        #[arg(long, default_value_t = 64)]
        writers: usize,
        /// ddt only: runtime worker threads (default: one per core).
        #[arg(long)]
        threads: Option<usize>,
        /// ddt only: runs per locking mode (the table gives medians).
        #[arg(long, default_value_t = 5)]
        repeats: usize,
    },
}

#[derive(Clone, Copy, PartialEq, Eq, ValueEnum)]
enum Experiment {
    /// Seed 002: mirror read selection, offset-modulo against least-pending, on simulated HDDs.
    Mirror,
    /// Seed 003: submission queues and queue depth against a queue-depth-1 sync writer.
    Queue,
    /// Seed 004: intent-log commits, batch against pipelined, 1 to 1024 writers on 1-8 disks.
    Zil,
    /// Seed 000: 64 sequential FUA writers on a volume, request_threads 8, 32 and unbounded.
    Zvol,
    /// Seed 001: dedup table locking, global against per-entry, unique 4 KiB blocks from many
    /// writers on in-memory leaves. Real time: --seconds are wall-clock seconds per run.
    Ddt,
}

/// The server's allocator, so that the figures are the server's (crates/host/src/allocator.rs).
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() -> ExitCode {
    sluice_host::allocator::tune();
    match run(Cli::parse()) {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("sluice-bench: {error:#}");
            ExitCode::FAILURE
        }
    }
}

fn parse_size(text: &str) -> anyhow::Result<u64> {
    sluice_engine::tunables::parse_bytes(text)
        .with_context(|| format!("{text:?} is not a size (like 512M or 4096)"))
}

fn parse_compression(text: &str) -> anyhow::Result<sluice_format::Compression> {
    match sluice_format::Compression::parse(text) {
        Some(sluice_format::Compression::Off) | None => {
            anyhow::bail!("{text:?} is not a compression to measure (lz4, zstd or zstd-N)")
        }
        Some(compression) => Ok(compression),
    }
}

fn parse_settings(settings: &[String]) -> anyhow::Result<Vec<(String, String)>> {
    Ok(sluice_engine::tunables::parse_settings(settings)?)
}

fn run(cli: Cli) -> anyhow::Result<()> {
    match cli.command {
        Command::Engine { dir, volume_size, random_ops, queue_depth, json } => {
            let report = engine::run(&dir, volume_size, random_ops, queue_depth.max(1))
                .map_err(|e| anyhow::anyhow!("engine benchmark in {}: {e}", dir.display()))?;
            if json {
                println!("{}", serde_json::to_string_pretty(&report)?);
            } else {
                print!("{}", report.markdown());
            }
            Ok(())
        }
        Command::Raidz { block_size, seconds, runs, json } => {
            anyhow::ensure!(
                runs > 0 && seconds > 0.0 && block_size > 0,
                "--runs, --seconds and --block-size must be positive"
            );
            let report = sluice_bench::raidz::run(block_size, seconds, runs)?;
            if json {
                println!("{}", serde_json::to_string_pretty(&report)?);
            } else {
                print!("{}", report.markdown());
            }
            Ok(())
        }
        Command::Crypt { block_sizes, seconds, runs, json } => {
            anyhow::ensure!(
                runs > 0 && seconds > 0.0 && block_sizes.iter().all(|&b| b > 0),
                "--runs, --seconds and --block-sizes must be positive"
            );
            let report = sluice_bench::crypt::run(&block_sizes, seconds, runs)?;
            if json {
                println!("{}", serde_json::to_string_pretty(&report)?);
            } else {
                print!("{}", report.markdown());
            }
            Ok(())
        }
        Command::Alloc {
            leaf_sizes,
            volume_size,
            block_size,
            writes_per_txg,
            txgs,
            seed,
            json,
        } => {
            let report = sluice_bench::alloc::run(
                &leaf_sizes,
                volume_size,
                block_size,
                writes_per_txg,
                txgs,
                seed,
            )?;
            if json {
                println!("{}", serde_json::to_string_pretty(&report)?);
            } else {
                print!("{}", report.markdown());
            }
            Ok(())
        }
        Command::Compress { algorithms, block_sizes, seconds, runs, json } => {
            anyhow::ensure!(
                runs > 0 && seconds > 0.0 && block_sizes.iter().all(|&b| b >= 4096),
                "--runs and --seconds must be positive and --block-sizes at least 4K"
            );
            let report = sluice_bench::compress::run(&algorithms, &block_sizes, seconds, runs)?;
            if json {
                println!("{}", serde_json::to_string_pretty(&report)?);
            } else {
                print!("{}", report.markdown());
            }
            Ok(())
        }
        Command::Seeds {
            experiment,
            json,
            seconds,
            seed,
            settings,
            disks,
            max_writers,
            check,
            prefetch_mib,
            media,
            writers,
            threads,
            repeats,
        } => {
            anyhow::ensure!(
                seconds > 0.0 && seconds <= 3600.0,
                "--seconds must be in (0, 3600], got {seconds}"
            );
            let base = parse_settings(&settings)?;
            let mut misses = Vec::new();
            let (markdown, value) = match experiment {
                Experiment::Mirror => {
                    let prefetch = prefetch_mib << 20;
                    let report = seeds::mirror::run(seconds, seed, prefetch, &base)?;
                    (report.markdown(), serde_json::to_value(&report)?)
                }
                Experiment::Queue => {
                    let report = seeds::queue::run(seconds, seed, &base)?;
                    (report.markdown(), serde_json::to_value(&report)?)
                }
                Experiment::Zil => {
                    anyhow::ensure!(base.is_empty(), "seeds zil takes no --set yet");
                    let report = seeds::zil::run(seconds, seed, &disks, max_writers);
                    if check {
                        misses = report.misses();
                    }
                    (report.markdown(), serde_json::to_value(&report)?)
                }
                Experiment::Zvol => {
                    if let Some(bad) = media.iter().find(|m| !["ssd", "hdd"].contains(&m.as_str()))
                    {
                        anyhow::bail!("--media {bad:?}: use ssd, hdd or ssd,hdd");
                    }
                    let report = seeds::zvol::run(seconds, seed, &media, &base)?;
                    (report.markdown(), serde_json::to_value(&report)?)
                }
                Experiment::Ddt => {
                    anyhow::ensure!(writers > 0, "--writers must be at least 1");
                    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
                    let report = seeds::ddt::run(
                        seconds,
                        seed,
                        writers,
                        threads.unwrap_or(cores).max(1),
                        repeats,
                        &base,
                    )
                    .map_err(|e| anyhow::anyhow!("seeds ddt: {e}"))?;
                    (report.markdown(), serde_json::to_value(&report)?)
                }
            };
            if json {
                println!("{}", serde_json::to_string_pretty(&value)?);
            } else {
                print!("{markdown}");
            }
            anyhow::ensure!(
                !check || experiment == Experiment::Zil,
                "--check applies to seeds zil only"
            );
            anyhow::ensure!(
                misses.is_empty(),
                "the auto intent-log policy is more than 5% short of the better fixed policy at: \
                 {}",
                misses.join("; ")
            );
            Ok(())
        }
    }
}
