//! A served pool's events (the engine's `fm`): `sluice pool events [-f] [--json]` (ZFS's
//! `zpool events`), and the server's journal, one line on standard error per event (under
//! systemd, the journal).
//!
//! An event travels to a command as an [`EventView`]: its number, its time in UTC, its class,
//! pool, vdev and details. `pool events` prints one line per event, `--json` one JSON object
//! per line; `-f` goes on printing each new event as it is posted, until interrupted.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, UNIX_EPOCH};

use futures::StreamExt;
use serde::{Deserialize, Serialize};
use sluice_engine::fm::Event;
use sluice_engine::Store;

/// Events as a reply: those a served pool keeps (`pool events`), or the next ones (`-f`).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct EventList {
    pub events: Vec<EventView>,
}

/// One event as a command receives and prints it.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct EventView {
    pub eid: u64,
    /// RFC 3339, UTC, to the nanosecond.
    pub time: String,
    pub unix_nanos: u64,
    /// The full class (`resource.fs.sluice.statechange`).
    pub class: String,
    /// What a hook's name starts with (`statechange`).
    pub subclass: String,
    pub pool: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub vdev: Option<String>,
    #[serde(default)]
    pub details: BTreeMap<String, String>,
}

impl EventView {
    pub fn of(event: &Event) -> EventView {
        let at = UNIX_EPOCH + Duration::from_nanos(event.unix_nanos);
        EventView {
            eid: event.eid,
            time: humantime::format_rfc3339_nanos(at).to_string(),
            unix_nanos: event.unix_nanos,
            class: event.class.name(),
            subclass: event.class.subclass().to_owned(),
            pool: event.pool.clone(),
            vdev: event.vdev.clone(),
            details: event.details.iter().map(|(k, v)| ((*k).to_owned(), v.clone())).collect(),
        }
    }

    /// The event as one line of text: time, class, vdev, then its details as `name=value`
    /// (values with spaces quoted).
    pub fn line(&self) -> String {
        let mut line = format!("{}  {}  {}", self.time, self.class, self.pool);
        if let Some(vdev) = &self.vdev {
            line.push_str(&format!("  {vdev}"));
        }
        for (name, value) in &self.details {
            if value.contains(char::is_whitespace) || value.is_empty() {
                line.push_str(&format!("  {name}={value:?}"));
            } else {
                line.push_str(&format!("  {name}={value}"));
            }
        }
        line
    }
}

/// The events a served pool keeps, as views.
pub fn list(store: &Store) -> Vec<EventView> {
    store.pool().events().list().iter().map(|e| EventView::of(e)).collect()
}

/// Writes every event of the store to standard error as it is posted, from those kept at the
/// start: the server's journal. Ends when the store is dropped.
pub fn journal(store: &Arc<Store>) -> tokio::task::JoinHandle<()> {
    let (kept, mut new) = store.pool().events().follow();
    tokio::spawn(async move {
        for event in kept {
            eprintln!("sluice: event {} {}", event.eid, EventView::of(&event).line());
        }
        while let Some(event) = new.next().await {
            eprintln!("sluice: event {} {}", event.eid, EventView::of(&event).line());
        }
    })
}
