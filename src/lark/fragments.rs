//! Fragmented events of the long connection (LARK.md, "Data"): fragments
//! kept by `message_id`, each at its `seq`, joined once all `sum` arrived,
//! an incomplete set dropped after 10 s. A hostile or broken Lark may open
//! sets without end, so what they hold is bounded in number and in memory
//! (slots and bookkeeping counted, not payload alone), and the oldest set
//! makes room for a newer one; every step is O(log n) in the sets held.

use std::collections::{BTreeMap, HashMap};
use std::time::Duration;

use tokio::time::Instant;

use super::frame::Frame;

/// An incomplete fragment set is dropped after this long.
pub const FRAGMENT_TTL: Duration = Duration::from_secs(10);
/// The largest event (as the webhook's body limit).
pub const MAX_EVENT_BYTES: usize = crate::broker::MAX_BODY_BYTES;
/// The most memory held over all sets, bookkeeping included.
const MAX_BUFFERED_BYTES: usize = 4 * MAX_EVENT_BYTES;
/// The most fragments one event may come in.
const MAX_FRAGMENTS: usize = 256;
/// The most sets open at once: Lark sends one event at a time per
/// connection and waits for its acknowledgement, so a few would do.
pub const MAX_SETS: usize = 64;
/// What a set and a slot cost beyond their bytes (maps, keys, allocations),
/// charged to the budget so that a flood of tiny fragments counts.
const SET_OVERHEAD: usize = 256;
const SLOT_OVERHEAD: usize = 64;

/// Fragment sets being reassembled, by `message_id`.
#[derive(Default)]
pub struct Fragments {
    sets: HashMap<String, Partial>,
    /// The sets by arrival (their `order`), oldest first; as every set lives
    /// the same time, also by expiry.
    arrivals: BTreeMap<u64, String>,
    next_order: u64,
    /// Memory charged over all sets.
    bytes: usize,
    /// Sets dropped to make room, since the last [`Fragments::take_evicted`].
    evicted: u64,
}

struct Partial {
    order: u64,
    sum: usize,
    /// Slots as they arrive: a set never holds more than it was sent.
    parts: BTreeMap<usize, Vec<u8>>,
    /// Payload bytes, against the event's size limit.
    payload: usize,
    /// Memory charged, payload and overheads.
    charged: usize,
    started: Instant,
}

impl Fragments {
    /// Adds a data frame's payload: the whole payload once every fragment of
    /// its set arrived (at once when `sum` is 1), `None` while some are
    /// missing, `Err` when it is refused (its set is dropped). `sum` must be
    /// 1..=256 and `seq` below it: anything else is refused, never used.
    pub fn add(&mut self, frame: &Frame, now: Instant) -> Result<Option<Vec<u8>>, &'static str> {
        let number = |key| frame.header(key).map(|v| v.trim().parse::<usize>());
        let sum = match number("sum") {
            None => 1,
            Some(Ok(sum)) if (1..=MAX_FRAGMENTS).contains(&sum) => sum,
            Some(_) => return Err("a bad fragment count"),
        };
        let seq = match number("seq") {
            None => 0,
            Some(Ok(seq)) if seq < sum => seq,
            Some(_) => return Err("a bad fragment index"),
        };
        let payload = frame.payload.clone().unwrap_or_default();
        if sum == 1 {
            return Ok(Some(payload));
        }
        let Some(message_id) = frame.header("message_id").filter(|id| !id.is_empty()) else {
            return Err("a fragment without a message_id");
        };
        self.put(message_id, sum, seq, payload, now)
    }

    fn put(
        &mut self,
        message_id: &str,
        sum: usize,
        seq: usize,
        payload: Vec<u8>,
        now: Instant,
    ) -> Result<Option<Vec<u8>>, &'static str> {
        let (held, replacing) = match self.sets.get(message_id) {
            Some(set) if set.sum != sum => {
                self.remove(message_id);
                return Err("fragments of one message disagree on their count");
            }
            Some(set) => (set.payload, set.parts.get(&seq).map(Vec::len)),
            None => (0, None),
        };
        if held - replacing.unwrap_or(0) + payload.len() > MAX_EVENT_BYTES {
            self.remove(message_id);
            return Err("a fragmented event over the size limit");
        }
        let new_set = !self.sets.contains_key(message_id);
        let charge = slot_cost(payload.len()) + if new_set { set_cost(message_id) } else { 0 };
        self.make_room(message_id, new_set, charge);
        let len = payload.len();
        let set = self.open(message_id, sum, now);
        let replaced = set.parts.insert(seq, payload).map(|old| old.len());
        let refund = replaced.map_or(0, slot_cost);
        set.payload = set.payload + len - replaced.unwrap_or(0);
        set.charged = set.charged + slot_cost(len) - refund;
        let complete = set.parts.len() == sum;
        self.bytes = self.bytes + slot_cost(len) - refund;
        if !complete {
            return Ok(None);
        }
        let set = self.remove(message_id).expect("the set is there");
        Ok(Some(set.parts.into_values().flatten().collect()))
    }

    /// The set for `message_id`, opened (and charged) when new.
    fn open(&mut self, message_id: &str, sum: usize, now: Instant) -> &mut Partial {
        if !self.sets.contains_key(message_id) {
            let order = self.next_order;
            self.next_order += 1;
            self.arrivals.insert(order, message_id.to_owned());
            self.bytes += set_cost(message_id);
            let set = Partial {
                order,
                sum,
                parts: BTreeMap::new(),
                payload: 0,
                charged: set_cost(message_id),
                started: now,
            };
            self.sets.insert(message_id.to_owned(), set);
        }
        self.sets.get_mut(message_id).expect("just opened")
    }

    /// Drops the oldest sets other than `keep` until one more set (when
    /// `new_set`) and `charge` more bytes fit. One set alone always fits
    /// (its payload is under a quarter of the budget), so this ends.
    fn make_room(&mut self, keep: &str, new_set: bool, charge: usize) {
        while (new_set && self.sets.len() >= MAX_SETS) || self.bytes + charge > MAX_BUFFERED_BYTES {
            let oldest = self.arrivals.values().find(|id| id.as_str() != keep);
            let Some(oldest) = oldest.cloned() else {
                return;
            };
            self.remove(&oldest);
            self.evicted += 1;
        }
    }

    fn remove(&mut self, message_id: &str) -> Option<Partial> {
        let set = self.sets.remove(message_id)?;
        self.arrivals.remove(&set.order);
        self.bytes -= set.charged;
        Some(set)
    }

    /// When the oldest incomplete set expires.
    pub fn next_expiry(&self) -> Option<Instant> {
        let (_, oldest) = self.arrivals.first_key_value()?;
        Some(self.sets[oldest].started + FRAGMENT_TTL)
    }

    /// Drops the sets older than [`FRAGMENT_TTL`]: how many.
    pub fn expire(&mut self, now: Instant) -> usize {
        let mut dropped = 0;
        while self.next_expiry().is_some_and(|at| at <= now) {
            let (_, oldest) = self.arrivals.first_key_value().expect("a set is there");
            let oldest = oldest.clone();
            self.remove(&oldest);
            dropped += 1;
        }
        dropped
    }

    /// Sets dropped to make room since the last call.
    pub fn take_evicted(&mut self) -> u64 {
        std::mem::take(&mut self.evicted)
    }

    /// Sets open now.
    pub fn open_sets(&self) -> usize {
        self.sets.len()
    }

    /// Memory charged now, bookkeeping included.
    pub fn charged_bytes(&self) -> usize {
        self.bytes
    }
}

fn set_cost(message_id: &str) -> usize {
    SET_OVERHEAD + message_id.len()
}

fn slot_cost(len: usize) -> usize {
    SLOT_OVERHEAD + len
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::lark::frame::{DATA, header};

    fn fragment(message_id: &str, sum: usize, seq: usize, payload: &[u8]) -> Frame {
        Frame {
            method: DATA,
            headers: vec![
                header("type", "event"),
                header("message_id", message_id),
                header("sum", &sum.to_string()),
                header("seq", &seq.to_string()),
            ],
            payload: Some(payload.to_vec()),
            ..Frame::default()
        }
    }

    #[test]
    fn fragments_join_in_seq_order_whatever_order_they_arrive_in() {
        let mut fragments = Fragments::default();
        let now = Instant::now();
        assert_eq!(fragments.add(&fragment("m", 3, 2, b"c"), now), Ok(None));
        assert_eq!(fragments.add(&fragment("m", 3, 0, b"a"), now), Ok(None));
        assert_eq!(
            fragments.add(&fragment("n", 1, 0, b"whole"), now),
            Ok(Some(b"whole".to_vec()))
        );
        assert_eq!(
            fragments.add(&fragment("m", 3, 1, b"b"), now),
            Ok(Some(b"abc".to_vec()))
        );
        assert_eq!((fragments.open_sets(), fragments.bytes), (0, 0));
        assert!(fragments.arrivals.is_empty());
    }

    #[test]
    fn incomplete_sets_expire_and_oversized_or_bad_ones_are_refused() {
        let mut fragments = Fragments::default();
        let now = Instant::now();
        assert_eq!(fragments.add(&fragment("m", 2, 0, b"a"), now), Ok(None));
        assert_eq!(fragments.next_expiry(), Some(now + FRAGMENT_TTL));
        assert_eq!(fragments.expire(now + FRAGMENT_TTL), 1);
        assert_eq!((fragments.open_sets(), fragments.bytes), (0, 0));
        assert!(fragments.add(&fragment("m", 2, 2, b"a"), now).is_err());
        assert!(fragments.add(&fragment("m", 0, 0, b"a"), now).is_err());
        assert!(fragments.add(&fragment("m", 257, 0, b"a"), now).is_err());
        let huge = format!("{}", u128::MAX);
        let mut odd = fragment("m", 2, 0, b"a");
        odd.headers[3] = header("seq", &huge);
        assert!(fragments.add(&odd, now).is_err());
        let big = vec![b'x'; MAX_EVENT_BYTES / 2 + 1];
        assert_eq!(fragments.add(&fragment("big", 3, 0, &big), now), Ok(None));
        assert!(fragments.add(&fragment("big", 3, 1, &big), now).is_err());
        assert_eq!((fragments.open_sets(), fragments.bytes), (0, 0));
    }

    /// 60,000 one-byte fragments, each of its own set of 256: at most
    /// [`MAX_SETS`] stay open, the oldest making room, and a set opened
    /// after the flood still completes.
    #[test]
    fn a_flood_of_sets_keeps_at_most_the_newest_64() {
        let mut fragments = Fragments::default();
        let now = Instant::now();
        for i in 0..60_000 {
            let at = now + Duration::from_micros(i);
            let added = fragments.add(&fragment(&format!("flood-{i}"), 256, 0, b"x"), at);
            assert_eq!(added, Ok(None));
            assert!(fragments.open_sets() <= MAX_SETS);
        }
        assert_eq!(fragments.open_sets(), MAX_SETS);
        assert_eq!(fragments.take_evicted(), 60_000 - MAX_SETS as u64);
        assert!(fragments.sets.contains_key("flood-59999"));
        assert!(!fragments.sets.contains_key("flood-59935"));
        assert_eq!(fragments.add(&fragment("late", 2, 0, b"a"), now), Ok(None));
        assert_eq!(
            fragments.add(&fragment("late", 2, 1, b"b"), now),
            Ok(Some(b"ab".to_vec()))
        );
        // The oldest expires first, and expiry empties everything in order.
        assert_eq!(
            fragments.next_expiry(),
            Some(now + Duration::from_micros(59_937) + FRAGMENT_TTL)
        );
        assert_eq!(fragments.expire(now + 2 * FRAGMENT_TTL), MAX_SETS - 1);
        assert_eq!((fragments.open_sets(), fragments.bytes), (0, 0));
    }

    /// Slots and sets are charged beyond their payload, and nothing is held
    /// for fragments that have not arrived.
    #[test]
    fn memory_accounting_counts_slots_and_sets() {
        let mut fragments = Fragments::default();
        let now = Instant::now();
        fragments.add(&fragment("m", 256, 0, b"x"), now).unwrap();
        assert_eq!(fragments.charged_bytes(), set_cost("m") + slot_cost(1));
        assert_eq!(fragments.sets["m"].parts.len(), 1);
        fragments.add(&fragment("m", 256, 0, b"yy"), now).unwrap();
        assert_eq!(fragments.charged_bytes(), set_cost("m") + slot_cost(2));
        fragments.add(&fragment("m", 256, 7, b""), now).unwrap();
        assert_eq!(
            fragments.charged_bytes(),
            set_cost("m") + slot_cost(2) + slot_cost(0)
        );
        // Four sets whose payloads fit the budget, but not with their
        // overheads: the fourth set's second fragment pushes out the oldest.
        let half = vec![b'x'; (MAX_EVENT_BYTES - 100) / 2];
        assert!(4 * 2 * half.len() <= MAX_BUFFERED_BYTES);
        let mut fragments = Fragments::default();
        for set in ["a", "b", "c", "d"] {
            fragments.add(&fragment(set, 3, 0, &half), now).unwrap();
        }
        for set in ["a", "b", "c"] {
            fragments.add(&fragment(set, 3, 1, &half), now).unwrap();
        }
        assert_eq!((fragments.open_sets(), fragments.take_evicted()), (4, 0));
        fragments.add(&fragment("d", 3, 1, &half), now).unwrap();
        assert_eq!((fragments.open_sets(), fragments.take_evicted()), (3, 1));
        assert!(!fragments.sets.contains_key("a"));
        assert!(fragments.charged_bytes() <= MAX_BUFFERED_BYTES);
    }
}
