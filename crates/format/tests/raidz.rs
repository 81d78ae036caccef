//! RAID-Z's geometry and parity, frozen: golden maps and sizes worked by hand from OpenZFS's
//! equations, the size formula and its inverse over every size, the parity of known bytes, and
//! the rebuild of every combination of up to `parity` lost columns.

use sluice_format::raidz::{
    generate_parity, generate_parity_with, gf, reconstruct, reference, ParityPath, RaidzError,
    RaidzGeometry, RaidzLayout, RaidzMap,
};

const K4: u64 = 4096;

/// (child, row, sectors) of each column, for 4 KiB sectors.
fn columns(map: &RaidzMap) -> Vec<(u32, u64, u64)> {
    map.columns.iter().map(|c| (c.child, c.offset / K4, c.size / K4)).collect()
}

fn pads(map: &RaidzMap) -> Vec<(u32, u64)> {
    map.pads.iter().map(|&(child, offset)| (child, offset / K4)).collect()
}

fn geometry(width: u32, parity: u32) -> RaidzGeometry {
    RaidzGeometry::new(width, parity, 12).expect("a valid geometry")
}

#[test]
fn golden_maps() {
    // raidz1 of 5, 12 KiB at sector 0: parity on child 0, one sector per column, no pad.
    let map = geometry(5, 1).map(0, 12 << 10);
    assert_eq!(columns(&map), [(0, 0, 1), (1, 0, 1), (2, 0, 1), (3, 0, 1)]);
    assert_eq!(pads(&map), []);
    // The same at sector 7: the fourth column wraps to the next row of child 0.
    let map = geometry(5, 1).map(7 * K4, 12 << 10);
    assert_eq!(columns(&map), [(2, 1, 1), (3, 1, 1), (4, 1, 1), (0, 2, 1)]);
    // In an odd MiB, raidz1 swaps its first two columns.
    let map = geometry(5, 1).map((1 << 20) + 7 * K4, 12 << 10);
    assert_eq!(columns(&map), [(4, 52, 1), (3, 52, 1), (0, 53, 1), (1, 53, 1)]);
    // 16 KiB at 1 MiB: five columns of one row, the swap, and a pad at logical sector 261.
    let map = geometry(5, 1).map(1 << 20, 16 << 10);
    assert_eq!(columns(&map), [(2, 51, 1), (1, 51, 1), (3, 51, 1), (4, 51, 1), (0, 52, 1)]);
    assert_eq!(pads(&map), [(1, 52)]);
    // raidz2 of 6, one sector: a three-way copy in effect.
    let map = geometry(6, 2).map(0, K4);
    assert_eq!(columns(&map), [(0, 0, 1), (1, 0, 1), (2, 0, 1)]);
    assert_eq!(pads(&map), []);
    // raidz1 of 5, 40 KiB: 10 data sectors in rows of 4, the first three columns one longer.
    let map = geometry(5, 1).map(0, 40 << 10);
    assert_eq!(columns(&map), [(0, 0, 3), (1, 0, 3), (2, 0, 3), (3, 0, 2), (4, 0, 2)]);
    assert_eq!(pads(&map), [(3, 2)]);
    assert_eq!(
        map.data_ranges().collect::<Vec<_>>(),
        [0..12288, 12288..24576, 24576..32768, 32768..40960]
    );
    // raidz2 of 5, 8 KiB: four sectors rounded to six, one pad wrapping to child 0.
    let map = geometry(5, 2).map(0, 8 << 10);
    assert_eq!(columns(&map), [(0, 0, 1), (1, 0, 1), (2, 0, 1), (3, 0, 1)]);
    assert_eq!(pads(&map), [(4, 0), (0, 1)]);
    // raidz2 of 6, 24 KiB at sector 5.
    let map = geometry(6, 2).map(5 * K4, 24 << 10);
    assert_eq!(columns(&map), [(5, 0, 2), (0, 1, 2), (1, 1, 2), (2, 1, 2), (3, 1, 1), (4, 1, 1)]);
    assert_eq!(pads(&map), [(3, 2), (4, 2)]);
}

/// Log blocks laid out as copies: one data column of every sector, after `parity` copies of
/// it, on consecutive children from the block's first sector.
#[test]
fn golden_copies_maps() {
    let copies = |g: RaidzGeometry, at: u64, len: u64| g.map_in(RaidzLayout::Copies, at, len);
    // raidz1 of 4, two sectors at sector 0: children 0 and 1, rows 0-1; rows 0-1 of children
    // 2 and 3 are pads but the last, outside the six sectors allocated.
    let map = copies(geometry(4, 1), 0, 8 << 10);
    assert_eq!(columns(&map), [(0, 0, 2), (1, 0, 2)]);
    assert_eq!(pads(&map), [(2, 0), (3, 0)]);
    assert_eq!(map.data_ranges().collect::<Vec<_>>(), vec![(0..8192)]);
    // At sector 3: the second column wraps to child 0 of the next row.
    let map = copies(geometry(4, 1), 3 * K4, 8 << 10);
    assert_eq!(columns(&map), [(3, 0, 2), (0, 1, 2)]);
    assert_eq!(pads(&map), [(1, 1), (2, 1)]);
    // raidz2 of 6, three sectors at logical sector 260 (child 2 of row 43); no swap in an odd
    // MiB, whatever the parity.
    let map = copies(geometry(6, 2), (1 << 20) + 4 * K4, 12 << 10);
    assert_eq!(columns(&map), [(2, 43, 3), (3, 43, 3), (4, 43, 3)]);
    assert_eq!(pads(&map), [(5, 43), (0, 44), (1, 44), (5, 44), (0, 45), (1, 45)]);
    // One sector: the same children as a striped block of one sector.
    let g = geometry(5, 2);
    assert_eq!(columns(&copies(g, 7 * K4, K4)), columns(&g.map(7 * K4, K4)));
    // Sizes: (s - 1) * W + P + 1 sectors, rounded up to a multiple of P + 1.
    let sizes = |g: RaidzGeometry| -> Vec<u64> {
        (1..=4).map(|s| g.asize_in(RaidzLayout::Copies, s * K4) / K4).collect()
    };
    assert_eq!(sizes(geometry(4, 1)), [2, 6, 10, 14]);
    assert_eq!(sizes(geometry(6, 2)), [3, 9, 15, 21]);
    assert_eq!(sizes(geometry(5, 3)), [4, 12, 16, 20]);
    assert_eq!(
        geometry(4, 1).asize_in(RaidzLayout::Striped, 8 << 10),
        geometry(4, 1).asize(8 << 10)
    );
    // The layout is part of the geometry a vdev is opened with; striped unless said.
    assert_eq!(geometry(4, 1).log_layout(), RaidzLayout::Striped);
    assert_eq!(
        geometry(4, 1).with_log_layout(RaidzLayout::Copies).log_layout(),
        RaidzLayout::Copies
    );
}

#[test]
fn golden_sizes() {
    // Sectors allocated for blocks of 1 to 10 sectors.
    let table = [
        ((5, 1), [2, 4, 4, 6, 8, 8, 10, 10, 12, 14]),
        ((6, 2), [3, 6, 6, 6, 9, 12, 12, 12, 15, 18]),
        ((5, 2), [3, 6, 6, 9, 9, 12, 15, 15, 15, 18]),
        ((8, 3), [4, 8, 8, 8, 8, 12, 16, 16, 16, 16]),
    ];
    for ((width, parity), want) in table {
        let g = geometry(width, parity);
        let got: Vec<u64> = (1..=10).map(|s| g.asize(s * K4) / K4).collect();
        assert_eq!(got, want, "raidz{parity} of {width}");
    }
    // What a block size costs: data over allocation, in percent.
    let share = |g: RaidzGeometry, psize: u64| psize * 100 / g.asize(psize);
    let z1 = geometry(4, 1);
    assert_eq!([4, 8, 16, 64, 1024].map(|k| share(z1, k << 10)), [50, 50, 66, 72, 74]);
    let z2 = geometry(6, 2);
    assert_eq!([4, 16, 1024].map(|k| share(z2, k << 10)), [33, 66, 66]);
    // Pull request 17490's cases: a last row holding only pads carries no parity.
    assert_eq!(geometry(5, 2).max_psize(6 * K4), 3 * K4);
    assert_eq!(geometry(4, 2).max_psize(9 * K4), 4 * K4);
    assert_eq!(geometry(5, 2).max_psize(21 * K4), 12 * K4);
}

#[test]
fn geometry_limits() {
    assert_eq!(RaidzGeometry::new(3, 2, 12), Err(RaidzError::Width { width: 3, parity: 2 }));
    assert_eq!(RaidzGeometry::new(5, 4, 12), Err(RaidzError::Parity { parity: 4 }));
    assert_eq!(RaidzGeometry::new(5, 0, 12), Err(RaidzError::Parity { parity: 0 }));
    assert!(RaidzGeometry::new(3, 1, 12).is_ok());
    assert!(RaidzGeometry::new(64, 3, 12).is_ok());
    assert!(RaidzGeometry::new(65, 3, 12).is_err());
}

/// A small deterministic generator: the tests need varied bytes and offsets, not a crate.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }

    fn bytes(&mut self, len: usize) -> Vec<u8> {
        (0..len).map(|_| self.next() as u8).collect()
    }
}

/// Every width from 3 to 16 and parity from 1 to 3 it allows.
fn geometries(ashift: u32) -> impl Iterator<Item = RaidzGeometry> {
    (1..=3u32).flat_map(move |p| {
        (p + 2..=16).map(move |w| RaidzGeometry::new(w, p, ashift).expect("a valid geometry"))
    })
}

/// In either layout, a block's columns and pads tile its allocation exactly, each column one
/// run on its child. A striped block has at most `parity` pads; a block laid out as copies has
/// `parity + 1` columns, and a shorter one at the same offset is its prefix (a log block is
/// written only as far as it is filled).
#[test]
fn every_map_covers_its_allocation_exactly() {
    let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
    for layout in [RaidzLayout::Striped, RaidzLayout::Copies] {
        for g in geometries(12) {
            let w = u64::from(g.width());
            for sectors in 1..=80u64 {
                // Offsets in even and odd MiB (the raidz1 swap), at every starting child.
                for _ in 0..4 {
                    let first = rng.next() % (1 << 20);
                    let map = g.map_in(layout, first * K4, sectors * K4 - rng.next() % K4);
                    assert_eq!(map.data_bytes(), sectors * K4);
                    let mut cells: Vec<(u32, u64)> = map
                        .columns
                        .iter()
                        .flat_map(|c| (0..c.size / K4).map(move |k| (c.child, c.offset / K4 + k)))
                        .chain(pads(&map))
                        .collect();
                    cells.sort_unstable();
                    let allocated = g.asize_in(layout, sectors * K4) / K4;
                    let mut want: Vec<(u32, u64)> =
                        (first..first + allocated).map(|i| ((i % w) as u32, i / w)).collect();
                    want.sort_unstable();
                    let what = format!("{g:?} {layout:?}: {sectors} sectors at sector {first}");
                    assert_eq!(cells, want, "{what}");
                    assert_eq!(map.parity, g.parity() as usize, "{what}");
                    match layout {
                        RaidzLayout::Striped => {
                            assert!(map.pads.len() <= g.parity() as usize, "{what}")
                        }
                        RaidzLayout::Copies => {
                            assert_eq!(map.columns.len(), g.parity() as usize + 1, "{what}");
                            let shorter = g.map_in(layout, first * K4, K4);
                            for (long, short) in map.columns.iter().zip(&shorter.columns) {
                                assert_eq!((long.child, long.offset), (short.child, short.offset));
                            }
                        }
                    }
                }
            }
        }
    }
}

#[test]
fn the_size_inverse_is_exact() {
    for g in geometries(9) {
        let unit = 512;
        for sectors in 1..=400u64 {
            let asize = g.asize(sectors * unit);
            assert!(g.max_psize(asize) >= sectors * unit, "{g:?}: {sectors} sectors");
        }
        for a in 0..=400u64 {
            let psize = g.max_psize(a * unit);
            if psize > 0 {
                assert!(g.asize(psize) <= a * unit, "{g:?}: {a} sectors");
            }
            assert!(g.asize(psize + unit) > a * unit, "{g:?}: {a} sectors, not the largest");
        }
    }
}

#[test]
fn field_tables() {
    assert_eq!(
        gf::EXP[..16],
        [1, 2, 4, 8, 16, 32, 64, 128, 0x1d, 0x3a, 0x74, 0xe8, 0xcd, 0x87, 0x13, 0x26]
    );
    assert_eq!(gf::EXP[255], 1);
    assert_eq!((gf::LOG[1], gf::LOG[2], gf::LOG[3], gf::LOG[0x1d]), (0, 1, 0x19, 8));
    for a in 1..=255u8 {
        assert_eq!(gf::mul(a, gf::inv(a)), 1);
        assert_eq!(gf::mul2(a), gf::mul(2, a));
        assert_eq!(gf::mul4(a), gf::mul(4, a));
    }
}

#[test]
fn golden_parity() {
    let parity_of = |data: &[&[u8]], p: usize| {
        let len = data.iter().map(|d| d.len()).max().unwrap_or(0);
        let mut out = vec![vec![0u8; len]; p];
        let mut refs: Vec<&mut [u8]> = out.iter_mut().map(|v| &mut v[..]).collect();
        generate_parity(data, &mut refs);
        out
    };
    // P = xor, Q = 4*D0 ^ 2*D1 ^ D2, R = 16*D0 ^ 4*D1 ^ D2.
    assert_eq!(parity_of(&[&[0x80], &[0x40], &[0x01]], 3), [[0xc1], [0xbb], [0xf4]]);
    // A short column counts as zeros in its last row.
    let short = parity_of(&[&[0, 0x12], &[0, 0x34], &[0]], 3);
    assert_eq!((short[0][1], short[1][1], short[2][1]), (0x26, 0x20, 0xed));
    // Q counts the columns the block has, not the vdev's width: 2*D0 ^ D1.
    assert_eq!(parity_of(&[&[0x80], &[0x40]], 2)[1], [0x5d]);
}

#[test]
fn horner_matches_the_sums() {
    let mut rng = Rng(7);
    for n in 1..=14usize {
        let data: Vec<Vec<u8>> = (0..n).map(|i| rng.bytes(64 - i % 3)).collect();
        let refs: Vec<&[u8]> = data.iter().map(|d| &d[..]).collect();
        let mut out = vec![vec![0u8; 64]; 3];
        let mut outs: Vec<&mut [u8]> = out.iter_mut().map(|v| &mut v[..]).collect();
        generate_parity(&refs, &mut outs);
        for (j, parity) in out.iter().enumerate() {
            for (k, &byte) in parity.iter().enumerate() {
                let sum = data.iter().enumerate().fold(0u8, |acc, (i, d)| {
                    let coefficient = gf::pow2((j * (n - 1 - i)) as u32);
                    acc ^ gf::mul(coefficient, d.get(k).copied().unwrap_or(0))
                });
                assert_eq!(byte, sum, "parity {j}, {n} columns, byte {k}");
            }
        }
    }
}

/// Every parity path this CPU runs, against the byte-at-a-time reference.
#[test]
fn every_parity_path_matches_the_reference_bit_for_bit() {
    let paths: Vec<ParityPath> =
        [ParityPath::Portable, ParityPath::Avx2].into_iter().filter(|p| p.available()).collect();
    let mut rng = Rng(0xfeed);
    for n in 1..=16usize {
        for longest in [1usize, 7, 8, 9, 31, 32, 33, 63, 4096, 4096 + 13] {
            // The first columns are the long ones, as in a map; the others up to 9 bytes
            // shorter, or as long.
            let data: Vec<Vec<u8>> = (0..n)
                .map(|i| {
                    let short = if i < n / 2 { 0 } else { (rng.next() % 10) as usize };
                    rng.bytes(longest.saturating_sub(short).max(1))
                })
                .collect();
            let refs: Vec<&[u8]> = data.iter().map(|d| &d[..]).collect();
            let len = refs.iter().map(|d| d.len()).max().unwrap_or(0);
            let mut want = vec![vec![0u8; len]; 3];
            let mut r: Vec<&mut [u8]> = want.iter_mut().map(|v| &mut v[..]).collect();
            reference::generate_parity(&refs, &mut r);
            for &path in &paths {
                let mut got = vec![vec![0xa5u8; len]; 3];
                let mut f: Vec<&mut [u8]> = got.iter_mut().map(|v| &mut v[..]).collect();
                generate_parity_with(path, &refs, &mut f);
                assert!(got == want, "{path:?}: {n} columns, longest {longest}");
            }
        }
    }
    // What this machine checked: the AVX2 path too wherever the CPU has it.
    assert_eq!(paths.contains(&ParityPath::Avx2), ParityPath::detect() == ParityPath::Avx2);
    println!("parity paths checked: {paths:?}");
}

/// A map's columns filled: random data, its parity computed.
fn stripe(map: &RaidzMap, rng: &mut Rng) -> Vec<Vec<u8>> {
    let data = rng.bytes(map.data_bytes() as usize);
    let mut columns: Vec<Vec<u8>> =
        map.columns.iter().map(|c| vec![0u8; c.size as usize]).collect();
    for (column, range) in columns[map.parity..].iter_mut().zip(map.data_ranges()) {
        column.copy_from_slice(&data[range]);
    }
    let (parity, data) = columns.split_at_mut(map.parity);
    let data: Vec<&[u8]> = data.iter().map(|c| &c[..]).collect();
    let mut parity: Vec<&mut [u8]> = parity.iter_mut().map(|c| &mut c[..]).collect();
    generate_parity(&data, &mut parity);
    columns
}

/// Every combination of `k` of `n` indices.
fn combinations(n: usize, k: usize) -> Vec<Vec<usize>> {
    if k == 0 {
        return vec![Vec::new()];
    }
    (k - 1..n)
        .flat_map(|last| {
            combinations(last, k - 1).into_iter().map(move |mut c| {
                c.push(last);
                c
            })
        })
        .collect()
}

#[test]
fn every_combination_of_lost_columns_is_rebuilt() {
    let mut rng = Rng(0x5eed);
    let mut rebuilt = 0u64;
    for g in geometries(9) {
        let data_width = u64::from(g.width() - g.parity());
        // One sector, a part of a row, a row, a row and one, many rows with short columns.
        for sectors in [1, 2, data_width, data_width + 1, 3 * data_width + 2, 7 * data_width] {
            let offset = (rng.next() % (1 << 13)) * 512;
            let layouts = [RaidzLayout::Striped, RaidzLayout::Copies];
            for map in layouts.map(|layout| g.map_in(layout, offset, sectors * 512)) {
                let whole = stripe(&map, &mut rng);
                if map.data_columns().len() == 1 {
                    // P, Q and R of one data column are that column.
                    assert!(whole.iter().all(|c| c == &whole[map.parity]), "{g:?}: {map:?}");
                }
                for k in 1..=map.parity {
                    for lost in combinations(map.columns.len(), k) {
                        let mut columns = whole.clone();
                        for &c in &lost {
                            columns[c].fill(0xa5);
                        }
                        let mut refs: Vec<&mut [u8]> =
                            columns.iter_mut().map(|c| &mut c[..]).collect();
                        reconstruct(&mut refs, map.parity, &lost)
                            .expect("at most parity columns lost");
                        assert!(columns == whole, "{g:?}: {sectors} sectors, lost {lost:?}");
                        rebuilt += 1;
                    }
                }
            }
        }
    }
    assert!(rebuilt > 10_000, "{rebuilt} rebuilds");
}

#[test]
fn more_lost_columns_than_parity_are_refused_and_a_lie_is_not_hidden() {
    let mut rng = Rng(11);
    let g = RaidzGeometry::new(6, 2, 9).expect("a valid geometry");
    let map = g.map(0, 16 * 512);
    let whole = stripe(&map, &mut rng);
    let mut columns = whole.clone();
    let mut refs: Vec<&mut [u8]> = columns.iter_mut().map(|c| &mut c[..]).collect();
    assert_eq!(
        reconstruct(&mut refs, 2, &[0, 2, 3]),
        Err(RaidzError::TooManyLost { lost: 3, parity: 2 })
    );
    // A surviving column that is wrong but not named lost spoils the rebuild: the rebuild
    // trusts the columns it is given, and the caller's checksum must catch the result.
    let mut columns = whole.clone();
    columns[3].fill(0);
    columns[4][0] ^= 1;
    let mut refs: Vec<&mut [u8]> = columns.iter_mut().map(|c| &mut c[..]).collect();
    reconstruct(&mut refs, 2, &[3]).expect("one column lost");
    assert_ne!(columns[3], whole[3]);
}

/// The cost table in docs/raidz.md (bytes allocated per byte stored, 4 KiB sectors), checked
/// against the layout function it was made from.
#[test]
fn the_documented_cost_table_holds() {
    let sizes = [4u64 << 10, 8 << 10, 16 << 10, 32 << 10, 64 << 10, 128 << 10, 1 << 20];
    let rows: [(u32, u32, [f64; 7]); 13] = [
        (3, 1, [2.00, 2.00, 1.50, 1.50, 1.50, 1.50, 1.50]),
        (4, 1, [2.00, 2.00, 1.50, 1.50, 1.38, 1.38, 1.34]),
        (5, 1, [2.00, 2.00, 1.50, 1.25, 1.25, 1.25, 1.25]),
        (6, 1, [2.00, 2.00, 1.50, 1.25, 1.25, 1.25, 1.20]),
        (8, 1, [2.00, 2.00, 1.50, 1.25, 1.25, 1.19, 1.15]),
        (4, 2, [3.00, 3.00, 2.25, 2.25, 2.06, 2.06, 2.00]),
        (5, 2, [3.00, 3.00, 2.25, 1.88, 1.88, 1.69, 1.68]),
        (6, 2, [3.00, 3.00, 1.50, 1.50, 1.50, 1.50, 1.50]),
        (8, 2, [3.00, 3.00, 1.50, 1.50, 1.50, 1.41, 1.34]),
        (10, 2, [3.00, 3.00, 1.50, 1.50, 1.31, 1.31, 1.25]),
        (6, 3, [4.00, 4.00, 3.00, 2.50, 2.25, 2.12, 2.02]),
        (8, 3, [4.00, 4.00, 2.00, 2.00, 1.75, 1.75, 1.61]),
        (12, 3, [4.00, 4.00, 2.00, 1.50, 1.50, 1.38, 1.34]),
    ];
    for (width, parity, costs) in rows {
        let geometry = RaidzGeometry::new(width, parity, 12).expect("a valid shape");
        for (size, cost) in sizes.iter().zip(costs) {
            let ratio = geometry.asize(*size) as f64 / *size as f64;
            assert!(
                (ratio - cost).abs() < 0.006,
                "raidz{parity} of {width}, {size} bytes: {ratio:.3}, the table says {cost}"
            );
        }
    }
}
