//! Tests of the submission queue's scheduler and depth controller (`super`).

use proptest::prelude::*;

use super::*;

fn limits(total: u32, read_max: u32) -> QueueLimits {
    let mut limits = QueueLimits::from_tunables(&Tunables::default(), false);
    limits.auto_depth = false;
    limits.total_active_max = total;
    limits.max_active[IoClass::SyncRead.index()] = read_max;
    limits.min_active[IoClass::SyncRead.index()] = read_max.min(limits.min_active[0]);
    limits
}

/// `vdev.max_active=auto` on a non-rotational leaf (slots counted per I/O, reads may go deeper
/// alone), as a pool of file leaves on an SSD has it.
fn auto_limits() -> QueueLimits {
    let tunables = Tunables::with([("vdev.max_active", "auto")]).unwrap();
    let limits = QueueLimits::from_tunables(&tunables, false);
    assert!(limits.auto_depth && limits.count_members && limits.deepen_alone);
    limits
}

fn io(class: IoClass, direction: Direction, offset: u64, len: u64) -> QueuedIo<u64> {
    QueuedIo { class, direction, offset, len, payload: offset }
}

/// A sync write queued behind many reads is issued as soon as the reads reach their class
/// maximum, not after them (seed 003's fix).
#[test]
fn sync_write_passes_queued_reads() {
    let mut scheduler = Scheduler::new(limits(13, 12));
    for i in 0..40 {
        scheduler.enqueue(io(IoClass::SyncRead, Direction::Read, i * (1 << 20), 32768), Time::ZERO);
    }
    scheduler.enqueue(io(IoClass::SyncWrite, Direction::Write, 1 << 40, 8192), Time::ZERO);
    let mut issued = Vec::new();
    while let Some(issue) = scheduler.next_issue(Time::ZERO) {
        issued.push((issue.class, issue.offset));
    }
    assert_eq!(issued.len(), 13);
    assert_eq!(issued.iter().filter(|(c, _)| *c == IoClass::SyncRead).count(), 12);
    assert!(issued.contains(&(IoClass::SyncWrite, 1 << 40)));
}

/// Adjacent reads merge into one command up to the limit; writes need contiguity.
#[test]
fn adjacent_ios_aggregate() {
    let mut scheduler = Scheduler::new(limits(1000, 10));
    scheduler.enqueue(io(IoClass::AsyncRead, Direction::Read, 4096, 4096), Time::ZERO);
    scheduler.enqueue(io(IoClass::AsyncRead, Direction::Read, 0, 4096), Time::ZERO);
    scheduler.enqueue(io(IoClass::SyncRead, Direction::Read, 8192 + 4096, 4096), Time::ZERO);
    scheduler.enqueue(io(IoClass::AsyncWrite, Direction::Write, 8192, 4096), Time::ZERO);
    scheduler.enqueue(io(IoClass::AsyncWrite, Direction::Write, 16384, 4096), Time::ZERO);
    let first = scheduler.next_issue(Time::ZERO).unwrap();
    // Sync read first (priority), absorbing the two reads before it across a 4 KiB gap.
    assert_eq!((first.offset, first.len, first.members.len()), (0, 16384, 3));
    let second = scheduler.next_issue(Time::ZERO).unwrap();
    assert_eq!(second.direction, Direction::Write);
    assert_eq!(second.members.len(), 1, "writes 8192 and 16384 are not contiguous");
}

/// Every class below its minimum gets a turn before higher classes fill to their maxima.
#[test]
fn minimums_prevent_starvation() {
    let mut scheduler = Scheduler::new(limits(1000, 10));
    for i in 0..20 {
        scheduler.enqueue(io(IoClass::SyncRead, Direction::Read, i << 30, 4096), Time::ZERO);
        scheduler
            .enqueue(io(IoClass::Scrub, Direction::Read, (i << 30) + (1 << 29), 4096), Time::ZERO);
    }
    let mut scrub = 0;
    while let Some(issue) = scheduler.next_issue(Time::ZERO) {
        scrub += u32::from(issue.class == IoClass::Scrub);
    }
    assert_eq!(scrub, 3, "scrub reaches its maximum of 3 only after its minimum turn");
    assert_eq!(scheduler.active(IoClass::SyncRead), 10);
}

/// With sync writes beside the reads, the controller climbs while throughput grows with
/// depth and settles near the knee of a device whose throughput saturates at 12 I/Os in
/// flight; it never goes below 1.
#[test]
fn depth_controller_finds_the_knee() {
    let mut controller = DepthController::new(true);
    let mut now = Time::ZERO;
    for i in 0..100_000 {
        if i % 100 == 0 {
            controller.write_arrived(now);
        }
        // Throughput proportional to depth up to 12, flat beyond.
        let per_second = f64::from(controller.depth.min(12)) * 1e6;
        now = Time(now.0 + (4096.0 / per_second * 1e9) as u64);
        controller.completed(4096, true, now);
    }
    assert!((12..=16).contains(&controller.depth), "settled at {}", controller.depth);
    assert!(controller.changes >= 2);
    // Windows without demand say nothing: the depth stays.
    let before = controller.depth;
    for i in 0..1000 {
        if i % 100 == 0 {
            controller.write_arrived(now);
        }
        now = Time(now.0 + 1_000_000);
        controller.completed(4096, false, now);
    }
    assert_eq!(controller.depth, before);
}

/// Alone on the device, sync reads take depth for any clear gain: on a device whose
/// throughput grows 20% per fourfold depth (elasticity about 0.07, as scattered reads on
/// this VM's disk) the depth climbs far past where writes hold it. With sync writes
/// beside the reads the same device keeps the depth near where it started. Once the
/// writes stop, the queue stays put for a second (a client that syncs now and then keeps
/// it shallow), then is deep within another: what held it with writes around (a failed
/// probe's hold) does not hold it alone. The next sync write brings back the depth judged
/// with writes, not a probe's.
#[test]
fn depth_controller_deepens_only_while_alone() {
    let run_for = |controller: &mut DepthController, now: &mut Time, writes: bool, n: u32| {
        for i in 0..n {
            if writes && i % 50 == 0 {
                controller.write_arrived(*now);
            }
            let per_second = 1e8 * f64::from(controller.depth).powf(0.13);
            *now = Time(now.0 + (16384.0 / per_second * 1e9) as u64);
            controller.completed(16384, true, *now);
        }
    };
    let run_until = |controller: &mut DepthController, now: &mut Time, until: Time| {
        while *now < until {
            run_for(controller, now, false, 100);
        }
    };
    let second = std::time::Duration::from_secs(1).as_nanos() as u64;
    let mut now = Time::ZERO;
    let mut controller = DepthController::new(true);
    run_for(&mut controller, &mut now, true, 200_000);
    let held = controller.depth;
    assert!(held <= 16, "with writes beside it the depth went to {held}");
    let stopped = now;
    run_until(&mut controller, &mut now, Time(stopped.0 + second * 9 / 10));
    assert!(controller.depth <= 16, "not yet alone, the depth went to {}", controller.depth);
    run_until(&mut controller, &mut now, Time(stopped.0 + second * 2));
    assert!(controller.depth >= 128, "alone for a second: depth {}", controller.depth);
    controller.write_arrived(now);
    assert_eq!(controller.depth, controller.shared_depth, "a sync write came");
    assert!(controller.shared_depth <= 16, "held with writes: {}", controller.shared_depth);
    // A rotational leaf's queue never goes alone.
    let mut hdd = DepthController::new(false);
    run_for(&mut hdd, &mut now, false, 200_000);
    assert!(hdd.depth <= 16, "a rotational leaf's depth went to {}", hdd.depth);
}

/// A time alone starts from the depth judged with writes, not from a probe in flight, and
/// so does the time after it.
#[test]
fn alone_starts_from_the_judged_depth() {
    let mut controller = DepthController::new(true);
    controller.write_arrived(Time::ZERO);
    controller.probe = Some((10, true));
    controller.baseline = Some(1e8);
    controller.set_depth(12);
    controller.enter_alone();
    assert_eq!((controller.depth, controller.shared_depth), (10, 10));
    controller.set_depth(DEPTH_AUTO_ALONE_MAX);
    controller.write_arrived(Time::ZERO);
    assert_eq!(controller.depth, 10);
}

/// Alone, a walk down from the top stops where the losses add up to 1% since it began: a
/// device that loses 0.9% a halving is not walked down to a depth of 1.
#[test]
fn alone_walk_down_stops_within_one_percent() {
    let mut controller = DepthController::new(true);
    let mut now = Time::ZERO;
    let mut lowest = u32::MAX;
    for _ in 0..400_000 {
        let halvings = f64::from(DEPTH_AUTO_ALONE_MAX / controller.depth.max(1)).log2();
        let per_second = 1e8 * 0.991f64.powf(halvings);
        now = Time(now.0 + (16384.0 / per_second * 1e9) as u64);
        controller.completed(16384, true, now);
        if controller.changes > 2 {
            lowest = lowest.min(controller.depth);
        }
    }
    assert!(lowest >= 64, "the walk down reached {lowest}");
}

/// Depth gained alone is for sync reads: a scrub beside them stays within the depth held
/// with writes around, so a client's read never waits behind hundreds of its reads.
#[test]
fn depth_gained_alone_is_for_sync_reads() {
    let mut queue = Scheduler::new(auto_limits());
    let controller = queue.depth.as_mut().expect("auto");
    controller.enter_alone();
    controller.set_depth(DEPTH_AUTO_ALONE_MAX);
    let held = controller.shared_depth;
    assert_eq!(queue.depth(), DEPTH_AUTO_ALONE_MAX);
    let now = Time::ZERO;
    for i in 0..512u64 {
        // Far apart, so none merge.
        queue.enqueue(io(IoClass::Scrub, Direction::Read, i << 30, 4096), now);
    }
    while queue.next_issue(Time::ZERO).is_some() {}
    assert_eq!(queue.active(IoClass::Scrub), held, "a scrub alone");
    for i in 0..512u64 {
        queue.enqueue(io(IoClass::SyncRead, Direction::Read, (512 + i) << 30, 4096), now);
    }
    while queue.next_issue(Time::ZERO).is_some() {}
    let reads = queue.active(IoClass::SyncRead);
    assert_eq!(reads + held, DEPTH_AUTO_ALONE_MAX, "sync reads got {reads} slots");
}

/// The sync writes that end a time alone all go out at once, though the reads in the
/// device hold far more than the depth they brought back.
#[test]
fn writes_after_a_time_alone_do_not_wait_for_reads() {
    let mut queue = Scheduler::new(auto_limits());
    let controller = queue.depth.as_mut().expect("auto");
    controller.enter_alone();
    controller.set_depth(DEPTH_AUTO_ALONE_MAX);
    let now = Time::ZERO;
    for i in 0..512u64 {
        queue.enqueue(io(IoClass::SyncRead, Direction::Read, i << 30, 4096), now);
    }
    while queue.next_issue(Time::ZERO).is_some() {}
    assert_eq!(queue.active(IoClass::SyncRead), DEPTH_AUTO_ALONE_MAX);
    for i in 0..4u64 {
        queue.enqueue(io(IoClass::SyncWrite, Direction::Write, (1 << 40) + (i << 30), 4096), now);
    }
    assert!(queue.depth() <= 16, "the writes brought the depth back to {}", queue.depth());
    let mut writes = 0;
    while let Some(issue) = queue.next_issue(Time::ZERO) {
        assert_eq!(issue.class, IoClass::SyncWrite, "a read went out past the depth");
        writes += 1;
    }
    assert_eq!(writes, 4);
}

/// With `auto`, a sync write finds a slot even when reads fill the measured depth.
#[test]
fn auto_leaves_room_for_sync_writes() {
    let mut scheduler = Scheduler::new(auto_limits());
    for i in 0..100 {
        scheduler.enqueue(io(IoClass::SyncRead, Direction::Read, i << 30, 4096), Time::ZERO);
    }
    scheduler.enqueue(io(IoClass::LogWrite, Direction::Write, 1 << 50, 4096), Time::ZERO);
    let mut reads = 0;
    let mut log_writes = 0;
    while let Some(issue) = scheduler.next_issue(Time::ZERO) {
        match issue.class {
            IoClass::SyncRead => reads += 1,
            IoClass::LogWrite => log_writes += 1,
            _ => {}
        }
    }
    assert_eq!(reads, DEPTH_AUTO_INITIAL);
    assert_eq!(log_writes, 1);
}

/// Rule 7: while the intent log flushes the leaf, async writes go out `sync_pace_bytes` at a
/// time (a command no wider than what is left), refilled by each completed flush and, with
/// none in flight, every `PACE_REFILL`; what a flush's completion gave waits for the next log
/// write and goes behind it; sync and log writes are never held; with no log flush, and
/// `PACE_LOG_IDLE` after the last one, nothing is held.
#[test]
fn async_writes_are_paced_between_the_logs_flushes() {
    let at = |us: u64| Time::from_nanos(us * 1000);
    let mut paced = pace_limits();
    paced.sync_pace_bytes = 256 << 10;
    let mut unpaced = paced.clone();
    unpaced.sync_pace_bytes = 0;
    let mut scheduler = Scheduler::new(paced);
    // 128 KiB writes with gaps between them, so that none merge.
    let mut next = 0u64;
    let mut queue_async = |scheduler: &mut Scheduler<u64>, count: u64, now: Time| {
        for _ in 0..count {
            scheduler.enqueue(io(IoClass::AsyncWrite, Direction::Write, next, 128 << 10), now);
            next += 256 << 10;
        }
    };
    let log_flush = |scheduler: &mut Scheduler<u64>, now: Time| {
        scheduler.flush_started();
        scheduler.flush_done(true, true, now);
    };

    // No log flush yet: a stream goes out whole.
    queue_async(&mut scheduler, 8, at(1000));
    assert_eq!(drain_async(&mut scheduler, at(1000)), 8);
    assert_eq!(scheduler.paced_until(), None);

    // The log flushes: from then on 256 KiB (two writes) per refill, and the completion's
    // budget waits for the next log write.
    log_flush(&mut scheduler, at(2000));
    queue_async(&mut scheduler, 12, at(2000));
    assert_eq!(drain_async(&mut scheduler, at(2000)), 0, "held for the next log write");
    assert_eq!(scheduler.paced_until(), Some(at(3000)));
    scheduler.enqueue(io(IoClass::LogWrite, Direction::Write, 1 << 40, 4096), at(2000));
    let issue = scheduler.next_issue(at(2000)).expect("a log write is never held");
    assert_eq!(issue.class, IoClass::LogWrite);
    scheduler.done(issue.class, issue.members.len(), issue.len, at(2000));
    assert_eq!(drain_async(&mut scheduler, at(2000)), 2, "behind the log write");
    assert_eq!(scheduler.paced_until(), Some(at(3000)), "held until the time refill");
    // A sync write is not held either.
    scheduler.enqueue(io(IoClass::SyncWrite, Direction::Write, 1 << 41, 4096), at(2000));
    assert_eq!(drain_async(&mut scheduler, at(2000)), 0);
    assert_eq!(scheduler.queued_count(), 10);
    // While a flush is in flight time does not refill: only its completion does (a flush of
    // the pool's own here, which does not prolong the pacing), and with no log write after
    // it, a period later.
    scheduler.flush_started();
    assert_eq!(drain_async(&mut scheduler, at(3000)), 0);
    assert_eq!(scheduler.paced_until(), Some(at(4000)), "looked at again a period later");
    scheduler.flush_done(true, false, at(3500));
    assert_eq!(drain_async(&mut scheduler, at(3500)), 0);
    assert_eq!(drain_async(&mut scheduler, at(4500)), 2);
    // With none in flight, a period after the last refill.
    assert_eq!(drain_async(&mut scheduler, at(5400)), 0);
    assert_eq!(drain_async(&mut scheduler, at(5500)), 2);
    // PACE_LOG_IDLE after the log's last flush the rest goes at once.
    assert_eq!(drain_async(&mut scheduler, at(11_900)), 2);
    assert_eq!(scheduler.paced_until(), Some(at(12_000)), "the idle end comes before the refill");
    assert_eq!(drain_async(&mut scheduler, at(11_950)), 0);
    assert_eq!(drain_async(&mut scheduler, at(12_000)), 4);
    assert_eq!(scheduler.queued_count(), 0);
    assert_eq!(scheduler.paced_until(), None);

    // Contiguous writes merge only up to what is left of the budget.
    log_flush(&mut scheduler, at(20_000));
    for i in 0..4 {
        let offset = (1 << 30) + i * (128 << 10);
        scheduler.enqueue(io(IoClass::AsyncWrite, Direction::Write, offset, 128 << 10), at(20_000));
    }
    scheduler.enqueue(io(IoClass::LogWrite, Direction::Write, 1 << 42, 4096), at(20_000));
    let issue = scheduler.next_issue(at(20_000)).expect("the log write goes first");
    assert_eq!(issue.class, IoClass::LogWrite);
    let issue = scheduler.next_issue(at(20_000)).expect("the budget lets one command go");
    assert_eq!((issue.members.len(), issue.len), (2, 256 << 10));
    assert!(scheduler.next_issue(at(20_000)).is_none());

    // Pacing off: a log flush holds nothing.
    let mut scheduler = Scheduler::new(unpaced);
    log_flush(&mut scheduler, at(1000));
    queue_async(&mut scheduler, 8, at(1000));
    assert_eq!(drain_async(&mut scheduler, at(1000)), 8);
}

/// Limits for rule 7's tests, pacing off: only the pace holds async writes back (no depth or
/// class maximum stops them), and commands may span 1 MiB.
fn pace_limits() -> QueueLimits {
    let mut limits = limits(1000, 10);
    limits.max_active[IoClass::AsyncWrite.index()] = 1000;
    limits.aggregation_limit_bytes = 1 << 20;
    limits.sync_pace_bytes = 0;
    limits.sync_pace_auto = false;
    limits
}

/// Issues everything the queue lets go at `now`, each command completing at once; returns
/// how many async writes went.
fn drain_async(scheduler: &mut Scheduler<u64>, now: Time) -> usize {
    let mut issued = 0;
    while let Some(issue) = scheduler.next_issue(now) {
        if issue.class == IoClass::AsyncWrite {
            issued += issue.members.len();
        }
        scheduler.done(issue.class, issue.members.len(), issue.len, now);
    }
    issued
}

/// Rule 7 with `vdev.sync_pace_bytes=auto`: the first sync goes unpaced; a later one gets the
/// bytes the one before wrote spread over half the interval since that one started, for the
/// time since the last refill, or more where its queue asks for it; past the deadline twice
/// the rate.
#[test]
fn auto_pace_spreads_a_sync_over_half_its_interval() {
    let ms = |ms: u64| Time::from_nanos(ms * 1_000_000);
    let mut limits = pace_limits();
    limits.sync_pace_auto = true;
    let mut scheduler = Scheduler::new(limits);
    const WRITE: u64 = 64 << 10;
    // 64 KiB writes with gaps between them, so that none merge.
    let mut next = 0u64;
    let mut queue_async = |scheduler: &mut Scheduler<u64>, count: u64, now: Time| {
        for _ in 0..count {
            scheduler.enqueue(io(IoClass::AsyncWrite, Direction::Write, next, WRITE), now);
            next += 2 * WRITE;
        }
    };
    let mut log_offset = 1u64 << 40;
    let mut log_write = |scheduler: &mut Scheduler<u64>, now: Time| {
        scheduler.enqueue(io(IoClass::LogWrite, Direction::Write, log_offset, 4096), now);
        log_offset += 4096;
    };
    let log_flush = |scheduler: &mut Scheduler<u64>, now: Time| {
        scheduler.flush_started();
        scheduler.flush_done(true, true, now);
    };

    // The first sync: no plan, so nothing is held (but the log write goes first). It writes
    // 500 writes, in two helpings (as a sync's spans come).
    log_flush(&mut scheduler, ms(0));
    queue_async(&mut scheduler, 250, ms(0));
    log_write(&mut scheduler, ms(0));
    assert_eq!(drain_async(&mut scheduler, ms(0)), 250);
    queue_async(&mut scheduler, 250, ms(50));
    assert_eq!(drain_async(&mut scheduler, ms(50)), 250);

    // The next starts 1 s after it: 500 writes over 500 ms, one a millisecond, however many
    // are queued (8 here, as a sync keeps a few spans in flight).
    log_flush(&mut scheduler, ms(1000));
    queue_async(&mut scheduler, 8, ms(1000));
    log_write(&mut scheduler, ms(1000));
    assert_eq!(drain_async(&mut scheduler, ms(1000)), 1);
    assert_eq!(scheduler.paced_until(), Some(ms(1001)));
    // A flush of 5 ms: its completion lets five through (behind the next log write).
    scheduler.flush_started();
    assert_eq!(drain_async(&mut scheduler, ms(1003)), 0);
    scheduler.flush_done(true, true, ms(1005));
    assert_eq!(drain_async(&mut scheduler, ms(1005)), 0, "held for the next log write");
    log_write(&mut scheduler, ms(1005));
    assert_eq!(drain_async(&mut scheduler, ms(1005)), 5);
    // With none in flight, a millisecond later: one again.
    assert_eq!(drain_async(&mut scheduler, ms(1006)), 1);
    // A queue longer than the plan asks for: 480 queued with 100 ms left is 4.8 a
    // millisecond (four, and the fifth crosses the budget).
    log_flush(&mut scheduler, ms(1399));
    queue_async(&mut scheduler, 479, ms(1400));
    log_flush(&mut scheduler, ms(1400));
    log_write(&mut scheduler, ms(1400));
    assert_eq!(drain_async(&mut scheduler, ms(1400)), 5);

    // Past the deadline: twice the planned rate for the 10 ms (`PACE_LOG_IDLE`, the longest
    // period counted) since the last refill, 20 writes, or the queue's share of 50 ms
    // (`PACE_AUTO_LATE`) if more: 475 over 5, 95.
    log_flush(&mut scheduler, ms(1600));
    log_write(&mut scheduler, ms(1600));
    assert_eq!(drain_async(&mut scheduler, ms(1600)), 95);
    assert_eq!(scheduler.queued_count(), 380);
    // PACE_LOG_IDLE after the log's last flush the rest goes at once.
    assert_eq!(drain_async(&mut scheduler, ms(1610)), 380);
}

proptest! {
    /// Whatever is queued and however commands complete, every queued I/O is issued exactly
    /// once, no command exceeds the aggregation limit (unless a single I/O does), and the
    /// active counts never exceed their maxima.
    #[test]
    fn everything_issues_once_within_limits(
        ios in proptest::collection::vec((0usize..6, any::<bool>(), 0u64..64, 1u64..4), 1..80),
        total in 1u32..16,
    ) {
        let mut limits = limits(total, 4);
        limits.aggregation_limit_bytes = 8 * 4096;
        let mut scheduler = Scheduler::new(limits.clone());
        for (n, (class, write, block, blocks)) in ios.iter().enumerate() {
            let direction = if *write { Direction::Write } else { Direction::Read };
            let io = QueuedIo { class: IoClass::ALL[*class], direction, offset: block * 4096, len: blocks * 4096, payload: n };
            scheduler.enqueue(io, Time(n as u64));
        }
        let mut seen = vec![false; ios.len()];
        let mut in_flight = Vec::new();
        loop {
            while let Some(issue) = scheduler.next_issue(Time::ZERO) {
                prop_assert!(scheduler.active_total() <= limits.total_active_max);
                for class in IoClass::ALL {
                    let cap = limits.max_active[class.index()].max(limits.min_active[class.index()]);
                    // A single I/O may always go when its class has a slot.
                    prop_assert!(scheduler.active(class) <= cap, "class {:?} over its maximum", class);
                }
                prop_assert!(issue.members.len() == 1 || issue.len <= limits.aggregation_limit_bytes);
                for member in &issue.members {
                    prop_assert!(!seen[member.payload], "I/O issued twice");
                    seen[member.payload] = true;
                    prop_assert!(member.offset >= issue.offset && member.offset + member.len <= issue.offset + issue.len);
                }
                in_flight.push((issue.class, issue.members.len()));
            }
            match in_flight.pop() {
                Some((class, members)) => scheduler.done(class, members, 4096, Time::ZERO),
                None => break,
            }
        }
        prop_assert!(seen.iter().all(|s| *s), "some I/O was never issued");
        prop_assert_eq!(scheduler.queued_count(), 0);
    }
}

/// One step of an `auto` scenario: time passes, I/Os of one class arrive, and the oldest
/// commands in the device complete, each I/O having moved `bytes_per_io` bytes (so the
/// measured throughput rises and falls and the depth follows it).
#[derive(Clone, Debug)]
struct Step {
    advance_ms: u64,
    class: usize,
    arrivals: u64,
    /// Far apart (no merging) or within 64 blocks (merging).
    spread: bool,
    completions: usize,
    bytes_per_io: u64,
}

/// What an `auto` scenario went through, so a test can tell it reached the regime it checks.
#[derive(Default)]
struct AutoSeen {
    /// Sync reads held more than the depth judged with writes while alone.
    reads_deeper_alone: bool,
    /// A sync or log write went out while reads held more than the depth.
    writes_past_reads: bool,
}

/// Runs `steps` against a queue with `vdev.max_active=auto` on a non-rotational leaf and checks
/// the promises its depth rules make at every turn: every I/O is issued once, and the queue
/// empties once everything completes; while alone, a throughput class other than sync reads
/// never holds more than the depth judged with writes (or its minimum); and after each turn a
/// sync or log write still queued has found every slot of its class taken, however many reads
/// the device holds.
fn auto_scenario(steps: &[Step], count_members: bool) -> Result<AutoSeen, TestCaseError> {
    let mut limits = auto_limits();
    limits.count_members = count_members;
    let mut queue = Scheduler::new(limits.clone());
    let mut now = Time::ZERO;
    let mut issued = Vec::new();
    let mut in_flight = std::collections::VecDeque::new();
    let mut seen = AutoSeen::default();
    let mut turn = |queue: &mut Scheduler<usize>,
                    issued: &mut Vec<bool>,
                    in_flight: &mut std::collections::VecDeque<(IoClass, usize)>|
     -> Result<(), TestCaseError> {
        while let Some(issue) = queue.next_issue(Time::ZERO) {
            for member in &issue.members {
                prop_assert!(!issued[member.payload], "I/O {} issued twice", member.payload);
                issued[member.payload] = true;
            }
            let controller = queue.depth.as_ref().expect("auto");
            let class = issue.class;
            if controller.alone && is_throughput(class) && class != IoClass::SyncRead {
                let cap = controller.shared_depth.max(limits.min_active[class.index()]);
                prop_assert!(
                    queue.active(class) <= cap,
                    "alone, {class:?} holds {} slots past the {} judged with writes",
                    queue.active(class),
                    controller.shared_depth
                );
            }
            if controller.alone && queue.active(IoClass::SyncRead) > controller.shared_depth {
                seen.reads_deeper_alone = true;
            }
            if !is_throughput(class) && queue.active_throughput() > controller.depth {
                seen.writes_past_reads = true;
            }
            in_flight.push_back((class, issue.members.len()));
        }
        for class in [IoClass::SyncWrite, IoClass::LogWrite] {
            if !queue.by_class[class.index()].is_empty() {
                prop_assert!(
                    queue.active(class) >= limits.max_active[class.index()],
                    "a {class:?} waits with {} of {} slots taken and {} throughput I/Os active",
                    queue.active(class),
                    limits.max_active[class.index()],
                    queue.active_throughput()
                );
            }
        }
        Ok(())
    };
    for step in steps {
        now = now.plus(std::time::Duration::from_millis(step.advance_ms));
        let class = IoClass::ALL[step.class];
        let direction = if is_throughput(class) && class != IoClass::AsyncWrite {
            Direction::Read
        } else {
            Direction::Write
        };
        let first = issued.len();
        issued.resize(first + step.arrivals as usize, false);
        for n in first..issued.len() {
            let offset = if step.spread { (n as u64) << 30 } else { (n as u64 % 64) * 4096 };
            queue.enqueue(QueuedIo { class, direction, offset, len: 4096, payload: n }, now);
        }
        turn(&mut queue, &mut issued, &mut in_flight)?;
        for _ in 0..step.completions.min(in_flight.len()) {
            let (class, members) = in_flight.pop_front().expect("counted");
            queue.done(class, members, members as u64 * step.bytes_per_io, now);
        }
        turn(&mut queue, &mut issued, &mut in_flight)?;
    }
    while let Some((class, members)) = in_flight.pop_front() {
        queue.done(class, members, members as u64 * 4096, now);
        turn(&mut queue, &mut issued, &mut in_flight)?;
    }
    prop_assert!(issued.iter().all(|i| *i), "some I/O was never issued");
    prop_assert_eq!(queue.queued_count(), 0);
    Ok(seen)
}

fn step() -> impl Strategy<Value = Step> {
    (0u64..400, 0usize..IoClass::COUNT, 0u64..64, any::<bool>(), 0usize..96, 1u64..65536).prop_map(
        |(advance_ms, class, arrivals, spread, completions, bytes_per_io)| Step {
            advance_ms,
            class,
            arrivals,
            spread,
            completions,
            bytes_per_io,
        },
    )
}

proptest! {
    /// `auto` and its regime for reads alone keep their promises whatever arrives, when, and
    /// however fast commands complete (see [`auto_scenario`]).
    #[test]
    fn auto_depth_keeps_its_promises(
        steps in proptest::collection::vec(step(), 1..120),
        count_members in any::<bool>(),
    ) {
        auto_scenario(&steps, count_members)?;
    }
}

/// The scenario the property test draws from at random, made to pass through every regime:
/// sync reads alone long enough to deepen past the depth judged with writes, a scrub beside
/// them, then sync and log writes arriving while the reads hold that depth.
#[test]
fn auto_scenario_reaches_every_regime() {
    let reads = |advance_ms, bytes_per_io| Step {
        advance_ms,
        class: IoClass::SyncRead.index(),
        arrivals: 600,
        spread: true,
        completions: 2000,
        bytes_per_io,
    };
    let mut steps = vec![reads(0, 4096)];
    // Four seconds of reads alone whose throughput grows with depth.
    for i in 0..40 {
        steps.push(reads(100, 4096 * (1 + i)));
        if i == 20 {
            steps.push(Step { class: IoClass::Scrub.index(), ..reads(0, 4096) });
        }
    }
    for class in [IoClass::SyncWrite, IoClass::LogWrite] {
        steps.push(Step { class: class.index(), arrivals: 40, completions: 0, ..reads(1, 4096) });
    }
    let seen = auto_scenario(&steps, true).expect("the promises hold");
    assert!(seen.reads_deeper_alone, "sync reads never went past the depth judged with writes");
    assert!(seen.writes_past_reads, "no write went out while reads held more than the depth");
}
