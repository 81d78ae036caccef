//! Space-map I/O (ZFS: `space_map.c`): the allocator's state is written each txg as pieces
//! small enough to fit the holes of a fragmented pool, and read back at import.

use std::ops::Range;

use sluice_format::SpaceMap;

/// Bytes of one space-map piece: small enough to fit the holes of a fragmented pool.
pub(super) const SPACE_MAP_PIECE_BYTES: u64 = 16 << 10;

/// How a space map of `free` ranges and `deferred` frees is cut into pieces that each encode
/// within `SPACE_MAP_PIECE_BYTES`: each piece's index ranges into the two lists, in order (free
/// ranges first, the deferred frees continuing in the last piece that has room). Known from the
/// counts alone, so the sync allocates the pieces before it builds the map.
pub(super) fn piece_layout(free: usize, deferred: usize) -> Vec<(Range<usize>, Range<usize>)> {
    let (free_bytes, deferred_bytes) = (SpaceMap::FREE_ENTRY_BYTES, SpaceMap::DEFERRED_ENTRY_BYTES);
    let room = SPACE_MAP_PIECE_BYTES as usize - SpaceMap::EMPTY_BYTES;
    assert!(room >= deferred_bytes.max(free_bytes), "a space-map piece holds at least one entry");
    let (mut f, mut d) = (0, 0);
    let mut pieces = Vec::new();
    loop {
        let take_free = (free - f).min(room / free_bytes);
        let left = room - take_free * free_bytes;
        let take_deferred =
            if f + take_free == free { (deferred - d).min(left / deferred_bytes) } else { 0 };
        pieces.push((f..f + take_free, d..d + take_deferred));
        (f, d) = (f + take_free, d + take_deferred);
        if f == free && d == deferred {
            return pieces;
        }
    }
}

/// At least as many pieces as [`piece_layout`] makes of `free` ranges and `deferred` frees,
/// in constant time (every write's space check asks): each piece but the last is full to
/// within one entry.
pub(super) fn pieces_bound(free: u64, deferred: u64) -> u64 {
    let (free_bytes, deferred_bytes) =
        (SpaceMap::FREE_ENTRY_BYTES as u64, SpaceMap::DEFERRED_ENTRY_BYTES as u64);
    let room = SPACE_MAP_PIECE_BYTES - SpaceMap::EMPTY_BYTES as u64;
    let filled = room - free_bytes.max(deferred_bytes);
    let bytes =
        free.saturating_mul(free_bytes).saturating_add(deferred.saturating_mul(deferred_bytes));
    bytes.div_ceil(filled) + 1
}

/// Splits a space map into pieces as [`piece_layout`] says (concatenated, the pieces are the
/// map).
pub(super) fn split_space_map(map: &SpaceMap) -> Vec<SpaceMap> {
    piece_layout(map.free.len(), map.deferred.len())
        .into_iter()
        .map(|(free, deferred)| SpaceMap {
            ashift: map.ashift,
            synced_txg: map.synced_txg,
            free: map.free[free].to_vec(),
            deferred: map.deferred[deferred].to_vec(),
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A space map split in pieces: each piece encodes within the piece size, and the pieces'
    /// ranges, in order, are the map's.
    #[test]
    pub(super) fn space_maps_split_into_pieces() {
        let map = SpaceMap {
            ashift: 12,
            synced_txg: 9,
            free: (0..5000u64).map(|i| (i * 8192, 4096)).collect(),
            deferred: (0..3000u64).map(|i| (7, (1 << 40) | (i * 8192), 4096)).collect(),
        };
        let pieces = split_space_map(&map);
        assert!(pieces.len() > 5, "{} pieces", pieces.len());
        for piece in &pieces {
            assert!(piece.encode().unwrap().len() as u64 <= SPACE_MAP_PIECE_BYTES);
        }
        let free: Vec<_> = pieces.iter().flat_map(|p| p.free.iter().copied()).collect();
        let deferred: Vec<_> = pieces.iter().flat_map(|p| p.deferred.iter().copied()).collect();
        assert_eq!((free, deferred), (map.free.clone(), map.deferred.clone()));
        let small = SpaceMap { free: vec![(0, 4096)], deferred: vec![], ..map };
        assert_eq!(split_space_map(&small).len(), 1);
    }

    /// The constant-time bound is never below the layout's count.
    #[test]
    fn pieces_bound_covers_the_layout() {
        let fit = (SPACE_MAP_PIECE_BYTES as usize - SpaceMap::EMPTY_BYTES) / 16;
        for free in [0, 1, fit - 1, fit, fit + 1, 3 * fit + 7, 10_000] {
            for deferred in [0, 1, fit / 2, fit, 2 * fit + 3, 7_777] {
                let layout = piece_layout(free, deferred).len() as u64;
                let bound = pieces_bound(free as u64, deferred as u64);
                assert!(bound >= layout, "{free} free, {deferred} deferred: {bound} < {layout}");
                assert!(bound <= layout + 2, "{free} free, {deferred} deferred: {bound} pieces");
            }
        }
    }

    /// Pieces are filled before another starts: entries that just fit take one piece, one more
    /// takes two, and deferred frees continue in the last piece's room.
    #[test]
    fn space_map_pieces_are_full_before_another() {
        let fit = (SPACE_MAP_PIECE_BYTES as usize - SpaceMap::EMPTY_BYTES) / 16;
        assert_eq!(piece_layout(0, 0), vec![(0..0, 0..0)]);
        assert_eq!(piece_layout(fit, 0).len(), 1);
        assert_eq!(piece_layout(fit + 1, 0), vec![(0..fit, 0..0), (fit..fit + 1, 0..0)]);
        // The 48 to 63 bytes left after fit - 3 free ranges hold two deferred frees, not three.
        assert_eq!(piece_layout(fit - 3, 2), vec![(0..fit - 3, 0..2)]);
        assert_eq!(piece_layout(fit - 3, 3), vec![(0..fit - 3, 0..2), (fit - 3..fit - 3, 2..3)]);
    }
}
