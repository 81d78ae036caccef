//! Unit tests of the allocator: placement (stripes, ditto copies, the log region), deferred
//! frees, slop and space maps.

use proptest::prelude::*;

use super::*;

const MIB: u64 = 1 << 20;

/// Fills `a` with 16 KiB blocks (the slop too); returns them in offset order.
fn fill_with_blocks(a: &mut Allocator) -> Vec<Place> {
    let mut blocks = Vec::new();
    while let Ok(block) = a.allocate(16384, AllocClass::Reserved, &[]) {
        blocks.push(block);
    }
    blocks.sort_by_key(|b| b.1);
    blocks
}

fn allocator() -> Allocator {
    Allocator::new(12, &[(4 * MIB, 68 * MIB), (4 * MIB, 68 * MIB)])
}

/// `allocated_total` counts what txgs' blocks take (plain and ditto allocations), not log
/// blocks nor blocks placed in place for the log, which admission counts apart.
#[test]
fn allocated_total_counts_txg_blocks_only() {
    let mut a = allocator();
    let (vdev, at, len) = a.allocate(4096, AllocClass::Normal, &[]).unwrap();
    assert_eq!((a.allocated_total(), len), (4096, 4096));
    a.allocate_ditto(16384, AllocClass::Reserved, &[(vdev, at)]).unwrap();
    assert_eq!(a.allocated_total(), 4096 + 16384);
    a.allocate_indirect(128 << 10).unwrap();
    a.allocate_log(64 << 10).unwrap();
    let free = a.free_bytes();
    a.claim_log(0, 40 * MIB, 8192).unwrap();
    assert_eq!(a.free_bytes(), free - 8192);
    assert_eq!(a.allocated_total(), 4096 + 16384);
}

/// Log blocks go to the log region at the start of each data area and data after it, so
/// the region pool creation wrote is where the log writes; a full region spills.
#[test]
fn log_blocks_use_the_log_region() {
    let mut a = allocator();
    let region = log_region_bytes(64 * MIB);
    assert_eq!(region, 8 * MIB);
    let (data_vdev, data_at, _) = a.allocate(64 << 10, AllocClass::Normal, &[]).unwrap();
    assert!(data_at >= 4 * MIB + region, "data at {data_at} is inside the log region");
    let (mut log_blocks, mut asked) = (0u64, 0);
    loop {
        let (vdev, at, len) = a.allocate_log(128 << 10).unwrap();
        if at >= 4 * MIB + region {
            break;
        }
        assert!(at + len <= 4 * MIB + region, "log block crosses the region's end");
        log_blocks += 1;
        asked += u32::from(a.log_region_pressed(vdev));
    }
    // Nothing synced meanwhile: the filling regions asked for a sync once.
    assert_eq!(asked, 1);
    // Both vdevs' regions were used before a block spilled.
    assert_eq!(log_blocks, 2 * region / (128 << 10));
    // Live log blocks are free in the space map, joined to the free space around them, and
    // the count the sync sizes the map's pieces by is the map's.
    a.free(1, data_vdev, data_at, 64 << 10);
    for vdev in 0..2 {
        let map = a.space_map(vdev);
        let mut joined = map.free.clone();
        joined.dedup_by(|next, prev| prev.0 + prev.1 == next.0);
        assert_eq!(joined.len(), map.free.len(), "adjacent free ranges are joined");
        assert_eq!(a.space_map_entries(vdev), (map.free.len(), map.deferred.len()));
    }
    assert_eq!(a.space_map(data_vdev).deferred.len(), 1);
}

/// A one-vdev allocator (64 MiB data area) whose space after the log region is all taken
/// by 1 MiB blocks, in order; with the region's end and those blocks.
fn filled_after_the_log_region() -> (Allocator, u64, Vec<(u32, u64, u64)>) {
    let mut a = Allocator::new(12, &[(4 * MIB, 68 * MIB)]);
    let region_end = 4 * MIB + log_region_bytes(64 * MIB);
    let blocks = (0..(68 * MIB - region_end) / MIB)
        .map(|_| a.allocate(MIB, AllocClass::Reserved, &[]).unwrap())
        .collect();
    (a, region_end, blocks)
}

/// Data's cursor wraps to the log region's end, not into the region: space freed after the
/// region is reused first, and data takes the region only once nothing after it fits.
#[test]
fn data_wraps_past_the_log_region() {
    let (mut a, region_end, blocks) = filled_after_the_log_region();
    assert!(blocks.iter().all(|b| b.1 >= region_end), "data starts after the region");
    let b = a.allocate(MIB, AllocClass::Reserved, &[]).unwrap();
    assert!(b.1 < region_end, "the space after the region is full: data takes the region");
    // The cursor is now in the region. A plain next fit went on from there (the region
    // had room); data goes back past the region's end.
    a.free(1, 0, b.1, b.2);
    for &(vdev, start, len) in &blocks[..4] {
        a.free(1, vdev, start, len);
    }
    for txg in 1..=(1 + FREE_DEFER_TXGS) {
        a.synced(txg);
    }
    for &(_, start, _) in &blocks[..4] {
        let (_, at, _) = a.allocate(MIB, AllocClass::Reserved, &[]).unwrap();
        assert_eq!(at, start, "space freed after the region is reused before the region");
    }
    let (_, at, _) = a.allocate(MIB, AllocClass::Reserved, &[]).unwrap();
    assert!(at < region_end, "with the rest full, data goes into the region");
}

/// A metadata block's second copy on the same vdev (a one-vdev pool) also stays out of the
/// log region while space after it is far enough from the first copy.
#[test]
fn ditto_copies_stay_out_of_the_log_region() {
    let (mut a, region_end, blocks) = filled_after_the_log_region();
    let (vdev, start, len) = blocks[0];
    a.free(1, vdev, start, len);
    for txg in 1..=(1 + FREE_DEFER_TXGS) {
        a.synced(txg);
    }
    // The copy's cursor starts mid-area, where nothing is free: a plain next fit from it
    // wrapped into the region, which is far from the first copy too.
    let (_, at, _) = a.allocate_ditto(16 << 10, AllocClass::Reserved, &[(0, 67 * MIB)]).unwrap();
    assert_eq!(at, region_end, "the copy goes to the free space after the region");
}

/// The store is asked for a sync once log blocks (live or deferred) hold more than three
/// quarters of a log region, once per synced txg; blocks placed in place for indirect
/// records (data space, outside the region) do not count, and the freed blocks count
/// until their deferral ends.
#[test]
fn a_filling_log_region_asks_for_a_sync_once_per_txg() {
    let mut a = Allocator::new(12, &[(4 * MIB, 132 * MIB)]);
    let region = log_region_bytes(128 * MIB);
    assert_eq!(region, 16 * MIB);
    // Indirect placements, however many, are not log-region pressure.
    for _ in 0..200 {
        a.allocate_indirect(128 << 10).unwrap();
        assert!(!a.log_region_pressed(0));
    }
    let mut blocks = Vec::new();
    let mut asked = 0;
    while blocks.len() * (128 << 10) < region as usize - (128 << 10) {
        let (vdev, at, len) = a.allocate_log(128 << 10).unwrap();
        assert!(at + len <= 4 * MIB + region);
        blocks.push((at, len));
        let held = blocks.len() as u64 * (128 << 10);
        let pressed = a.log_region_pressed(vdev);
        if pressed {
            asked += 1;
            assert!(held > region / 4 * 3, "asked at {held} of {region}");
        }
        if held > region / 4 * 3 + (128 << 10) {
            assert!(!pressed, "asked again in the same txg");
        }
    }
    assert_eq!(asked, 1);
    // Freed in txg 1, the blocks still hold the region until txg 3 has synced; a new
    // synced txg lets the allocator ask again while they do.
    for &(at, len) in &blocks {
        a.free_log(1, 0, at, len);
    }
    a.synced(1);
    assert!(a.log_region_pressed(0), "deferred blocks still fill the region");
    assert!(!a.log_region_pressed(0));
    a.synced(2);
    a.synced(3);
    assert!(!a.log_region_pressed(0), "the region is free again");
}

/// Sequential allocations are contiguous and rotate over vdevs every aliquot.
#[test]
fn allocations_stripe_in_aliquots() {
    let mut a = allocator();
    let mut placements = Vec::new();
    for _ in 0..64 {
        placements.push(a.allocate(64 << 10, AllocClass::Normal, &[]).unwrap());
    }
    // Data starts after the log region.
    let base = 4 * MIB + log_region_bytes(64 * MIB);
    assert_eq!(placements[0], (0, base, 64 << 10));
    assert_eq!(placements[1], (0, base + (64 << 10), 64 << 10));
    assert_eq!(placements[16].0, 1, "after 1 MiB the rotor moves to vdev 1");
    assert_eq!(placements[32].0, 0);
    // Copies avoid the vdev of the first copy.
    let (vdev, _, _) = a.allocate(4096, AllocClass::Normal, &[0]).unwrap();
    assert_eq!(vdev, 1);
}

/// Extra copies of metadata: on another vdev when there is one; on a lone vdev at least
/// an eighth of the data area from every other copy, and those of blocks placed one after
/// another lie back to back; a full vdev refuses rather than placing them close.
#[test]
fn ditto_copies_land_apart() {
    let mut a = allocator();
    let (v, at, _) = a.allocate(16 << 10, AllocClass::Reserved, &[]).unwrap();
    let (v2, _, _) = a.allocate_ditto(16 << 10, AllocClass::Reserved, &[(v, at)]).unwrap();
    assert_ne!(v, v2, "another vdev first");

    let mut one = Allocator::new(12, &[(4 * MIB, 68 * MIB)]);
    let area = 64 * MIB - log_region_bytes(64 * MIB);
    let mut last_ditto = None;
    for _ in 0..16 {
        let (v, at, len) = one.allocate(16 << 10, AllocClass::Reserved, &[]).unwrap();
        let (v2, d, _) = one.allocate_ditto(16 << 10, AllocClass::Reserved, &[(v, at)]).unwrap();
        assert_eq!(v2, 0);
        assert!(d.abs_diff(at) >= area / 8, "copies {at} and {d} too close");
        if let Some(prev) = last_ditto {
            assert_eq!(d, prev, "ditto copies follow their own cursor");
        }
        last_ditto = Some(d + len);
    }
    let (v, at, _) = one.allocate(16 << 10, AllocClass::Reserved, &[]).unwrap();
    let (_, d, _) = one.allocate_ditto(16 << 10, AllocClass::Reserved, &[(v, at)]).unwrap();
    let (_, third, _) =
        one.allocate_ditto(16 << 10, AllocClass::Reserved, &[(v, at), (v, d)]).unwrap();
    assert!(third.abs_diff(at) >= area / 8 && third.abs_diff(d) >= area / 8);
    // Nearly everything far from the first copy taken: refused, not placed close.
    let mut tight = Allocator::new(12, &[(4 * MIB, 68 * MIB)]);
    let (_, at, _) = tight.allocate(16 << 10, AllocClass::Reserved, &[]).unwrap();
    let region_end = 4 * MIB + log_region_bytes(64 * MIB);
    let keep = (at + (16 << 10), area / 8);
    let mut free = RangeTree::default();
    free.insert(keep.0, keep.1 - (16 << 10));
    tight.vdevs[0].free = free;
    assert!(tight.allocate_ditto(16 << 10, AllocClass::Reserved, &[(0, at)]).is_err());
    assert!(region_end <= at);
}

/// Freed space is not reused before the freeing txg plus the deferral has synced.
#[test]
fn frees_are_deferred() {
    let mut a = Allocator::new(12, &[(0, 64 * 4096)]);
    let slop = a.slop_bytes();
    let mut blocks = Vec::new();
    while let Ok(b) = a.allocate(4096, AllocClass::Reserved, &[]) {
        blocks.push(b);
    }
    assert_eq!(a.free_bytes(), 0);
    let (vdev, start, len) = blocks[3];
    a.free(5, vdev, start, len);
    for txg in 0..(5 + FREE_DEFER_TXGS) {
        a.synced(txg);
        assert_eq!(a.free_bytes(), 0, "reused after txg {txg} only");
    }
    a.synced(5 + FREE_DEFER_TXGS);
    assert_eq!(a.free_bytes(), 4096);
    assert!(slop > 0);
}

/// Blocks freed back to back in one txg are one deferred free (one space-map entry, one
/// insert into the free tree when the deferral ends); a gap or another txg starts another.
#[test]
fn frees_back_to_back_are_joined() {
    let mut a = Allocator::new(12, &[(0, 64 * 4096)]);
    let free = a.free_bytes();
    let blocks: Vec<(u32, u64, u64)> =
        (0..6).map(|_| a.allocate(4096, AllocClass::Reserved, &[]).unwrap()).collect();
    assert!(blocks.windows(2).all(|w| w[0].1 + w[0].2 == w[1].1), "placed back to back");
    for &(vdev, start, len) in &blocks[..3] {
        a.free(1, vdev, start, len);
    }
    // Block 3 stays allocated: block 4 starts another entry, and block 5 joins it.
    for &(vdev, start, len) in &blocks[4..] {
        a.free(1, vdev, start, len);
    }
    assert_eq!(a.space_map_entries(0).1, 2);
    assert_eq!(a.space_map_entries_bound(0).1, 2);
    let (vdev, start, len) = blocks[3];
    a.free(2, vdev, start, len);
    assert_eq!(a.space_map_entries(0).1, 3, "a later txg's free is its own");
    assert_eq!(a.deferred_bytes(), 6 * 4096);
    for txg in 1..=2 + FREE_DEFER_TXGS {
        a.synced(txg);
    }
    assert_eq!((a.free_bytes(), a.deferred_bytes()), (free, 0));
    assert_eq!(a.space_map_entries(0), (1, 0), "the whole area is one free range again");
}

/// A scan's queued blocks do not hold their frees back: a block freed before its turn leaves
/// the queue and its space comes back with the deferral, and the scan is then told not to
/// read it. Only a block whose read is in flight keeps its space, until a sync after the read
/// ends (the rest of a joined free is released around it); a pin (held while the scan walks a
/// tree) still holds every later free.
#[test]
fn a_scan_holds_back_only_the_blocks_it_is_reading() {
    let mut a = Allocator::new(12, &[(0, 64 * 4096)]);
    let blocks: Vec<(u32, u64, u64)> =
        (0..4).map(|_| a.allocate(4096, AllocClass::Reserved, &[]).unwrap()).collect();
    a.pin(0);
    a.scan_queue(blocks.iter().copied());
    a.unpin(0);
    let free = a.free_bytes();
    // Block 0 is being read; blocks 1 and 2 are freed while queued and while read.
    assert!(a.scan_issue(&blocks[0..1]));
    for &(vdev, start, len) in &blocks[..3] {
        a.free(1, vdev, start, len);
    }
    assert!(a.scan_issue(&blocks[2..3]));
    for txg in 1..=1 + FREE_DEFER_TXGS {
        a.synced(txg);
    }
    // Block 1 was only queued: free again, and the scan skips it. Blocks 0 and 2 are held.
    assert_eq!(a.free_bytes(), free + 4096);
    assert!(!a.scan_issue(&blocks[1..2]), "a freed block is not read");
    assert_eq!(a.deferred_bytes(), 2 * 4096);
    // The three frees were joined into one; what stays is two entries, blocks 0 and 2.
    assert_eq!(a.space_map_entries(0).1, 2);
    assert_eq!(a.space_map_entries_bound(0).1, 2);
    a.scan_done(&blocks[0..1]);
    a.scan_done(&blocks[2..3]);
    a.synced(2 + FREE_DEFER_TXGS);
    assert_eq!(a.free_bytes(), free + 3 * 4096);
    assert_eq!(a.deferred_bytes(), 0);
    // Block 3, never freed, is still read; at the chunk's end nothing stays queued.
    assert!(a.scan_issue(&blocks[3..4]));
    a.scan_done(&blocks[3..4]);
    a.scan_clear();
    assert_eq!(a.scan_bytes(), (0, 0));
    // A pin holds every later free, queued or not.
    let (vdev, start, len) = blocks[3];
    a.pin(2 + FREE_DEFER_TXGS);
    a.free(3 + FREE_DEFER_TXGS, vdev, start, len);
    for txg in 3 + FREE_DEFER_TXGS..=3 + 2 * FREE_DEFER_TXGS {
        a.synced(txg);
    }
    assert_eq!(a.deferred_bytes(), 4096);
    a.unpin(2 + FREE_DEFER_TXGS);
    a.synced(4 + 2 * FREE_DEFER_TXGS);
    assert_eq!(a.deferred_bytes(), 0);
}

/// The tiers leave less of the slop from the first to stop to the last, and a log block
/// (not a chain's head) stops at its tier's floor.
#[test]
fn slop_tiers_stop_in_order() {
    let slop = 1 << 20;
    let kept: Vec<u64> =
        [SlopTier::Normal, SlopTier::Thick, SlopTier::Freeing].map(|t| t.kept(slop)).to_vec();
    assert!(kept.windows(2).all(|w| w[0] > w[1]) && kept[2] > 0, "{kept:?}");
    let mut a = Allocator::new(12, &[(0, 8 * MIB)]);
    while a.allocate(4096, AllocClass::Reserved, &[]).is_ok() {
        if a.free_bytes() <= SlopTier::Freeing.kept(a.slop_bytes()) + 4096 {
            break;
        }
    }
    assert!(a.allocate_log_block(8192, None).is_err(), "a log block below its floor");
    a.allocate_log(8192).expect("a chain's head may use the rest");
}

/// Ordinary allocations stop at the slop reserve; reserved ones may use it; the error says
/// what to do.
#[test]
fn slop_is_kept_for_reserved_work() {
    let mut a = Allocator::new(12, &[(0, 8 * MIB)]);
    while a.allocate(64 << 10, AllocClass::Normal, &[]).is_ok() {}
    assert!(a.free_bytes() >= a.slop_bytes() - (64 << 10));
    let error = a.allocate(4096, AllocClass::Normal, &[]).unwrap_err();
    assert!(matches!(error, AllocError::NoSpace { .. }));
    assert!(error.to_string().contains("trimming"));
    a.allocate(4096, AllocClass::Reserved, &[]).unwrap();
}

/// The space map round-trips through the on-disk encoding and restores the same state;
/// a map whose ranges overlap is refused with the vdev named.
#[test]
fn space_maps_persist_and_validate() {
    let mut a = allocator();
    for i in 0..40u64 {
        let (vdev, start, len) = a.allocate(12288, AllocClass::Normal, &[]).unwrap();
        if i % 3 == 0 {
            a.free(2 + i / 10, vdev, start, len);
        }
    }
    // Kept: the free space above it starts just past an allocated block.
    a.allocate(12288, AllocClass::Normal, &[]).unwrap();
    a.synced(3);
    let maps: Vec<_> = (0..2)
        .map(|v| {
            let bytes = a.space_map(v).encode().unwrap();
            (SpaceMap::decode(&bytes).unwrap(), (4 * MIB, 68 * MIB))
        })
        .collect();
    let b = Allocator::load(12, &maps).unwrap();
    assert_eq!(b.free_bytes(), a.free_bytes());
    assert_eq!(b.deferred_bytes(), a.deferred_bytes());
    let mut bad = maps.clone();
    let inside_free = bad[1].0.free[0].0;
    bad[1].0.deferred.push((9, inside_free, 4096));
    let error = Allocator::load(12, &bad).unwrap_err();
    assert!(matches!(error, AllocError::Corrupt { vdev: 1, .. }), "{error}");
    // A deferred free that reaches into free space past its first byte (a joined free is
    // long) is refused too, not released into the free tree a second time at its deferral's
    // end.
    let mut bad = maps.clone();
    // Free ranges are merged, so the sector below one that starts past the area's start is
    // not free: allocated where no deferred free holds it.
    let deferred = |at: u64| bad[0].0.deferred.iter().any(|&(_, s, l)| s <= at && at < s + l);
    let (free_start, _) = *bad[0]
        .0
        .free
        .iter()
        .find(|r| r.0 > 4 * MIB && !deferred(r.0 - 4096))
        .expect("a free range just above an allocated block");
    bad[0].0.deferred.push((9, free_start - 4096, 8192));
    let error = Allocator::load(12, &bad).unwrap_err();
    assert!(matches!(error, AllocError::Corrupt { vdev: 0, .. }), "{error}");
}

proptest! {
    /// The allocator never hands out a byte twice, whatever mix of allocations, frees and
    /// syncs, and free + allocated + deferred always add up to the capacity.
    #[test]
    fn never_allocates_twice(ops in proptest::collection::vec((0u8..3, 1u64..40_000, any::<prop::sample::Index>()), 1..300)) {
        let mut a = Allocator::new(12, &[(0, 2 * MIB), (0, 3 * MIB)]);
        let mut live: Vec<(u32, u64, u64)> = Vec::new();
        let mut txg = 1u64;
        for (op, size, pick) in ops {
            match op {
                0 => {
                    if let Ok(block) = a.allocate(size, AllocClass::Reserved, &[]) {
                        for &(v, s, l) in &live {
                            prop_assert!(v != block.0 || s + l <= block.1 || block.1 + block.2 <= s, "overlap");
                        }
                        live.push(block);
                    }
                }
                1 if !live.is_empty() => {
                    let (v, s, l) = live.swap_remove(pick.index(live.len()));
                    a.free(txg, v, s, l);
                }
                _ => {
                    a.synced(txg);
                    txg += 1;
                }
            }
            let live_bytes: u64 = live.iter().map(|b| b.2).sum();
            prop_assert_eq!(a.free_bytes() + a.deferred_bytes() + live_bytes, a.capacity_bytes());
            let listed: u64 = a.deferred.values().flatten().map(|&(_, _, len)| len).sum();
            prop_assert_eq!(a.deferred_bytes(), listed, "the running total matches the list");
        }
    }
}

/// A run of blocks goes back to back into one free range that holds it all, past the small
/// holes at the cursor that block-by-block placement fills one block each; with no range that
/// large, the caller places them one by one.
#[test]
fn a_run_takes_one_range_past_small_holes() {
    let mut a = Allocator::new(12, &[(4 * MIB, 68 * MIB)]);
    // The vdev full of 16 KiB blocks; then 16 KiB holes in the first 8 MiB after the log
    // region (every other block freed), and 2 MiB free at the end.
    let blocks = fill_with_blocks(&mut a);
    let data: Vec<_> =
        blocks.iter().filter(|b| b.1 >= 4 * MIB + log_region_bytes(64 * MIB)).collect();
    for &&(vdev, at, len) in data.iter().take(512).step_by(2) {
        a.free(1, vdev, at, len);
    }
    for &&(vdev, at, len) in data.iter().rev().take(128) {
        a.free(1, vdev, at, len);
    }
    a.synced(1 + FREE_DEFER_TXGS);
    let holes_end = data[511].1 + data[511].2;
    let mut fresh = a.clone();
    let run = a.allocate_run(&[16384u64; 64], AllocClass::Normal).unwrap();
    for pair in run.windows(2) {
        assert_eq!(pair[1].1, pair[0].1 + pair[0].2, "blocks back to back: {run:?}");
    }
    assert!(run[0].1 >= holes_end, "the run went into the holes at {}", run[0].1);
    // Block by block, each takes a hole.
    let one = fresh.allocate(16384, AllocClass::Normal, &[]).unwrap();
    assert!(one.1 < holes_end, "block by block went to {}", one.1);
    // No range holds a run of 4 MiB.
    assert!(fresh.allocate_run(&[16384u64; 256], AllocClass::Normal).is_none());
    assert!(fresh.allocate_run(&[16384], AllocClass::Normal).is_none(), "one block is no run");
}

/// A run that no free range holds goes into as few ranges as hold it: with every free range
/// 256 KiB long, a 1 MiB write's 64 blocks go out as four runs of 16 blocks, not 64 blocks
/// near the cursor. Placed as log blocks (for indirect records), they are held as log space
/// and do not count as the txg's.
#[test]
fn runs_no_range_holds_go_into_as_few_ranges_as_hold_them() {
    let mut a = Allocator::new(12, &[(4 * MIB, 68 * MIB)]);
    let region_end = 4 * MIB + log_region_bytes(64 * MIB);
    let blocks = fill_with_blocks(&mut a);
    let data: Vec<_> = blocks.iter().filter(|b| b.1 >= region_end).collect();
    // Sixteen blocks free, one kept, over and over: no free range is longer than 256 KiB.
    for (i, &&(vdev, at, len)) in data.iter().enumerate() {
        if i % 17 != 16 {
            a.free(1, vdev, at, len);
        }
    }
    a.synced(1 + FREE_DEFER_TXGS);
    let (allocated, free) = (a.allocated_total(), a.free_bytes());
    let placed = a.allocate_indirect_all(&[16384u64; 64], MIB).unwrap();
    assert_eq!(placed.len(), 64);
    let breaks = placed.windows(2).filter(|p| p[1].1 != p[0].1 + p[0].2).count();
    assert_eq!(breaks, 3, "four runs of 256 KiB: {placed:?}");
    assert_eq!(a.allocated_total(), allocated, "log space is not the txg's");
    assert_eq!(a.free_bytes(), free - MIB);
    assert_eq!(a.vdevs[0].log.total_bytes(), MIB, "held as log space");
    for &(vdev, at, len) in &placed {
        a.release_indirect(vdev, at, len);
    }
    assert_eq!((a.allocated_total(), a.free_bytes()), (allocated, free));
}

/// A span no free range holds takes the largest range, then the smallest that holds the
/// rest, and leaves the small holes near the cursor alone, where block by block would have
/// filled them: they are what merges with the blocks freed beside them later.
#[test]
fn a_span_takes_the_largest_ranges_and_leaves_the_small_holes() {
    let mut a = Allocator::new(12, &[(4 * MIB, 68 * MIB)]);
    let region_end = 4 * MIB + log_region_bytes(64 * MIB);
    let blocks = fill_with_blocks(&mut a);
    let data: Vec<_> = blocks.iter().filter(|b| b.1 >= region_end).copied().collect();
    let free_blocks = |a: &mut Allocator, range: std::ops::Range<usize>| {
        for &(vdev, at, len) in &data[range] {
            a.free(1, vdev, at, len);
        }
    };
    // The log region free (the vdev is not short of space, and the region's range then
    // reaches the first hole after it: only that hole's part of it counts), single holes
    // every other block over the first 2 MiB after the region (where the cursor is), then
    // ranges of 768, 384 and 256 KiB, each a block apart from the next.
    for &(vdev, at, len) in blocks.iter().filter(|b| b.1 < region_end) {
        a.free(1, vdev, at, len);
    }
    let holes: Vec<usize> = (0..128).step_by(2).collect();
    for &i in &holes {
        free_blocks(&mut a, i..i + 1);
    }
    let (r768, r384, r256) = (200..248, 249..273, 274..290);
    for range in [r768.clone(), r384.clone(), r256.clone()] {
        free_blocks(&mut a, range);
    }
    a.synced(1 + FREE_DEFER_TXGS);
    a.vdevs[0].cursor = data[0].1;
    let mut by_block = a.clone();
    let placed = a.allocate_span(&[16384u64; 64], AllocClass::Normal).unwrap();
    let starts: Vec<u64> = placed.iter().map(|p| p.1).collect();
    let expected: Vec<u64> = r768.chain(r256).map(|i| data[i].1).collect();
    assert_eq!(starts, expected, "the 768 KiB range, then the 256 KiB one that holds the rest");
    for &i in &holes {
        assert!(a.vdevs[0].free.contains(data[i].1, 16384), "hole {i} was taken");
    }
    assert!(a.vdevs[0].free.contains(data[249].1, 384 << 10), "the 384 KiB range was taken");
    // Block by block from the cursor, the same blocks would have gone into the holes.
    for i in [0, 2] {
        assert_eq!(by_block.allocate(16384, AllocClass::Normal, &[]).unwrap().1, data[i].1);
    }
}

/// All or none: blocks that do not all fit leave the allocator as it was, whether placed as
/// runs or one by one.
#[test]
fn runs_that_do_not_all_fit_give_back_what_they_placed() {
    let mut a = Allocator::new(12, &[(4 * MIB, 68 * MIB)]);
    let room = a.room_bytes();
    let (allocated, free) = (a.allocated_total(), a.free_bytes());
    let too_many = vec![16384u64; (room / 16384 + 1) as usize];
    assert!(a.allocate_runs(&too_many, AllocClass::Normal, MIB).is_err());
    assert_eq!((a.allocated_total(), a.free_bytes()), (allocated, free));
    assert!(a.allocate_indirect_all(&too_many, MIB).is_err());
    assert_eq!((a.allocated_total(), a.free_bytes()), (allocated, free));
    assert_eq!(a.vdevs[0].log.total_bytes(), 0);
}

/// A commit's blocks written in place leave what admission promised the syncs: refused, and
/// the allocator left as it was, where they and the promise would not both fit above the
/// slop; placed where they would, and the promise still there afterwards.
#[test]
fn blocks_in_place_leave_the_syncs_their_promise() {
    let mut a = Allocator::new(12, &[(4 * MIB, 68 * MIB)]);
    let (allocated, free) = (a.allocated_total(), a.free_bytes());
    let room = a.room_bytes_for(16384);
    let blocks = vec![16384u64; 128];
    // Promised all but 1 MiB of the room above the slop: 2 MiB of blocks do not fit beside it.
    a.promise(room - a.slop_bytes() - MIB);
    let promised = a.promised_bytes();
    assert!(a.allocate_indirect_promised(&blocks, MIB, 16384).is_err());
    assert_eq!((a.allocated_total(), a.free_bytes()), (allocated, free));
    assert_eq!(a.vdevs[0].log.total_bytes(), 0, "nothing held");
    // Without the promise the allocator alone would have placed them.
    assert!(a.room_bytes_for(16384) >= 2 * MIB + a.slop_bytes());
    // Promised 2 MiB less: they fit, and the promise is not spent by them.
    a.promise(room - a.slop_bytes() - 3 * MIB - 64 * 1024);
    let placed = a.allocate_indirect_promised(&blocks, MIB, 16384).unwrap();
    assert_eq!(placed.len(), 128);
    assert_eq!(a.promised_bytes(), promised - 2 * MIB - 64 * 1024);
    assert_eq!(a.free_bytes(), free - 2 * MIB);
}

/// A run is never placed in the log region: past it, with only small holes left, the run is
/// placed block by block, though the region is free.
#[test]
fn a_run_stays_out_of_the_log_region() {
    let mut a = Allocator::new(12, &[(4 * MIB, 68 * MIB)]);
    let region_end = 4 * MIB + log_region_bytes(64 * MIB);
    // Everything after the region in 16 KiB blocks, then every other one freed.
    let mut blocks = Vec::new();
    while let Ok(block) = a.allocate(16384, AllocClass::Reserved, &[]) {
        if block.1 < region_end {
            a.free(1, block.0, block.1, block.2);
            break;
        }
        blocks.push(block);
    }
    for &(vdev, at, len) in blocks.iter().step_by(2) {
        a.free(1, vdev, at, len);
    }
    a.synced(1 + FREE_DEFER_TXGS);
    assert!(a.vdevs[0].free.fits_from(MIB, 4096, 4 * MIB), "the region is free");
    assert!(a.allocate_run(&[16384u64; 64], AllocClass::Normal).is_none());
}

/// The deferral's end, a step at a time: each step makes `budget` frees allocatable, the last
/// says none is left, and the allocator ends as one `synced` leaves it, space maps and all.
/// Frees a scan is reading stay deferred without stalling the steps.
#[test]
fn synced_in_steps_ends_where_synced_in_one_does() {
    let build = || {
        let mut a = Allocator::new(12, &[(0, 256 * 4096)]);
        let blocks: Vec<(u32, u64, u64)> =
            (0..100).map(|_| a.allocate(4096, AllocClass::Reserved, &[]).unwrap()).collect();
        a.scan_queue(blocks[..2].iter().copied());
        assert!(a.scan_issue(&blocks[..2]));
        for (i, &(vdev, start, len)) in blocks.iter().enumerate() {
            a.free(1 + (i as u64 % 2), vdev, start, len);
        }
        for txg in 1..2 + FREE_DEFER_TXGS {
            a.synced(txg);
        }
        a
    };
    let (mut whole, mut steps) = (build(), build());
    let txg = 2 + FREE_DEFER_TXGS;
    whole.synced(txg);
    let before = steps.free_bytes();
    let mut count = 0;
    while steps.synced_some(txg, 16) {
        count += 1;
        assert_eq!(steps.free_bytes(), before + count * 16 * 4096, "step {count}");
    }
    // The first txg's frees but the one being read came back at txg 1 + the deferral; the
    // second's 49 not being read go 16 a step: three steps say more is left, the fourth ends.
    assert_eq!(count, 3);
    assert_eq!(steps.free_bytes(), whole.free_bytes());
    assert_eq!(steps.deferred_bytes(), whole.deferred_bytes());
    assert_eq!(steps.deferred_bytes(), 2 * 4096, "the blocks being read stay deferred");
    assert_eq!(steps.space_map(0), whole.space_map(0));
}

/// On RAID-Z the run lengths the rewrite asks room for are counted at what blocks of those
/// sizes allocate there: a run of six 16 KiB blocks (each with its parity beside it) is over
/// 128 KiB of sectors but holds only 96 KiB of data, so it is no room for 128 KiB runs; eight
/// are. And a vdev short of space offers no room in long runs at all: it places by best fit.
#[test]
fn raidz_run_room_counts_runs_at_what_blocks_allocate() {
    let geometry = RaidzGeometry::new(3, 1, 12).unwrap();
    let block = geometry.asize(16 << 10);
    assert!(block > 16 << 10, "parity beside the data");
    let mut a = Allocator::new(12, &[(4 * MIB, 68 * MIB)]).with_geometries(&[Some(geometry)]);
    let blocks = fill_with_blocks(&mut a);
    assert_eq!(a.run_room_bytes(16 << 10), 0, "a full vdev is short of space");
    let free_all = |a: &mut Allocator, freed: &[Place], txg: u64| {
        for &(vdev, start, len) in freed {
            a.free(txg, vdev, start, len);
        }
        for synced in txg..=(txg + FREE_DEFER_TXGS) {
            a.synced(synced);
        }
    };
    // The last eighth back, in one range: the vdev has room again.
    free_all(&mut a, &blocks[blocks.len() - blocks.len() / 8..], 1);
    let room = [32 << 10, 64 << 10, 128 << 10].map(|run| a.run_room_bytes(run));
    assert!(room.iter().all(|&r| r >= blocks.len() as u64 / 8 * block), "{room:?}");
    // Runs of one, two, six and eight blocks, apart from one another, past the log region.
    let mut freed = Vec::new();
    let mut at = blocks.len() / 2;
    for len in [1, 2, 6, 8] {
        freed.extend(&blocks[at..at + len]);
        at += len + 1;
    }
    free_all(&mut a, &freed, 10);
    let grown = [32 << 10, 64 << 10, 128 << 10].map(|run| a.run_room_bytes(run));
    let blocks_counted = [0, 1, 2].map(|tier| (grown[tier] - room[tier]) / block);
    // Two blocks make 32 KiB of data, four 64 KiB and eight 128 KiB.
    assert_eq!(blocks_counted, [16, 14, 8], "blocks counted in runs of 32, 64 and 128 KiB");
}
