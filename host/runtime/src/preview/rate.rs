//! The per-door rate bound: a token bucket (`burst` requests at once, refilled at
//! `per_second`). Pure over the clock it is handed.

use std::time::Instant;

/// One door's bucket.
#[derive(Debug, Clone)]
pub struct Bucket {
    tokens: f64,
    at: Instant,
}

/// The bound every door shares.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Bound {
    /// Requests admitted at once from a full bucket.
    pub burst: u32,
    /// Requests per second refilled.
    pub per_second: u32,
}

impl Bucket {
    /// A full bucket at `now`.
    pub fn full(bound: Bound, now: Instant) -> Self {
        Self {
            tokens: f64::from(bound.burst),
            at: now,
        }
    }

    /// Take one request at `now`: false when the bound refuses it.
    pub fn take(&mut self, bound: Bound, now: Instant) -> bool {
        let elapsed = now.saturating_duration_since(self.at).as_secs_f64();
        self.at = now.max(self.at);
        self.tokens =
            (self.tokens + elapsed * f64::from(bound.per_second)).min(f64::from(bound.burst));
        if self.tokens >= 1.0 {
            self.tokens -= 1.0;
            true
        } else {
            false
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    #[test]
    fn burst_then_refill() {
        let bound = Bound {
            burst: 3,
            per_second: 2,
        };
        let t0 = Instant::now();
        let mut b = Bucket::full(bound, t0);
        let ms = |n| t0 + Duration::from_millis(n);
        // (at ms, admitted)
        let rows = [
            (0, true),
            (0, true),
            (0, true),
            (0, false),
            (100, false),
            (500, true),
            (500, false),
            (5_000, true),
            (5_000, true),
            (5_000, true),
            (5_000, false),
        ];
        for (i, (at, want)) in rows.into_iter().enumerate() {
            assert_eq!(b.take(bound, ms(at)), want, "row {i} at {at} ms");
        }
    }
}
