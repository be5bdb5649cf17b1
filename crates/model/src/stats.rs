//! The one median every layer uses: the middle value, the mean of the two
//! middle values for an even count, `None` for no values. Callers say what
//! "no values" means to them (`.unwrap_or(0.0)` where an absent peer counts
//! as zero time, `?` where there is nothing to compare).

/// The median of `values` (reordered in place, O(n)); `None` when empty.
/// Values are ordered by [`f64::total_cmp`], so a NaN never panics (it sorts
/// above every number); callers that may hold NaN filter it first.
pub fn median(values: &mut [f64]) -> Option<f64> {
    let n = values.len();
    if n == 0 {
        return None;
    }
    let mid = n / 2;
    let (below, &mut hi, _) = values.select_nth_unstable_by(mid, f64::total_cmp);
    if n % 2 == 1 {
        Some(hi)
    } else {
        let lo = below.iter().copied().fold(f64::NEG_INFINITY, f64::max);
        Some((lo + hi) / 2.0)
    }
}

#[cfg(test)]
mod tests {
    use super::median;

    #[test]
    fn odd_even_empty_and_nan() {
        assert_eq!(median(&mut []), None);
        assert_eq!(median(&mut [3.0]), Some(3.0));
        assert_eq!(median(&mut [5.0, 1.0, 3.0]), Some(3.0));
        assert_eq!(median(&mut [4.0, 1.0, 3.0, 2.0]), Some(2.5));
        assert_eq!(median(&mut [-1.0, -3.0]), Some(-2.0));
        // A NaN sorts last: the median of the numbers below it is kept.
        assert_eq!(median(&mut [f64::NAN, 1.0, 2.0]), Some(2.0));
    }

    #[test]
    fn matches_sorting_on_random_values() {
        let mut rng = crate::rng::SplitMix64::new(11);
        for n in 1..60 {
            let v: Vec<f64> = (0..n).map(|_| rng.below(1000) as f64 / 7.0).collect();
            let mut sorted = v.clone();
            sorted.sort_by(f64::total_cmp);
            let want = if n % 2 == 1 {
                sorted[n / 2]
            } else {
                (sorted[n / 2 - 1] + sorted[n / 2]) / 2.0
            };
            assert_eq!(median(&mut v.clone()), Some(want), "n = {n}");
        }
    }
}
