//! What this replica knows of Redis' clock, so that a call can carry its
//! caller's answer-by time in Redis' own terms: scripts compare it with
//! `TIME` and refuse to grant past it (a stalled Redis that wakes up must
//! not grant to callers that were already told no).
//!
//! Every function reply carries Redis' `now`. Taken when the reply
//! arrives, `now - local clock` is a lower bound of the true offset
//! between the two clocks (the reply spent some time on its way), so an
//! answer-by time computed from it is never later than the true one: a
//! bound can only refuse a grant early, never let one land late. The
//! estimate used is the best (highest) lower bound of the previous second,
//! so one slow reply costs nothing and a clock step is followed within
//! two seconds.
//!
//! Why a std `Mutex`: held for a few arithmetic steps, never across an
//! `.await`.

use std::sync::Mutex;
use std::time::{Duration, Instant};

/// How often the estimate moves to the best bound seen since.
const WINDOW: Duration = Duration::from_secs(1);

#[derive(Default)]
pub struct RedisClock {
    state: Mutex<State>,
}

#[derive(Default)]
struct State {
    /// Redis clock minus this replica's, in ms (None until a reply came).
    offset: Option<i64>,
    /// The best lower bound seen in the current window, and its start.
    best: Option<i64>,
    since: Option<Instant>,
}

impl RedisClock {
    /// Learns from a reply that Redis' clock read `redis_now_ms` before
    /// it arrived (now).
    pub fn observe(&self, redis_now_ms: i64) {
        let bound = redis_now_ms - unix_ms();
        let mut state = self.state.lock().unwrap();
        let now = Instant::now();
        state.best = Some(state.best.map_or(bound, |best| best.max(bound)));
        let window_over = state.since.is_none_or(|since| now - since >= WINDOW);
        if state.offset.is_none() || window_over {
            state.offset = state.best.take();
            state.since = Some(now);
        }
    }

    /// Redis' clock now, as far as this replica can tell (its own clock
    /// until a reply came).
    pub fn now_ms(&self) -> i64 {
        unix_ms() + self.state.lock().unwrap().offset.unwrap_or(0)
    }

    /// The answer-by argument of a call sent now whose caller stops
    /// listening after `budget`: Redis ms, never later than the truth.
    pub fn answer_by(&self, budget: Duration) -> i64 {
        self.now_ms() + budget.as_millis() as i64
    }
}

pub use crate::wallclock::unix_ms;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_estimate_is_a_lower_bound_that_follows_the_best_reply() {
        let clock = RedisClock::default();
        // Redis 5 s ahead; the first reply took 300 ms on its way back.
        clock.observe(unix_ms() + 5_000 - 300);
        let first = clock.now_ms() - unix_ms();
        assert!((4_690..=4_710).contains(&first), "{first}");
        // A faster reply tightens the bound once the window is over.
        clock.observe(unix_ms() + 5_000 - 1);
        std::thread::sleep(WINDOW + Duration::from_millis(10));
        clock.observe(unix_ms() + 5_000 - 200);
        let later = clock.now_ms() - unix_ms();
        assert!((4_990..=5_000).contains(&later), "{later}");
        // The answer-by time adds the caller's budget.
        let by = clock.answer_by(Duration::from_millis(2_000)) - unix_ms();
        assert!((6_990..=7_000).contains(&by), "{by}");
    }
}
