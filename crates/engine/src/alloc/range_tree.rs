//! A set of disjoint byte ranges, merged on insert (ZFS: `range_tree.c`).
//!
//! Inserting a range that overlaps one already present is a double free or a double
//! allocation: a programmer's bug that would corrupt data, so it is asserted (STYLE.md §5).
//! Ranges read from disk go through [`RangeTree::try_insert`] instead, which reports overlap
//! as an error.
//!
//! Ranges are indexed by start and by size (ZFS keeps both trees too): the allocator fits
//! near its cursor while space is plentiful and takes the smallest range that fits once it is
//! not ([`RangeTree::best_fit`]).

use std::collections::{BTreeMap, BTreeSet};

/// How many block sizes a tree counts room for ([`RangeTree::with_room_units`]).
pub const ROOM_TIERS: usize = 4;
/// How many run lengths [`RangeTree::count_runs`] counts free space in.
pub const RUN_TIERS: usize = 3;

#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RangeTree {
    /// start -> end (exclusive)
    ranges: BTreeMap<u64, u64>,
    /// (length, start) of every range.
    by_size: BTreeSet<(u64, u64)>,
    total: u64,
    /// The block sizes `room` counts in (0: every byte).
    room_units: [u64; ROOM_TIERS],
    /// For each of `room_units`, the bytes blocks of that size could use: of each range, its
    /// largest multiple of the unit.
    room: [u64; ROOM_TIERS],
    /// For each of `runs_floors`, the bytes in runs of at least that length: of each range,
    /// its part at or after `runs_lo` if that part is that long (a floor of 0 counts
    /// nothing). See [`RangeTree::count_runs`].
    runs_floors: [u64; RUN_TIERS],
    runs_lo: u64,
    runs: [u64; RUN_TIERS],
}

impl RangeTree {
    /// An empty tree that also keeps how many bytes blocks of each of `units` could take.
    pub fn with_room_units(units: [u64; ROOM_TIERS]) -> RangeTree {
        RangeTree { room_units: units, ..RangeTree::default() }
    }

    /// Bytes that blocks of the `tier`th unit (see [`RangeTree::with_room_units`]) could take:
    /// each range counts in whole multiples of it, since what is left over at a range's end
    /// holds no such block. Placing a block of at most the unit at either end of a range lowers
    /// it by at most the unit; inside a range, by up to twice that.
    pub fn room_bytes(&self, tier: usize) -> u64 {
        self.room[tier]
    }

    fn count_room(&mut self, len: u64, add: bool) {
        for (room, &unit) in self.room.iter_mut().zip(&self.room_units) {
            // A unit of 0 counts every byte.
            let part = len.checked_div(unit).map_or(len, |blocks| blocks * unit);
            if add {
                *room += part;
            } else {
                *room -= part;
            }
        }
    }

    pub fn total_bytes(&self) -> u64 {
        self.total
    }

    /// From now on counts, for each of `floors`, the bytes of free ranges that lie at or
    /// after `lo` in parts of at least that many bytes ([`RangeTree::run_bytes`]); a floor of
    /// 0 counts nothing.
    pub fn count_runs(&mut self, floors: [u64; RUN_TIERS], lo: u64) {
        (self.runs_floors, self.runs_lo) = (floors, lo);
        self.runs = [0; RUN_TIERS];
        let ranges: Vec<(u64, u64)> = self.ranges.iter().map(|(&s, &e)| (s, e)).collect();
        for (start, end) in ranges {
            self.count_run(start, end, true);
        }
    }

    /// Free bytes in runs of at least the `tier`th floor [`RangeTree::count_runs`] set: where
    /// blocks written together can lie side by side in runs that long.
    pub fn run_bytes(&self, tier: usize) -> u64 {
        self.runs[tier]
    }

    fn count_run(&mut self, start: u64, end: u64, add: bool) {
        let part = end.saturating_sub(start.max(self.runs_lo));
        for (runs, &floor) in self.runs.iter_mut().zip(&self.runs_floors) {
            if floor > 0 && part >= floor {
                if add {
                    *runs += part;
                } else {
                    *runs -= part;
                }
            }
        }
    }

    /// Bytes of the ranges inside `[lo, hi)`.
    pub fn bytes_within(&self, lo: u64, hi: u64) -> u64 {
        // The range that starts before `lo` may reach into the span.
        let first = self.ranges.range(..lo).next_back().map_or(lo, |(&start, _)| start);
        self.ranges
            .range(first..hi)
            .map(|(&start, &end)| end.min(hi).saturating_sub(start.max(lo)))
            .sum()
    }

    pub fn len(&self) -> usize {
        self.ranges.len()
    }

    pub fn is_empty(&self) -> bool {
        self.ranges.is_empty()
    }

    /// Every range as (start, length), in order.
    pub fn iter(&self) -> impl Iterator<Item = (u64, u64)> + '_ {
        self.ranges.iter().map(|(&start, &end)| (start, end - start))
    }

    fn add_range(&mut self, start: u64, end: u64) {
        self.ranges.insert(start, end);
        self.by_size.insert((end - start, start));
        self.count_room(end - start, true);
        self.count_run(start, end, true);
    }

    fn drop_range(&mut self, start: u64) {
        if let Some(end) = self.ranges.remove(&start) {
            self.by_size.remove(&(end - start, start));
            self.count_room(end - start, false);
            self.count_run(start, end, false);
        }
    }

    fn overlaps(&self, start: u64, end: u64) -> bool {
        let before = self.ranges.range(..end).next_back();
        before.is_some_and(|(_, &e)| e > start)
    }

    /// Inserts `[start, start+len)`, merging with neighbours; `false` if it overlaps.
    pub fn try_insert(&mut self, start: u64, len: u64) -> bool {
        let Some(end) = start.checked_add(len) else { return false };
        if len == 0 || self.overlaps(start, end) {
            return false;
        }
        let (mut new_start, mut new_end) = (start, end);
        if let Some((&s, &e)) = self.ranges.range(..start).next_back() {
            if e == start {
                new_start = s;
                self.drop_range(s);
            }
        }
        if let Some(&e) = self.ranges.get(&end) {
            new_end = e;
            self.drop_range(end);
        }
        self.add_range(new_start, new_end);
        self.total += len;
        true
    }

    /// Inserts a range that must not overlap (a free of allocated space).
    pub fn insert(&mut self, start: u64, len: u64) {
        assert!(
            self.try_insert(start, len),
            "range tree: [{start}, +{len}) overlaps free space (double free)"
        );
    }

    /// The ranges of this tree and `other` (disjoint from it) in order, each run of adjacent
    /// ones joined: what a tree holding both would iterate, without building it. The space map
    /// lists free and log space this way each txg; cloning the tree (both of its indexes) to
    /// insert the log's ranges was most of the map's cost on a fragmented pool.
    pub fn union<'a>(&'a self, other: &'a RangeTree) -> impl Iterator<Item = (u64, u64)> + 'a {
        let mut a = self.ranges.iter().map(|(&s, &e)| (s, e)).peekable();
        let mut b = other.ranges.iter().map(|(&s, &e)| (s, e)).peekable();
        let mut next = move || match (a.peek(), b.peek()) {
            (Some(x), Some(y)) if x.0 <= y.0 => a.next(),
            (Some(_), Some(_)) => b.next(),
            (Some(_), None) => a.next(),
            (None, _) => b.next(),
        };
        let mut pending = next();
        std::iter::from_fn(move || {
            let (start, mut end) = pending?;
            loop {
                pending = next();
                match pending {
                    Some((s, e)) if s == end => end = e,
                    Some((s, _)) => {
                        assert!(s > end, "range tree union: [{s}, ..) overlaps [{start}, {end})");
                        break;
                    }
                    None => break,
                }
            }
            Some((start, end - start))
        })
    }

    /// Whether any byte of `[start, start+len)` is in the tree.
    pub fn intersects(&self, start: u64, len: u64) -> bool {
        len > 0 && self.overlaps(start, start.saturating_add(len))
    }

    /// The parts of `[start, start+len)` the tree holds, in order, as (start, end).
    pub fn parts_within(&self, start: u64, len: u64) -> impl Iterator<Item = (u64, u64)> + '_ {
        let end = start.saturating_add(len);
        let first = self.ranges.range(..start).next_back().map_or(start, |(&s, _)| s);
        self.ranges.range(first..end).filter_map(move |(&s, &e)| {
            let (from, to) = (s.max(start), e.min(end));
            (from < to).then_some((from, to))
        })
    }

    /// Removes whatever part of `[start, start+len)` the tree holds (none, some or all of it).
    pub fn remove_within(&mut self, start: u64, len: u64) {
        let hit: Vec<(u64, u64)> = self.parts_within(start, len).collect();
        for (from, to) in hit {
            self.remove(from, to - from);
        }
    }

    /// Whether `[start, start+len)` lies entirely inside one range.
    pub fn contains(&self, start: u64, len: u64) -> bool {
        let end = start.saturating_add(len);
        self.ranges.range(..=start).next_back().is_some_and(|(_, &e)| e >= end)
    }

    /// Removes `[start, start+len)`, which must lie inside one range (an allocation of free
    /// space).
    pub fn remove(&mut self, start: u64, len: u64) {
        let end = start + len;
        let (&s, &e) = match self.ranges.range(..=start).next_back() {
            Some(found) if *found.1 >= end => found,
            _ => panic!("range tree: [{start}, +{len}) is not free (double allocation)"),
        };
        self.drop_range(s);
        if s < start {
            self.add_range(s, start);
        }
        if end < e {
            self.add_range(end, e);
        }
        self.total -= len;
    }

    /// The start of the smallest range that holds `len` bytes at an `align`ed start.
    pub fn best_fit(&self, len: u64, align: u64) -> Option<u64> {
        self.by_size.range((len, 0)..).find_map(|&(size, start)| {
            let at = start.div_ceil(align) * align;
            (at + len <= start + size).then_some(at)
        })
    }

    /// Whether `len` bytes aligned to `align` fit at or after `lo` in some range. Walks only
    /// the ranges of at least `len` bytes, smallest first, until one fits.
    pub fn fits_from(&self, len: u64, align: u64, lo: u64) -> bool {
        self.by_size.range((len, 0)..).any(|&(size, start)| {
            let at = start.max(lo).div_ceil(align) * align;
            at.checked_add(len).is_some_and(|end| end <= start + size)
        })
    }

    /// The smallest range that holds `len` bytes aligned to `align` at or after `lo`: the
    /// aligned start there, and the range's end.
    pub fn best_fit_from(&self, len: u64, align: u64, lo: u64) -> Option<(u64, u64)> {
        self.by_size.range((len, 0)..).find_map(|&(size, start)| {
            let at = start.max(lo).div_ceil(align) * align;
            let end = start + size;
            (at.checked_add(len)? <= end).then_some((at, end))
        })
    }

    /// The range with the most room at or after `lo` (the lowest of equals), if that is at
    /// least `least` bytes aligned to `align`: the aligned start there, and the range's end.
    /// Looks at no more than `budget` ranges, largest first; what it passes over lies before
    /// `lo` (at most one range straddles `lo`, and only its part after `lo` counts), and the
    /// budget bounds that walk.
    pub fn largest_from(
        &self,
        least: u64,
        align: u64,
        lo: u64,
        budget: usize,
    ) -> Option<(u64, u64)> {
        let mut best: Option<(u64, u64)> = None;
        for &(size, start) in self.by_size.iter().rev().take(budget) {
            let room = best.map_or(0, |(at, end)| end - at);
            if size < least.max(room) {
                // Nothing smaller has as much room.
                break;
            }
            let at = start.max(lo).div_ceil(align) * align;
            let end = start + size;
            let Some(here) = end.checked_sub(at) else { continue };
            let better = here > room || best.is_some_and(|(b, _)| here == room && at < b);
            if here >= least && better {
                best = Some((at, end));
            }
        }
        best
    }

    /// Length of the largest range (0 when empty).
    pub fn largest(&self) -> u64 {
        self.by_size.last().map_or(0, |&(size, _)| size)
    }

    /// The first range start at or after `cursor` (wrapping once) with room for `len` bytes
    /// aligned to `align`; returns the aligned start.
    pub fn first_fit(&self, len: u64, align: u64, cursor: u64) -> Option<u64> {
        let fits = |(&s, &e): (&u64, &u64), from: u64| {
            let at = s.max(from).div_ceil(align) * align;
            (at.checked_add(len)? <= e).then_some(at)
        };
        // The range containing the cursor, then everything after it, then from the start.
        let containing = self.ranges.range(..=cursor).next_back().and_then(|r| fits(r, cursor));
        containing
            .or_else(|| self.ranges.range(cursor.saturating_add(1)..).find_map(|r| fits(r, 0)))
            .or_else(|| self.ranges.range(..=cursor).find_map(|r| fits(r, 0)))
    }
}

impl RangeTree {
    /// Like [`RangeTree::first_fit`], but only inside `[lo, hi)`: from `cursor` to `hi`, then
    /// from `lo`.
    pub fn first_fit_within(
        &self,
        len: u64,
        align: u64,
        cursor: u64,
        (lo, hi): (u64, u64),
    ) -> Option<u64> {
        let fits = |(&s, &e): (&u64, &u64), from: u64| {
            let at = s.max(from).div_ceil(align) * align;
            (at.checked_add(len)? <= e.min(hi)).then_some(at)
        };
        let from = |start: u64| {
            if start >= hi {
                return None;
            }
            let containing = self.ranges.range(..=start).next_back().and_then(|r| fits(r, start));
            containing.or_else(|| {
                self.ranges.range(start.saturating_add(1)..hi).find_map(|r| fits(r, start))
            })
        };
        if lo >= hi {
            return None;
        }
        let start = cursor.clamp(lo, hi);
        // From `lo` again only if that covers something the first pass did not.
        from(start).or_else(|| if start > lo { from(lo) } else { None })
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    /// `intersects` sees any shared byte, and `remove_within` takes exactly the part of a
    /// span the tree holds, across several ranges, leaving the rest.
    #[test]
    fn intersects_and_remove_within() {
        let mut tree = RangeTree::default();
        tree.insert(100, 50);
        tree.insert(200, 50);
        assert!(tree.intersects(149, 10) && tree.intersects(90, 11) && tree.intersects(0, 1000));
        assert!(!tree.intersects(150, 50) && !tree.intersects(90, 10) && !tree.intersects(120, 0));
        tree.remove_within(120, 100);
        assert_eq!(tree.iter().collect::<Vec<_>>(), vec![(100, 20), (220, 30)]);
        assert_eq!(tree.total_bytes(), 50);
        tree.remove_within(0, 10);
        tree.remove_within(0, 1000);
        assert!(tree.is_empty() && tree.total_bytes() == 0);
    }

    /// The searches for a span's pieces: the smallest range that holds a length after `lo`,
    /// and the one with the most room after `lo` (a range straddling `lo` counts its part
    /// after it; the lowest of equals; none below `least`; none past the budget).
    #[test]
    fn piece_searches_count_only_what_lies_after_lo() {
        let mut tree = RangeTree::default();
        tree.insert(0, 1000); // straddles lo = 900: 100 after it
        tree.insert(2000, 300);
        tree.insert(3000, 300);
        tree.insert(4000, 200);
        tree.insert(5000, 50);
        assert_eq!(tree.best_fit_from(150, 1, 900), Some((4000, 4200)));
        assert_eq!(tree.best_fit_from(250, 1, 900), Some((2000, 2300)));
        assert_eq!(tree.best_fit_from(400, 1, 900), None, "the straddling range holds 100");
        assert_eq!(tree.largest_from(10, 1, 900, 64), Some((2000, 2300)), "lowest of equals");
        assert_eq!(tree.largest_from(10, 1, 0, 64), Some((0, 1000)));
        assert_eq!(tree.largest_from(400, 1, 900, 64), None);
        assert_eq!(tree.largest_from(10, 1, 900, 1), Some((900, 1000)), "a budget of one range");
        assert_eq!(tree.largest_from(10, 1, 2900, 64), Some((3000, 3300)));
    }

    /// A bounded first fit stays inside its bounds and wraps from the cursor to the start.
    #[test]
    fn first_fit_within_bounds() {
        let mut tree = RangeTree::default();
        tree.insert(0, 100 << 10);
        assert_eq!(tree.first_fit_within(4096, 4096, 8192, (0, 16384)), Some(8192));
        assert_eq!(tree.first_fit_within(8192, 4096, 12288, (0, 16384)), Some(0));
        assert_eq!(tree.first_fit_within(32768, 4096, 0, (0, 16384)), None);
        tree.remove(0, 12288);
        assert_eq!(tree.first_fit_within(4096, 4096, 0, (0, 16384)), Some(12288));
        assert_eq!(tree.first_fit_within(8192, 4096, 0, (0, 16384)), None);
    }

    /// `fits_from` sees a fit only at or after its bound, in a range that crosses it too.
    #[test]
    fn fits_from_counts_only_space_past_the_bound() {
        let mut tree = RangeTree::default();
        tree.insert(0, 64 << 10);
        tree.insert(128 << 10, 8 << 10);
        assert!(tree.fits_from(16 << 10, 4096, 32 << 10), "the first range crosses the bound");
        assert!(!tree.fits_from(16 << 10, 4096, 56 << 10), "8 KiB left before the bound's end");
        assert!(tree.fits_from(8 << 10, 4096, 56 << 10));
        assert!(!tree.fits_from(16 << 10, 4096, 64 << 10), "only 8 KiB past 64 KiB");
    }

    #[test]
    fn run_bytes_count_long_parts_after_the_bound() {
        let mut t = RangeTree::default();
        t.insert(0, 100);
        t.insert(200, 50);
        // Nothing counted until asked.
        assert_eq!(t.run_bytes(0), 0);
        // [0, 100) has 70 after 30: long enough for 60 and 40, not 80; [200, 250) only
        // for 40.
        t.count_runs([60, 40, 80], 30);
        assert_eq!([t.run_bytes(0), t.run_bytes(1), t.run_bytes(2)], [70, 70 + 50, 0]);
        // A merge makes a short range long; a split makes a long one short.
        t.insert(250, 20);
        assert_eq!([t.run_bytes(0), t.run_bytes(1), t.run_bytes(2)], [70 + 70, 70 + 70, 0]);
        t.remove(60, 10);
        assert_eq!([t.run_bytes(0), t.run_bytes(1), t.run_bytes(2)], [70, 70, 0]);
        t.remove_within(0, 300);
        assert_eq!(t.run_bytes(1), 0);
    }

    #[test]
    fn inserts_merge_and_removes_split() {
        let mut tree = RangeTree::default();
        tree.insert(0, 4096);
        tree.insert(8192, 4096);
        tree.insert(4096, 4096);
        assert_eq!(tree.iter().collect::<Vec<_>>(), vec![(0, 12288)]);
        tree.remove(4096, 4096);
        assert_eq!(tree.iter().collect::<Vec<_>>(), vec![(0, 4096), (8192, 4096)]);
        assert!(!tree.try_insert(0, 1), "overlap refused");
        assert_eq!(tree.total_bytes(), 8192);
    }

    #[test]
    fn first_fit_honours_cursor_and_alignment() {
        let mut tree = RangeTree::default();
        tree.insert(0, 1 << 20);
        tree.insert(2 << 20, 1 << 20);
        assert_eq!(tree.first_fit(4096, 4096, 0), Some(0));
        assert_eq!(tree.first_fit(4096, 4096, 100), Some(4096));
        assert_eq!(tree.first_fit(4096, 4096, (1 << 20) + 5), Some(2 << 20));
        assert_eq!(tree.first_fit(4096, 4096, 3 << 20), Some(0), "wraps around");
        assert_eq!(tree.first_fit(2 << 20, 4096, 0), None);
    }

    /// Trees that overlap are a double allocation somewhere: their union refuses to list them.
    #[test]
    #[should_panic(expected = "overlaps")]
    fn union_refuses_overlapping_trees() {
        let (mut a, mut b) = (RangeTree::default(), RangeTree::default());
        a.insert(0, 8192);
        b.insert(4096, 8192);
        let _ = a.union(&b).count();
    }

    proptest! {
        /// The union of two disjoint trees iterates as one tree holding both would: in order,
        /// adjacent ranges from either tree joined.
        #[test]
        fn union_is_the_tree_of_both(owner in proptest::collection::vec(0u8..3, 1..80)) {
            // Unit i belongs to no tree (0), to `a` (1) or to `b` (2).
            let (mut a, mut b, mut both) = (RangeTree::default(), RangeTree::default(), RangeTree::default());
            for (i, &o) in owner.iter().enumerate() {
                let at = i as u64 * 512;
                match o {
                    1 => a.insert(at, 512),
                    2 => b.insert(at, 512),
                    _ => continue,
                }
                both.insert(at, 512);
            }
            prop_assert_eq!(a.union(&b).collect::<Vec<_>>(), both.iter().collect::<Vec<_>>());
            prop_assert_eq!(b.union(&a).collect::<Vec<_>>(), both.iter().collect::<Vec<_>>());
        }

        /// Against a bitmap model: allocations never overlap free space, frees never double,
        /// and the total matches the model after any sequence.
        #[test]
        fn matches_a_bitmap(ops in proptest::collection::vec((any::<bool>(), 0u64..64, 1u64..8), 1..200)) {
            let mut tree = RangeTree::with_room_units([2048, 1024, 4096, 0]);
            tree.insert(0, 64 * 512);
            // Parts of at least 6, 2 and 9 sectors from sector 5 on.
            tree.count_runs([6 * 512, 2 * 512, 9 * 512], 5 * 512);
            let mut free = [true; 64];
            for (allocate, at, n) in ops {
                let n = n.min(64 - at);
                let range_free = free[at as usize..(at + n) as usize].iter().all(|f| *f);
                let range_used = free[at as usize..(at + n) as usize].iter().all(|f| !*f);
                prop_assert_eq!(tree.contains(at * 512, n * 512), range_free);
                if allocate && range_free {
                    tree.remove(at * 512, n * 512);
                    free[at as usize..(at + n) as usize].iter_mut().for_each(|f| *f = false);
                } else if !allocate && range_used {
                    tree.insert(at * 512, n * 512);
                    free[at as usize..(at + n) as usize].iter_mut().for_each(|f| *f = true);
                } else if !allocate {
                    prop_assert_eq!(tree.try_insert(at * 512, n * 512), false);
                }
                prop_assert_eq!(tree.total_bytes(), free.iter().filter(|f| **f).count() as u64 * 512);
                // The size index agrees with the model's runs of free sectors.
                let mut runs = Vec::new();
                let mut i = 0;
                while i < 64 {
                    if free[i] {
                        let start = i;
                        while i < 64 && free[i] { i += 1; }
                        runs.push(((i - start) as u64 * 512, start as u64 * 512));
                    }
                    i += 1;
                }
                prop_assert_eq!(tree.largest(), runs.iter().map(|r| r.0).max().unwrap_or(0));
                for (tier, unit) in [2048u64, 1024, 4096].into_iter().enumerate() {
                    prop_assert_eq!(tree.room_bytes(tier), runs.iter().map(|r| r.0 / unit * unit).sum::<u64>());
                }
                prop_assert_eq!(tree.room_bytes(3), tree.total_bytes());
                let long = |&(len, start): &(u64, u64)| (start + len).saturating_sub(start.max(5 * 512));
                for (tier, floor) in [6u64, 2, 9].into_iter().enumerate() {
                    let want = runs.iter().map(long).filter(|&l| l >= floor * 512).sum::<u64>();
                    prop_assert_eq!(tree.run_bytes(tier), want);
                }
                for want in [512u64, 2048, 4096] {
                    let smallest = runs.iter().filter(|r| r.0 >= want).min().map(|r| r.1);
                    prop_assert_eq!(tree.best_fit(want, 512), smallest);
                }
            }
        }
    }
}
