//! How the `auto` commit policy forms and writes its groups.
//!
//! A group is the records ready when a committer finds a slot free (or, when they are all logged by
//! pointer, at once: their blocks are already on their way), written in blocks allocated on or
//! near one top-level vdev and made durable together: on a single leaf by one flush of each leaf
//! they, and the blocks of their indirect records, landed on; on a mirror or RAID-Z by writing
//! each durably on every present child ([`GroupTuner`] sets how many groups a vdev may run at
//! once). When several slots are free the records are spread evenly over them, so a burst uses
//! every flush the devices can run in parallel (over one slot per vdev where the tuner makes
//! groups wait for their share, as on a file: a vdev's second slot is for the next group); each
//! group's blocks are sized to hold exactly what it carries, and its last block allocates the
//! block that will open the next group, on the vdev expected to free a slot first. The decision
//! to form a group (and the short waits before one) is [`LogWriter::commit`]'s; this module is
//! what a group is made of and how it reaches the disk.

use futures::future::join_all;
use parking_lot::Mutex;
use sluice_format::LOG_HEADER_BYTES;

use super::{
    only_by_pointer, take_records, GroupTuner, LogWriter, Lwb, State, LOG_BLOCK_BYTES_MIN,
    LOG_DURABLE,
};
use crate::alloc::Allocator;
use crate::pool::{Pool, PoolError};
use crate::vdev;
use crate::zio::crypt::FamilyKey;
use crate::zio::Writer;

impl LogWriter {
    /// `Auto`: takes the ready records into up to `slots` groups of nearly equal size, so that
    /// records that arrived together spread over the flushes the devices can run at once
    /// (records all logged by pointer: into one group, whatever the slots).
    /// Each group's blocks are sized to hold exactly what it carries; the block that will open
    /// the next group, whose records have not arrived yet, is sized from what groups have
    /// carried lately. (Space allocated and left unwritten costs a rotation on a disk, while
    /// one block more in a group costs only a write, since the group shares one flush.)
    pub(super) fn build_groups(
        &self,
        state: &mut State,
        allocator: &Mutex<Allocator>,
        key: Option<&FamilyKey>,
        tuner: &GroupTuner,
        now: crate::rt::Time,
    ) -> Result<Vec<Vec<Lwb>>, PoolError> {
        let (cap, rotational) = (tuner.cap(), tuner.rotational());
        let ready: Vec<usize> = state.ready().map(|r| state.record_len(r)).collect();
        debug_assert!(!ready.is_empty(), "a group is formed for a ready record");
        let slots: u32 = (state.groups_on_vdev.iter().enumerate())
            .filter(|&(v, _)| tuner.holds_log(v))
            .map(|(_, g)| cap.saturating_sub(g.len() as u32))
            .sum();
        // Records per group: what is left, spread over the groups still to form, and no more
        // than an even share of everything outstanding over every slot. Records are durable
        // in chain order, so a group much bigger than those around it holds back the writers
        // of every group after it; the records beyond the share wait for the next slot. Nor
        // are fewer records than a share spread over more groups: each group pays a flush.
        let slots_in_all = tuner.slots();
        // Where groups wait for their share, what is ready is split over one slot per vdev.
        // Records logged by pointer are not shared out: their blocks are written unflushed,
        // so their group is a write and then a flush whatever it carries, and one group
        // carries them with one flush (a group per lwb block, as when each block write paid
        // its own flush, made a 1 MiB write's 64 records several flushes).
        let by_pointer = only_by_pointer(state.ready());
        let even = if by_pointer {
            ready.len()
        } else if tuner.waits_for_share() {
            state.even_share(ready.len(), tuner.log_vdevs())
        } else {
            state.even_share(ready.len(), slots_in_all)
        };
        let count = (slots as usize).clamp(1, ready.len().div_ceil(even).max(1));
        let demand = |from: usize, n: usize| -> usize {
            LOG_HEADER_BYTES + ready[from..from + n].iter().sum::<usize>()
        };
        let unit = LOG_BLOCK_BYTES_MIN as usize;
        let block_for = |bytes: usize| -> u32 {
            let bytes = bytes.div_ceil(unit) * unit;
            (bytes.min(self.max_block_bytes as usize) as u32)
                .clamp(LOG_BLOCK_BYTES_MIN, self.max_block_bytes)
        };
        let share = |taken: usize, g: usize| {
            (ready.len() - taken).div_ceil(count.saturating_sub(g).max(1)).min(even)
        };
        let mut groups = Vec::with_capacity(count);
        let mut taken = 0;
        // Groups go on while records are left and the next one's device has a slot (records
        // held back by the share take any slot still free).
        let mut g = 0;
        while taken < ready.len() {
            let home = state.next_address.vdev;
            if g > 0
                && state.groups_on_vdev.get(home as usize).is_some_and(|g| g.len() as u32 >= cap)
            {
                // The rest waits for a slot on the device this group would start on.
                break;
            }
            let mut size = share(taken, g);
            if g == 0 && count > 1 {
                // The first group's block was allocated before its records arrived: give it
                // what that block holds (at least one record) and the other groups the rest,
                // rather than a second block that makes it the last to finish.
                let capacity = state.next_address.len_bytes as usize - LOG_HEADER_BYTES;
                let fits = ready[taken..].iter().scan(0, |used, &len| {
                    *used += len;
                    Some(*used)
                });
                let fits = fits.take_while(|&used| used <= capacity).count().max(1);
                size = size.min(fits);
            }
            debug_assert!(size > 0, "a group carries a record");
            state.records_in_groups += size;
            if let Some(formed) = state.groups_on_vdev.get_mut(home as usize) {
                formed.push((now, size));
            }
            let group_bytes = demand(taken, size);
            state.group_records = state.group_records * 0.75 + size as f64 * 0.25;
            state.group_demand = if state.group_demand == 0.0 {
                group_bytes as f64
            } else {
                state.group_demand * 0.5 + group_bytes as f64 * 0.5
            };
            state.note_demand(group_bytes);
            let mut left = size;
            let mut lwbs = Vec::new();
            while left > 0 {
                let capacity = state.next_address.len_bytes as usize;
                let (records, _) = take_records(state, capacity, left);
                left -= records.len();
                let (bytes, near) = if left > 0 {
                    // The group's next block, on the same device: one flush covers both.
                    (block_for(demand(taken + size - left, left)), home)
                } else {
                    // The next group's first block, on the device expected to have a slot
                    // first: one with a free slot (fewest groups in flight), else the one
                    // whose oldest group was formed first, and then carries least (the next
                    // device in turn on a tie).
                    // A chain's next block is fixed before its records arrive, so a choice
                    // that frees late holds every later record back while other devices idle.
                    let vdevs = state.groups_on_vdev.len() as u32;
                    let expected_free = |v: u32| {
                        let formed = &state.groups_on_vdev[v as usize];
                        let full = formed.len() as u32 >= cap;
                        match formed.first() {
                            Some(&(at, records)) if full => (true, at.0, records),
                            _ => (false, 0, formed.len()),
                        }
                    };
                    let near = (1..=vdevs)
                        .map(|i| (home + i) % vdevs.max(1))
                        .filter(|&v| tuner.holds_log(v as usize))
                        .min_by_key(|&v| expected_free(v))
                        .unwrap_or(home);
                    let bytes = if taken + size < ready.len() {
                        block_for(demand(taken + size, share(taken + size, g + 1)))
                    } else if rotational {
                        // Unwritten space costs a pass of the head over it; too small a block
                        // costs one more write under the same flush.
                        block_for(state.group_demand as usize)
                    } else {
                        // Unwritten space costs nothing, while a second block would make the
                        // group a write and then a flush instead of one fused write.
                        self.next_block_bytes(state)
                    };
                    (bytes, near)
                };
                let mut lwb = self.seal(state, allocator, key, records, bytes, Some(near))?;
                if lwbs.is_empty() {
                    lwb.group_formed = Some(now);
                }
                lwbs.push(lwb);
            }
            taken += size;
            groups.push(lwbs);
            g += 1;
        }
        state.open_since = if state.pending.is_empty() { None } else { state.open_since };
        Ok(groups)
    }

    /// Writes an `Auto` group: on each top-level vdev it touches, at the same time, a lone
    /// block is written and flushed in one trip, and several are written and then flushed
    /// once ([`LogWriter::write_with_data`]: on a single leaf; on a mirror or RAID-Z each is
    /// written durably on every present child, since there a plain write and a flush succeed
    /// when one child did). A group carrying indirect records is written with their blocks,
    /// flushed together. (The batch policy flushes its vdevs one after another: the seed's
    /// "before".)
    pub(super) async fn write_group(&self, pool: &Pool, lwbs: &[Lwb]) -> bool {
        if lwbs.iter().any(|lwb| !lwb.writes.is_empty()) {
            let all: Vec<&Lwb> = lwbs.iter().collect();
            return self.write_with_data(pool, &all, false).await;
        }
        let mut vdevs: Vec<u32> = lwbs.iter().map(|lwb| lwb.at.vdev).collect();
        vdevs.sort_unstable();
        vdevs.dedup();
        let per_vdev = vdevs.into_iter().map(|vdev| {
            let mine: Vec<&Lwb> = lwbs.iter().filter(|lwb| lwb.at.vdev == vdev).collect();
            async move {
                if let [lwb] = &mine[..] {
                    let address = vdev::VdevAddress { vdev, offset_bytes: lwb.at.offset_bytes };
                    let data = lwb.bytes.clone();
                    return pool.issue(Writer::LogChain, address, data, LOG_DURABLE).await.is_ok();
                }
                self.write_with_data(pool, &mine, false).await
            }
        });
        join_all(per_vdev).await.into_iter().all(|ok| ok)
    }
}
