//! Space-map I/O (ZFS: `space_map.c`): the allocator's state is written each txg as pieces
//! small enough to fit the holes of a fragmented pool, and read back at import.

use sluice_format::SpaceMap;

/// Bytes of one space-map piece: small enough to fit the holes of a fragmented pool.
pub(super) const SPACE_MAP_PIECE_BYTES: u64 = 16 << 10;

/// Splits a space map into pieces that each encode within `SPACE_MAP_PIECE_BYTES`, keeping the
/// order of its ranges (concatenated, the pieces are the map).
pub(super) fn split_space_map(map: &SpaceMap) -> Vec<SpaceMap> {
    let empty = || SpaceMap {
        ashift: map.ashift,
        synced_txg: map.synced_txg,
        free: Vec::new(),
        deferred: Vec::new(),
    };
    let limit = SPACE_MAP_PIECE_BYTES as usize;
    let mut pieces = vec![empty()];
    // Entry sizes: 16 bytes per free range, 24 per deferred free (space_map.rs).
    let mut used = empty().encoded_len();
    for &range in &map.free {
        if used + 16 > limit {
            pieces.push(empty());
            used = empty().encoded_len();
        }
        if let Some(piece) = pieces.last_mut() {
            piece.free.push(range);
        }
        used += 16;
    }
    for &deferred in &map.deferred {
        if used + 24 > limit {
            pieces.push(empty());
            used = empty().encoded_len();
        }
        if let Some(piece) = pieces.last_mut() {
            piece.deferred.push(deferred);
        }
        used += 24;
    }
    pieces
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
}
