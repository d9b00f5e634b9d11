//! Integer apportioning: sharing counts, histogram slots and times among parts in given
//! proportions so that every part's figures stay possible and every field sums exactly.

use tracer_common::{log2_slot, AggKey, AggValue, HIST_SLOTS};

use crate::model::histogram::slot_bounds;

/// Shares `rest` (an entry's events that were not copied) among `parts` (its unwound stacks)
/// in proportion to their copied events, as whole events: every part gets an integer number of
/// events, each in a histogram slot, and a time those events can add up to, so that no part
/// shows an impossible figure (an average above its maximum, a maximum above its total). Every
/// field sums exactly to `rest`'s. Returns, per part, whether it got anything: its maximum is
/// then only an upper bound.
pub(super) fn spread(rest: &AggValue, parts: &mut [(AggKey, AggValue)]) -> Vec<bool> {
    let weights: Vec<u64> = parts.iter().map(|(_, v)| v.count.max(1)).collect();
    let hist = fitted_hist(&rest.hist, rest.count, rest.max_ns);
    let counts = split(rest.count, &weights);
    let cells = apportion(&hist, &counts, &weights);
    let totals = split_time(rest, &cells, &counts);
    // Off-CPU parts nest (uninterruptible within sleeping, sleeping and runnable within the
    // total): each is split within the room its part has left, so the nesting holds per part.
    let sleeping = split(rest.sleeping_ns, &totals);
    let room: Vec<u64> = totals
        .iter()
        .zip(&sleeping)
        .map(|(t, s)| t.saturating_sub(*s))
        .collect();
    let runnable = split(rest.runnable_ns, &room);
    let uninterruptible = split(rest.uninterruptible_ns, &sleeping);
    let contended = split(rest.contended_ns, &totals);
    let mut received = Vec::with_capacity(parts.len());
    for (i, (_, part)) in parts.iter_mut().enumerate() {
        part.count += counts[i];
        part.total_ns += totals[i];
        part.sleeping_ns += sleeping[i];
        part.runnable_ns += runnable[i];
        part.uninterruptible_ns += uninterruptible[i];
        part.contended_ns += contended[i];
        for (slot, n) in cells[i].iter().enumerate() {
            part.hist[slot] += n;
        }
        if let Some(top) = cells[i].iter().rposition(|&n| n > 0) {
            // The part's share of the rest is in slot `top` at most, and no event of the
            // rest was longer than its maximum.
            let largest = slot_bounds(top).1 - 1;
            part.max_ns = part.max_ns.max(largest.min(rest.max_ns));
        }
        part.max_ns = part
            .max_ns
            .min(part.total_ns)
            .max(part.total_ns / part.count.max(1));
        received.push(counts[i] > 0 || totals[i] > 0);
    }
    received
}

/// `hist` made to hold exactly `count` events (the kernel's per-CPU counters and histograms
/// are not updated together, and a clamped move can leave them apart): missing events go to
/// the maximum's slot, extra ones leave from the lowest slots.
pub(super) fn fitted_hist(hist: &[u64; HIST_SLOTS], count: u64, max_ns: u64) -> [u64; HIST_SLOTS] {
    let mut hist = *hist;
    let held: u64 = hist.iter().sum();
    if held < count {
        hist[log2_slot(max_ns)] += count - held;
    }
    let mut extra = held.saturating_sub(count);
    for n in hist.iter_mut() {
        let gone = extra.min(*n);
        *n -= gone;
        extra -= gone;
    }
    hist
}

/// Each column (a histogram slot's events, a record's wait time) shared among parts in
/// proportion to `weights`, so that part `i` gets exactly `rows[i]` in all (`rows` sums to the
/// columns): each part first gets the whole units of its exact share of every column, then a
/// column's remaining units go to the parts still short of their row, largest remainders first.
pub(super) fn apportion(columns: &[u64], rows: &[u64], weights: &[u64]) -> Vec<Vec<u64>> {
    let sum: u128 = weights.iter().map(|&w| w as u128).sum::<u128>().max(1);
    let mut cells = vec![vec![0u64; columns.len()]; rows.len()];
    for (slot, &n) in columns.iter().enumerate() {
        for (part, &w) in cells.iter_mut().zip(weights) {
            part[slot] = (n as u128 * w as u128 / sum) as u64;
        }
    }
    let mut short: Vec<u64> = rows
        .iter()
        .zip(&cells)
        .map(|(row, part)| row.saturating_sub(part.iter().sum()))
        .collect();
    for (slot, &n) in columns.iter().enumerate() {
        let mut left = n - cells.iter().map(|part| part[slot]).sum::<u64>();
        let mut order: Vec<usize> = (0..rows.len()).collect();
        order.sort_by_key(|&i| std::cmp::Reverse(n as u128 * weights[i] as u128 % sum));
        // One each by remainder, then as many as the rows still lack: the rows' shortfall
        // always equals the units left in this column and the next, so nothing is left over.
        for at_most in [1, u64::MAX] {
            for &i in &order {
                let give = left.min(short[i]).min(at_most);
                cells[i][slot] += give;
                short[i] -= give;
                left -= give;
            }
        }
    }
    cells
}

/// `rest.total_ns` shared among parts holding the events `cells`, each part's time within what
/// its events can add up to (every event lies in its slot, and is no longer than the rest's
/// maximum), the slack shared in proportion to each part's room.
pub(super) fn split_time(rest: &AggValue, cells: &[Vec<u64>], counts: &[u64]) -> Vec<u64> {
    let bounds = |part: &Vec<u64>| {
        part.iter()
            .enumerate()
            .fold((0u128, 0u128), |(lo, hi), (slot, &n)| {
                let (low, high) = slot_bounds(slot);
                let largest = (high - 1).min(rest.max_ns).max(low);
                (
                    lo + n as u128 * low as u128,
                    hi + n as u128 * largest as u128,
                )
            })
    };
    let (lows, highs): (Vec<u128>, Vec<u128>) = cells.iter().map(bounds).unzip();
    let (low, high): (u128, u128) = (lows.iter().sum(), highs.iter().sum());
    let total = rest.total_ns as u128;
    let clamp = |v: u128| v.min(u64::MAX as u128) as u64;
    let add = |base: &[u128], extra: Vec<u64>| -> Vec<u64> {
        base.iter().zip(extra).map(|(b, e)| clamp(*b) + e).collect()
    };
    if total <= low {
        // Fewer nanoseconds than the slots' lower bounds (not consistent): by those bounds.
        let weights: Vec<u64> = lows.iter().map(|&l| clamp(l)).collect();
        split(rest.total_ns, &weights)
    } else if total >= high {
        let extra = split(clamp(total - high), counts);
        add(&highs, extra)
    } else {
        let room: Vec<u64> = lows.iter().zip(&highs).map(|(l, h)| clamp(h - l)).collect();
        let extra = split(clamp(total - low), &room);
        add(&lows, extra)
    }
}

/// `total` split in proportion to `weights`, summing to `total` exactly (all to the first when
/// every weight is zero).
pub(super) fn split(total: u64, weights: &[u64]) -> Vec<u64> {
    let sum: u128 = weights.iter().map(|&w| w as u128).sum();
    if sum == 0 {
        let mut shares = vec![0; weights.len()];
        if let Some(first) = shares.first_mut() {
            *first = total;
        }
        return shares;
    }
    let exact: Vec<u128> = weights.iter().map(|&w| total as u128 * w as u128).collect();
    let mut shares: Vec<u64> = exact.iter().map(|e| (e / sum) as u64).collect();
    let mut left = total - shares.iter().sum::<u64>();
    let mut by_remainder: Vec<usize> = (0..weights.len()).collect();
    by_remainder.sort_by_key(|&i| std::cmp::Reverse(exact[i] % sum));
    for i in by_remainder {
        if left == 0 {
            break;
        }
        shares[i] += 1;
        left -= 1;
    }
    shares
}
