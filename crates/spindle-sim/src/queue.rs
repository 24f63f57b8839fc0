//! The simulator's agenda: events ordered by (simulated time, insertion order). Ties are
//! broken by insertion order, never by anything outside the seed.

use std::collections::BTreeMap;

pub struct EventQueue<E> {
    events: BTreeMap<(u64, u64), E>,
    next_seq: u64,
}

impl<E> Default for EventQueue<E> {
    fn default() -> Self {
        EventQueue {
            events: BTreeMap::new(),
            next_seq: 0,
        }
    }
}

impl<E> EventQueue<E> {
    pub fn push(&mut self, at_ms: u64, event: E) {
        self.events.insert((at_ms, self.next_seq), event);
        self.next_seq += 1;
    }

    /// The earliest event and its time.
    pub fn pop(&mut self) -> Option<(u64, E)> {
        self.events.pop_first().map(|((at, _), e)| (at, e))
    }

    pub fn len(&self) -> usize {
        self.events.len()
    }

    pub fn is_empty(&self) -> bool {
        self.events.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn events_come_out_by_time_then_insertion() {
        let mut q = EventQueue::default();
        q.push(5, "b");
        q.push(1, "a");
        q.push(5, "c");
        assert_eq!(q.pop(), Some((1, "a")));
        assert_eq!(q.pop(), Some((5, "b")));
        assert_eq!(q.pop(), Some((5, "c")));
        assert!(q.pop().is_none());
    }
}
