//! When user space may let go of what it keeps of a process or thread that is gone: only once
//! it was gone at two looks in a row. The first look after the end can race with the last
//! events (a snapshot read while the process was ending, a stack copy still in the ring); by
//! the second, everything it did has been read. One rule, used for the mapping lists and
//! unwinders (`collect::watch`) and for the processes and threads a daemon lets go of once it
//! has shown them (`collect::session`).

use std::collections::HashSet;
use std::hash::Hash;

/// What was gone at the last look.
#[derive(Debug)]
pub struct GoneTwice<K> {
    gone_at_last_look: HashSet<K>,
}

impl<K> Default for GoneTwice<K> {
    fn default() -> Self {
        Self {
            gone_at_last_look: HashSet::new(),
        }
    }
}

impl<K: Copy + Eq + Hash> GoneTwice<K> {
    /// Looks at `candidates` (what is kept now): returns those `gone` now that were gone at
    /// the last look too, and remembers every one gone now for the next look. The caller
    /// `let_go`es of those it forgets; one it keeps (still needed) comes back at the next look.
    pub fn look(
        &mut self,
        candidates: impl IntoIterator<Item = K>,
        gone: impl Fn(K) -> bool,
    ) -> Vec<K> {
        let gone_now: HashSet<K> = candidates.into_iter().filter(|&k| gone(k)).collect();
        let twice = gone_now
            .iter()
            .copied()
            .filter(|k| self.gone_at_last_look.contains(k))
            .collect();
        self.gone_at_last_look = gone_now;
        twice
    }

    /// Whether some were gone at the last look, waiting for a second one.
    pub fn is_waiting(&self) -> bool {
        !self.gone_at_last_look.is_empty()
    }

    /// Forgets `key` as gone: a pid or tid reused afterwards starts afresh, at its own first
    /// look after its end.
    pub fn let_go(&mut self, key: K) {
        self.gone_at_last_look.remove(&key);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sorted(mut v: Vec<u32>) -> Vec<u32> {
        v.sort_unstable();
        v
    }

    #[test]
    fn only_what_was_gone_at_two_looks_in_a_row_is_returned() {
        let mut gone = GoneTwice::default();
        // 1 and 2 end before the first look; 3 only before the second.
        assert!(gone.look([1, 2, 3, 4], |k| k != 3 && k != 4).is_empty());
        assert_eq!(sorted(gone.look([1, 2, 3, 4], |k| k != 4)), [1, 2]);
    }

    #[test]
    fn a_key_alive_again_in_between_starts_afresh() {
        let mut gone = GoneTwice::default();
        assert!(gone.look([7], |_| true).is_empty());
        // Reused: alive at this look, so not gone twice at the next.
        assert!(gone.look([7], |_| false).is_empty());
        assert!(gone.look([7], |_| true).is_empty());
        assert_eq!(gone.look([7], |_| true), [7]);
    }

    #[test]
    fn kept_keys_come_back_and_let_go_ones_start_afresh() {
        let mut gone = GoneTwice::default();
        gone.look([1, 2], |_| true);
        assert_eq!(sorted(gone.look([1, 2], |_| true)), [1, 2]);
        // 1 was forgotten, 2 kept (still needed): 2 is gone twice again at the next look.
        gone.let_go(1);
        assert_eq!(gone.look([1, 2], |_| true), [2]);
        // A key that stops being a candidate is not remembered either.
        assert!(gone.look([], |_| true).is_empty());
        assert!(gone.look([2], |_| true).is_empty());
    }
}
