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

/// One-sided Mann–Whitney U test that the values of `x` tend to be greater
/// than those of `y` (a rerun's times before a fix against after it): the
/// p-value of U = #{(i, j): x_i > y_j} + ½ #{x_i = y_j} under the null
/// hypothesis that both come from one distribution. Exact (every
/// arrangement counted) without ties and with at most 50 values a side, the
/// normal approximation with the tie correction and a continuity correction
/// otherwise (as scipy's `mannwhitneyu(x, y, alternative="greater")`).
/// `None` when a side is empty or holds a NaN.
pub fn mann_whitney_greater(x: &[f64], y: &[f64]) -> Option<f64> {
    let (m, n) = (x.len(), y.len());
    if m == 0 || n == 0 || x.iter().chain(y).any(|v| v.is_nan()) {
        return None;
    }
    let mut u = 0.0f64;
    for a in x {
        for b in y {
            u += if a > b {
                1.0
            } else if a == b {
                0.5
            } else {
                0.0
            };
        }
    }
    // Ranks of the pooled values (mid-ranks for ties) and the tie groups.
    let mut pooled: Vec<f64> = x.iter().chain(y).copied().collect();
    pooled.sort_by(f64::total_cmp);
    let mut tie_term = 0.0;
    let mut i = 0;
    while i < pooled.len() {
        let j = pooled[i..].iter().take_while(|&&v| v == pooled[i]).count();
        let t = j as f64;
        tie_term += t * t * t - t;
        i += j;
    }
    if tie_term == 0.0 && m <= 50 && n <= 50 {
        return Some(exact_upper_tail(m, n, u.round() as usize));
    }
    let (mf, nf) = (m as f64, n as f64);
    let total = mf + nf;
    let mean = mf * nf / 2.0;
    let var = mf * nf / 12.0 * ((total + 1.0) - tie_term / (total * (total - 1.0)));
    if var <= 0.0 {
        return Some(if u > mean { 0.0 } else { 1.0 });
    }
    let z = (u - mean - 0.5) / var.sqrt();
    Some(0.5 * erfc(z / std::f64::consts::SQRT_2))
}

/// P(U ≥ u) over all arrangements of `m` and `n` distinct values: counts of
/// U by the recurrence c(m, n, u) = c(m−1, n, u−n) + c(m, n−1, u).
fn exact_upper_tail(m: usize, n: usize, u: usize) -> f64 {
    let max_u = m * n;
    // counts[j][v]: arrangements of i x's and j y's with U = v, for the
    // current i; i grows from 0 to m.
    let mut counts: Vec<Vec<f64>> = (0..=n).map(|_| vec![0.0; max_u + 1]).collect();
    for row in counts.iter_mut() {
        row[0] = 1.0;
    }
    for _ in 1..=m {
        let mut next: Vec<Vec<f64>> = (0..=n).map(|_| vec![0.0; max_u + 1]).collect();
        for j in 0..=n {
            for v in 0..=max_u {
                // The largest value is an x (it beats all j y's) or a y.
                let mut c = if v >= j { counts[j][v - j] } else { 0.0 };
                if j > 0 {
                    c += next[j - 1][v];
                }
                next[j][v] = c;
            }
        }
        counts = next;
    }
    let all = &counts[n];
    let total: f64 = all.iter().sum();
    all[u.min(max_u)..].iter().sum::<f64>() / total
}

/// The complementary error function (W. J. Cody's rational approximations
/// via the Numerical Recipes `erfc`, relative error < 1.2e-7).
fn erfc(x: f64) -> f64 {
    let z = x.abs();
    let t = 1.0 / (1.0 + 0.5 * z);
    let r = t
        * (-z * z - 1.265_512_23
            + t * (1.000_023_68
                + t * (0.374_091_96
                    + t * (0.096_784_18
                        + t * (-0.186_288_06
                            + t * (0.278_868_07
                                + t * (-1.135_203_98
                                    + t * (1.488_515_87
                                        + t * (-0.822_152_23 + t * 0.170_872_77)))))))))
            .exp();
    if x >= 0.0 {
        r
    } else {
        2.0 - r
    }
}

#[cfg(test)]
mod tests {
    use super::{mann_whitney_greater, median};

    #[test]
    fn mann_whitney_matches_scipy() {
        // scipy.stats.mannwhitneyu(x, y, alternative="greater") (1.11):
        // exact without ties, asymptotic with them.
        let x = [1.9, 2.1, 2.3, 2.0, 2.2];
        let y = [1.0, 1.2, 1.1, 1.3, 1.4];
        let p = mann_whitney_greater(&x, &y).unwrap();
        assert!((p - 1.0 / 252.0).abs() < 1e-12, "{p}");
        // The other way round: every arrangement is at least as extreme.
        assert!((mann_whitney_greater(&y, &x).unwrap() - 1.0).abs() < 1e-12);
        // Interleaved: U = 7 of 16 for 4 against 4, P(U >= 7) = 46/70.
        let p = mann_whitney_greater(&[1.0, 3.0, 5.0, 8.0], &[2.0, 4.0, 6.0, 7.0]).unwrap();
        assert!((p - 46.0 / 70.0).abs() < 1e-12, "{p}");
        // Ties: the normal approximation (U = 14, mean 8, σ² = 10.571 with
        // the tie correction, z = 1.6916 after the continuity correction).
        let p = mann_whitney_greater(&[3.0, 3.0, 4.0, 5.0], &[1.0, 2.0, 3.0, 3.0]).unwrap();
        assert!((p - 0.04536).abs() < 1e-4, "{p}");
        assert_eq!(mann_whitney_greater(&[], &[1.0]), None);
        assert_eq!(mann_whitney_greater(&[f64::NAN], &[1.0]), None);
    }

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
