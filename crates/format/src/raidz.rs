//! RAID-Z's geometry and parity (ZFS: `vdev_raidz.c`'s `vdev_raidz_map_alloc`,
//! `vdev_raidz_asize` and the scalar parity of `vdev_raidz_math_scalar.c`): where a block's
//! columns lie on a RAID-Z vdev's children, what it allocates, and the parity that rebuilds up
//! to three lost columns.
//!
//! A RAID-Z vdev of `W` children with `P` parity numbers its sectors across the children row by
//! row: logical sector `i` of the vdev is row `i / W` of child `i % W`. A block of `s` sectors,
//! from logical sector `b` on, is cut into columns: column `c` holds logical sectors `b + c`,
//! `b + c + W`, `b + c + 2W`, ..., so each column is one contiguous run on one child and the
//! block is written with one I/O per child. The first `P` columns are parity (P, then Q, then
//! R), the rest data, filled column after column: the first data column takes the block's
//! first bytes. When `s` is not a multiple of `W - P` the first columns are one sector longer;
//! a short column counts as zeros in its last row's parity. Every block is a full stripe of its
//! own, never read-modify-written: there is no write hole.
//!
//! The allocation is rounded up to a multiple of `P + 1` sectors, so that no free gap is smaller
//! than the smallest block (one data sector and its parity). The sectors rounded up ("pads")
//! follow the block's own, hold nothing, are in no parity and are never read. As OpenZFS does,
//! a single-parity block that starts in an odd MiB of the vdev swaps its first two columns, so
//! that parity does not stay on one child for a run of full-width blocks.
//!
//! A vdev whose config says so ([`RaidzLayout::Copies`], feature `raidz_log_copies`) lays out
//! its intent-log blocks another way: one data column of all the block's `s` sectors and `P`
//! parity columns beside it, on `P + 1` consecutive children from the block's first sector on.
//! With one data column the parity equations make each parity column a copy of it (P, Q and R
//! of a single column are that column), so the block survives `P` lost columns as every RAID-Z
//! block does, and its columns are `P + 1` writes whatever its length. A striped log block of a
//! 4 KiB write (two sectors: the record and its headers) is three writes and three flushes on a
//! raidz1, against a mirror's two, and a client waits for all of them. Its allocation spans the
//! rows its columns use, `(s - 1) * W + P + 1` sectors rounded up to a multiple of `P + 1`; the
//! other children's sectors in those rows are pads. Log blocks live for a few txgs, so the
//! space they hold for that while is of no account.
//!
//! Parity is computed over GF(2^8) with the polynomial x^8+x^4+x^3+x^2+1 (0x11d), byte by byte
//! across each row of the data columns `D_0 .. D_{n-1}`: `P = D_0 ^ ... ^ D_{n-1}`,
//! `Q = sum of 2^(n-1-i) * D_i`, `R = sum of 4^(n-1-i) * D_i` (OpenZFS's equations: the first
//! data column gets the highest power; general Reed-Solomon crates use other matrices, which
//! would not read sluice's pools). Any `P` columns, data or parity, can be rebuilt from the rest.
//!
//! Parity is computed by branch-free byte loops that the compiler vectorizes, for the target's
//! baseline and, chosen at run time, for AVX2 ([`ParityPath`]); each path is checked bit for bit
//! against [`reference`], which follows the field's definition one byte at a time. All of it is
//! the on-disk format, frozen by golden tests (crates/format/tests/raidz.rs): changing any of it
//! moves the blocks of existing pools.

use std::ops::Range;

/// The most parity columns a RAID-Z vdev has (raidz3). Beyond three, the P, Q, R construction
/// (powers of 1, 2 and 4) is no longer always invertible.
pub const RAIDZ_PARITY_MAX: u32 = 3;

/// The most children a RAID-Z vdev may have.
pub const RAIDZ_CHILDREN_MAX: u32 = 64;

/// A geometry that cannot be.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum RaidzError {
    #[error(
        "raidz{parity} needs from {} to {RAIDZ_CHILDREN_MAX} children, not {width}",
        parity + 2
    )]
    Width { width: u32, parity: u32 },
    #[error("RAID-Z parity is 1, 2 or 3, not {parity}")]
    Parity { parity: u32 },
    #[error(
        "{lost} of a block's columns are lost; its {parity} parity column(s) rebuild at most \
         {parity}"
    )]
    TooManyLost { lost: usize, parity: usize },
}

/// How a block lies on a RAID-Z vdev (see the module doc).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum RaidzLayout {
    /// Data columns across the row, parity beside them: every block but the log blocks of a
    /// vdev whose log blocks are [`RaidzLayout::Copies`].
    #[default]
    Striped,
    /// One data column of every sector, each parity column a copy of it.
    Copies,
}

/// The shape of one RAID-Z vdev: its children, its parity, its sector size, and how it lays
/// out intent-log blocks.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RaidzGeometry {
    width: u32,
    parity: u32,
    ashift: u32,
    log_layout: RaidzLayout,
}

/// One column of a block: a run of `size` bytes at `offset` (from the start of the child's
/// data area) on child `child`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RaidzColumn {
    pub child: u32,
    pub offset: u64,
    pub size: u64,
}

/// Where one block lies on a RAID-Z vdev ([`RaidzGeometry::map`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RaidzMap {
    /// The parity columns (P, Q, R as the vdev has them), then the data columns.
    pub columns: Vec<RaidzColumn>,
    /// How many of `columns` are parity.
    pub parity: usize,
    /// The sectors the allocation rounds up to, as (child, offset): never read, in no parity.
    pub pads: Vec<(u32, u64)>,
}

impl RaidzMap {
    /// The parity columns.
    pub fn parity_columns(&self) -> &[RaidzColumn] {
        &self.columns[..self.parity]
    }

    /// The data columns.
    pub fn data_columns(&self) -> &[RaidzColumn] {
        &self.columns[self.parity..]
    }

    /// The bytes of the block's (sector-padded) data each data column holds, in order.
    pub fn data_ranges(&self) -> impl Iterator<Item = Range<usize>> + '_ {
        let mut at = 0usize;
        self.data_columns().iter().map(move |column| {
            let size = column.size as usize;
            at += size;
            at - size..at
        })
    }

    /// The block's data bytes: the sum of the data columns, its psize rounded up to sectors.
    pub fn data_bytes(&self) -> u64 {
        self.data_columns().iter().map(|c| c.size).sum()
    }
}

/// Whether `width` children with `parity` of them parity make a RAID-Z vdev: what
/// [`RaidzGeometry::new`] checks besides the sector size, and what the vdev tree config checks
/// of each RAID-Z vdev it records, so that a config that decodes always has a geometry.
pub(crate) fn check_shape(width: u32, parity: u32) -> Result<(), RaidzError> {
    if !(1..=RAIDZ_PARITY_MAX).contains(&parity) {
        return Err(RaidzError::Parity { parity });
    }
    if width < parity + 2 || width > RAIDZ_CHILDREN_MAX {
        return Err(RaidzError::Width { width, parity });
    }
    Ok(())
}

impl RaidzGeometry {
    /// A vdev of `width` children with `parity` of them parity, in sectors of `1 << ashift`
    /// bytes. At least `parity + 2` children: with `parity + 1` every block is a mirror.
    pub fn new(width: u32, parity: u32, ashift: u32) -> Result<RaidzGeometry, RaidzError> {
        check_shape(width, parity)?;
        assert!((9..=16).contains(&ashift), "ashift {ashift} out of the pool's range");
        Ok(RaidzGeometry { width, parity, ashift, log_layout: RaidzLayout::Striped })
    }

    /// The same vdev with its intent-log blocks laid out as `layout`.
    pub fn with_log_layout(self, layout: RaidzLayout) -> RaidzGeometry {
        RaidzGeometry { log_layout: layout, ..self }
    }

    /// How the vdev lays out intent-log blocks.
    pub fn log_layout(&self) -> RaidzLayout {
        self.log_layout
    }

    pub fn width(&self) -> u32 {
        self.width
    }

    pub fn parity(&self) -> u32 {
        self.parity
    }

    pub fn ashift(&self) -> u32 {
        self.ashift
    }

    fn sector(&self) -> u64 {
        1 << self.ashift
    }

    /// The bytes a block of `psize` bytes allocates: its sectors, a parity sector per row for
    /// each parity, rounded up to a multiple of `parity + 1` sectors (ZFS:
    /// `vdev_raidz_asize`).
    pub fn asize(&self, psize: u64) -> u64 {
        let (w, p) = (u64::from(self.width), u64::from(self.parity));
        let sectors = psize.div_ceil(self.sector());
        let with_parity = sectors + p * sectors.div_ceil(w - p);
        with_parity.next_multiple_of(p + 1) << self.ashift
    }

    /// The bytes a block of `psize` bytes allocates when laid out as `layout`.
    pub fn asize_in(&self, layout: RaidzLayout, psize: u64) -> u64 {
        match layout {
            RaidzLayout::Striped => self.asize(psize),
            RaidzLayout::Copies => {
                let (w, p) = (u64::from(self.width), u64::from(self.parity));
                let sectors = psize.div_ceil(self.sector()).max(1);
                ((sectors - 1) * w + p + 1).next_multiple_of(p + 1) << self.ashift
            }
        }
    }

    /// Where the block of `psize` bytes at `offset` lies when laid out as `layout`.
    pub fn map_in(&self, layout: RaidzLayout, offset: u64, psize: u64) -> RaidzMap {
        match layout {
            RaidzLayout::Striped => self.map(offset, psize),
            RaidzLayout::Copies => self.copies_map(offset, psize),
        }
    }

    /// [`RaidzLayout::Copies`]: `parity + 1` columns of every sector on the children from the
    /// block's first sector on, the last of them the data column.
    fn copies_map(&self, offset: u64, psize: u64) -> RaidzMap {
        assert!(psize > 0, "a block has at least one byte");
        assert_eq!(offset % self.sector(), 0, "block offsets are whole sectors");
        let (w, p) = (u64::from(self.width), u64::from(self.parity));
        let sectors = psize.div_ceil(self.sector());
        let first = offset >> self.ashift;
        let columns: Vec<RaidzColumn> = (0..=p)
            .map(|c| RaidzColumn {
                child: ((first + c) % w) as u32,
                offset: ((first + c) / w) << self.ashift,
                size: sectors << self.ashift,
            })
            .collect();
        let allocated = self.asize_in(RaidzLayout::Copies, psize) >> self.ashift;
        // Every sector of the allocation that no column holds: the column of sector `i` is
        // `i - first` children on, and holds it when that is at most `p`.
        let pads = (first..first + allocated)
            .filter(|&i| (i - first) % w > p || (i - first) / w >= sectors)
            .map(|i| ((i % w) as u32, (i / w) << self.ashift))
            .collect();
        RaidzMap { columns, parity: p as usize, pads }
    }

    /// The largest psize whose [`asize`](Self::asize) fits in `asize` bytes, in whole sectors.
    /// A last row of at most `parity` sectors can hold only pads (a row with data needs a
    /// parity sector per parity beside it): counting parity for it, as OpenZFS's inverse did
    /// before its fix (pull request 17490), gives too small a psize.
    pub fn max_psize(&self, asize: u64) -> u64 {
        let (w, p) = (u64::from(self.width), u64::from(self.parity));
        // What `asize` returns is a multiple of `p + 1` sectors; anything between two such is
        // no use to a block.
        let mut sectors = (asize >> self.ashift) / (p + 1) * (p + 1);
        let full_rows = sectors / w;
        if sectors - full_rows * w <= p {
            sectors = full_rows * w;
        }
        (sectors - p * sectors.div_ceil(w)) << self.ashift
    }

    /// Where the block of `psize` bytes allocated at `offset` (bytes from the start of the
    /// vdev's data space, a whole number of sectors) lies.
    pub fn map(&self, offset: u64, psize: u64) -> RaidzMap {
        assert!(psize > 0, "a block has at least one byte");
        assert_eq!(offset % self.sector(), 0, "block offsets are whole sectors");
        let (w, p) = (u64::from(self.width), u64::from(self.parity));
        let sectors = psize.div_ceil(self.sector());
        let first = offset >> self.ashift;
        let (first_child, first_row) = (first % w, first / w);
        // Full rows of data, and the data sectors left over for one more row.
        let rows = sectors / (w - p);
        let rest = sectors - rows * (w - p);
        // Columns one sector longer than the others: the parity and `rest` data columns.
        let long = if rest == 0 { 0 } else { rest + p };
        let total = sectors + p * (rows + u64::from(rest > 0));
        let count = if rows == 0 { long } else { w };
        let mut columns: Vec<RaidzColumn> = (0..count)
            .map(|c| {
                let at = first_child + c;
                let row = first_row + u64::from(at >= w);
                let size = if c < long { rows + 1 } else { rows };
                RaidzColumn {
                    child: (at % w) as u32,
                    offset: row << self.ashift,
                    size: size << self.ashift,
                }
            })
            .collect();
        if p == 1 && offset & (1 << 20) != 0 {
            // OpenZFS's raidz1 swap (see the module doc); both columns are the same length.
            let (parity, data) = (columns[0], columns[1]);
            columns[0] = RaidzColumn { size: parity.size, ..data };
            columns[1] = RaidzColumn { size: data.size, ..parity };
        }
        let padded = total.next_multiple_of(p + 1);
        let pads = (first + total..first + padded)
            .map(|i| ((i % w) as u32, (i / w) << self.ashift))
            .collect();
        let map = RaidzMap { columns, parity: p as usize, pads };
        debug_assert_eq!(
            map.columns.iter().map(|c| c.size).sum::<u64>(),
            total << self.ashift,
            "a map's columns hold its data and parity sectors"
        );
        map
    }
}

/// Arithmetic in GF(2^8) with the polynomial 0x11d, by tables of powers of 2 and their logs.
pub mod gf {
    const fn tables() -> ([u8; 512], [u8; 256]) {
        let (mut exp, mut log) = ([0u8; 512], [0u8; 256]);
        let mut x: u16 = 1;
        let mut i = 0;
        while i < 255 {
            exp[i] = x as u8;
            log[x as usize] = i as u8;
            x <<= 1;
            if x & 0x100 != 0 {
                x ^= 0x11d;
            }
            i += 1;
        }
        // Doubled, so that a sum of two logs indexes it without a modulo.
        while i < 512 {
            exp[i] = exp[i - 255];
            i += 1;
        }
        (exp, log)
    }

    const TABLES: ([u8; 512], [u8; 256]) = tables();
    /// `EXP[i]` is 2^i (for i up to 510).
    pub const EXP: [u8; 512] = TABLES.0;
    /// `LOG[a]` is the i with 2^i = a, for a nonzero (`LOG[0]` means nothing).
    pub const LOG: [u8; 256] = TABLES.1;

    /// a * b.
    pub fn mul(a: u8, b: u8) -> u8 {
        if a == 0 || b == 0 {
            return 0;
        }
        EXP[usize::from(LOG[usize::from(a)]) + usize::from(LOG[usize::from(b)])]
    }

    /// 1 / a, for a nonzero.
    pub fn inv(a: u8) -> u8 {
        assert_ne!(a, 0, "zero has no inverse");
        EXP[255 - usize::from(LOG[usize::from(a)])]
    }

    /// 2^e.
    pub fn pow2(e: u32) -> u8 {
        EXP[(e % 255) as usize]
    }

    /// a * 2.
    pub fn mul2(a: u8) -> u8 {
        (a << 1) ^ if a & 0x80 != 0 { 0x1d } else { 0 }
    }

    /// a * 4.
    pub fn mul4(a: u8) -> u8 {
        mul2(mul2(a))
    }
}

/// `b * 2`, without a branch: shifted left, and 0x1d added when the top bit fell off (the
/// arithmetic shift of the top bit makes the mask). Written so that the compiler turns the
/// loops below into vector instructions.
#[inline(always)]
fn mul2_byte(b: u8) -> u8 {
    (b << 1) ^ ((((b as i8) >> 7) as u8) & 0x1d)
}

/// `b * 2^j` for parity `j`.
#[inline(always)]
fn scale_byte(b: u8, j: usize) -> u8 {
    match j {
        0 => b,
        1 => mul2_byte(b),
        _ => mul2_byte(mul2_byte(b)),
    }
}

/// One step of Horner's rule over the running parity `acc`: `acc = acc * 2^j ^ column`, the
/// column counting as zeros past its end (or wholly, given as `None`). One pass, in place.
#[inline(always)]
fn horner_step(acc: &mut [u8], column: Option<&[u8]>, j: usize) {
    let column = column.unwrap_or(&[]);
    let (head, tail) = acc.split_at_mut(column.len().min(acc.len()));
    for (a, d) in head.iter_mut().zip(column) {
        *a = scale_byte(*a, j) ^ d;
    }
    if j > 0 {
        for a in tail {
            *a = scale_byte(*a, j);
        }
    }
}

#[inline(always)]
fn horner_portable(data: &[Option<&[u8]>], j: usize, out: &mut [u8]) {
    out.fill(0);
    for column in data {
        horner_step(out, *column, j);
    }
}

/// [`horner_portable`] compiled for AVX2: the same code, vectorized 32 bytes at a time.
///
/// # Safety
///
/// The CPU must have AVX2 (`is_x86_feature_detected!("avx2")`).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn horner_avx2(data: &[Option<&[u8]>], j: usize, out: &mut [u8]) {
    horner_portable(data, j, out);
}

/// How parity is computed on this machine.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ParityPath {
    /// Plain Rust, vectorized for what every CPU of the target has (SSE2 on x86-64).
    Portable,
    /// The same code compiled for AVX2, chosen when the CPU has it.
    Avx2,
}

impl ParityPath {
    /// The fastest path this CPU runs.
    pub fn detect() -> ParityPath {
        #[cfg(target_arch = "x86_64")]
        if std::arch::is_x86_feature_detected!("avx2") {
            return ParityPath::Avx2;
        }
        ParityPath::Portable
    }

    /// Whether this CPU can run the path.
    pub fn available(self) -> bool {
        match self {
            ParityPath::Portable => true,
            #[cfg(target_arch = "x86_64")]
            ParityPath::Avx2 => std::arch::is_x86_feature_detected!("avx2"),
            #[cfg(not(target_arch = "x86_64"))]
            ParityPath::Avx2 => false,
        }
    }
}

/// Parity `j` of data columns `data` (in column order; a shorter column counts as zeros past
/// its end) into `out`, as long as the longest column, by Horner's rule:
/// `acc = acc * 2^j ^ D_i` for each column in turn. A column given as `None` counts as zeros
/// (the syndrome of a rebuild).
fn horner_with(path: ParityPath, data: &[Option<&[u8]>], j: usize, out: &mut [u8]) {
    assert!(path.available(), "the {path:?} parity path on a CPU that lacks it");
    #[cfg(target_arch = "x86_64")]
    if path == ParityPath::Avx2 {
        // SAFETY: the CPU has AVX2 (`available`, asserted above), which is all
        // `horner_avx2` needs beyond what the target guarantees.
        unsafe { horner_avx2(data, j, out) };
        return;
    }
    horner_portable(data, j, out);
}

fn horner(data: &[Option<&[u8]>], j: usize, out: &mut [u8]) {
    horner_with(detected_path(), data, j, out);
}

/// [`ParityPath::detect`], once per process.
fn detected_path() -> ParityPath {
    static PATH: std::sync::OnceLock<ParityPath> = std::sync::OnceLock::new();
    *PATH.get_or_init(ParityPath::detect)
}

/// [`generate_parity`] through a given path (for tests and benchmarks: each path is checked
/// against [`reference`] bit for bit).
pub fn generate_parity_with(path: ParityPath, data: &[&[u8]], parity: &mut [&mut [u8]]) {
    assert!(parity.len() <= RAIDZ_PARITY_MAX as usize);
    let longest = data.iter().map(|c| c.len()).max().unwrap_or(0);
    let present: Vec<Option<&[u8]>> = data.iter().map(|c| Some(*c)).collect();
    for (j, out) in parity.iter_mut().enumerate() {
        assert_eq!(out.len(), longest, "parity is as long as the longest data column");
        horner_with(path, &present, j, out);
    }
}

/// The parity computed one byte at a time from the field's definition, without the vector
/// paths above: what [`generate_parity`] is checked against bit for bit, and measured against
/// (`sluice-bench raidz`).
pub mod reference {
    use super::gf;

    /// As [`super::generate_parity`].
    pub fn generate_parity(data: &[&[u8]], parity: &mut [&mut [u8]]) {
        for (j, out) in parity.iter_mut().enumerate() {
            for (k, byte) in out.iter_mut().enumerate() {
                let mut acc = 0u8;
                for column in data {
                    for _ in 0..j {
                        acc = gf::mul2(acc);
                    }
                    acc ^= column.get(k).copied().unwrap_or(0);
                }
                *byte = acc;
            }
        }
    }
}

/// Writes the parity of the data columns `data` (in column order; a shorter column counts as
/// zeros past its end) into `parity`: P, then Q, then R, as many as given, each as long as the
/// longest data column. Through the fastest path this CPU runs ([`ParityPath::detect`]).
pub fn generate_parity(data: &[&[u8]], parity: &mut [&mut [u8]]) {
    generate_parity_with(detected_path(), data, parity);
}

/// Rebuilds the columns listed in `lost` (indices into `columns`, which holds a map's columns:
/// its `parity` parity columns, then its data columns, each at its own length) from the others.
/// Lost data is solved from the first parity columns that are not lost; lost parity is then
/// computed again from the data. At most `parity` columns can be lost.
pub fn reconstruct(
    columns: &mut [&mut [u8]],
    parity: usize,
    lost: &[usize],
) -> Result<(), RaidzError> {
    assert!(parity <= RAIDZ_PARITY_MAX as usize && parity < columns.len());
    // A map's columns: the parity columns as long as each other, no data column longer.
    let parity_len = columns[0].len();
    assert!(
        columns.iter().enumerate().all(|(c, col)| if c < parity {
            col.len() == parity_len
        } else {
            col.len() <= parity_len
        }),
        "parity columns of one length, and no data column longer"
    );
    let mut lost = lost.to_vec();
    lost.sort_unstable();
    lost.dedup();
    assert!(lost.iter().all(|&c| c < columns.len()), "lost columns are columns of the block");
    let lost = &lost[..];
    if lost.len() > parity {
        return Err(RaidzError::TooManyLost { lost: lost.len(), parity });
    }
    let is_lost = |c: usize| lost.contains(&c);
    let missing: Vec<usize> = (parity..columns.len()).filter(|&c| is_lost(c)).collect();
    if !missing.is_empty() {
        let (parities, data) = columns.split_at_mut(parity);
        let n = data.len();
        // The parity columns the rebuild uses: the first ones that are not lost.
        let used: Vec<usize> = (0..parity).filter(|&j| !is_lost(j)).take(missing.len()).collect();
        assert_eq!(used.len(), missing.len(), "no more columns lost than there is parity");
        // Each used parity minus what the surviving data gives it: the lost columns' share.
        let syndromes: Vec<Vec<u8>> = {
            let present: Vec<Option<&[u8]>> = data
                .iter()
                .enumerate()
                .map(|(i, c)| if is_lost(parity + i) { None } else { Some(&c[..]) })
                .collect();
            used.iter()
                .map(|&j| {
                    let mut acc = vec![0u8; parities[j].len()];
                    horner(&present, j, &mut acc);
                    acc.iter_mut().zip(parities[j].iter()).for_each(|(a, p)| *a ^= p);
                    acc
                })
                .collect()
        };
        // The lost columns' coefficients in each used parity: (2^j)^(n-1-i) for column i.
        let m = missing.len();
        let coefficient = |j: usize, i: usize| gf::pow2((j * (n - 1 - i)) as u32);
        let matrix: Vec<Vec<u8>> = used
            .iter()
            .map(|&j| missing.iter().map(|&c| coefficient(j, c - parity)).collect())
            .collect();
        let inverse = invert(matrix);
        for (t, &c) in missing.iter().enumerate() {
            let out = &mut data[c - parity];
            out.fill(0);
            for (k, syndrome) in syndromes.iter().enumerate().take(m) {
                // A table of this factor's products: one lookup a byte, not two logs and an
                // exponent.
                let factor = inverse[t][k];
                let products: [u8; 256] = std::array::from_fn(|x| gf::mul(factor, x as u8));
                out.iter_mut()
                    .zip(syndrome.iter())
                    .for_each(|(o, s)| *o ^= products[usize::from(*s)]);
            }
        }
    }
    let lost_parity: Vec<usize> = (0..parity).filter(|&j| is_lost(j)).collect();
    if !lost_parity.is_empty() {
        let (parities, data) = columns.split_at_mut(parity);
        let present: Vec<Option<&[u8]>> = data.iter().map(|c| Some(&c[..])).collect();
        for j in lost_parity {
            horner(&present, j, parities[j]);
        }
    }
    Ok(())
}

/// The inverse of a square matrix over GF(2^8) (at most 3 x 3), by Gauss-Jordan elimination.
/// The matrices a rebuild makes from P, Q and R's coefficients are always invertible.
fn invert(mut matrix: Vec<Vec<u8>>) -> Vec<Vec<u8>> {
    let m = matrix.len();
    let mut inverse: Vec<Vec<u8>> =
        (0..m).map(|r| (0..m).map(|c| u8::from(r == c)).collect()).collect();
    for col in 0..m {
        let pivot = (col..m)
            .find(|&r| matrix[r][col] != 0)
            .expect("P, Q and R's coefficients make an invertible matrix");
        matrix.swap(col, pivot);
        inverse.swap(col, pivot);
        let scale = gf::inv(matrix[col][col]);
        for k in 0..m {
            matrix[col][k] = gf::mul(matrix[col][k], scale);
            inverse[col][k] = gf::mul(inverse[col][k], scale);
        }
        for r in 0..m {
            let factor = matrix[r][col];
            if r == col || factor == 0 {
                continue;
            }
            for k in 0..m {
                matrix[r][k] ^= gf::mul(factor, matrix[col][k]);
                inverse[r][k] ^= gf::mul(factor, inverse[col][k]);
            }
        }
    }
    inverse
}
