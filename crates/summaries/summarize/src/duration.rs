//! Algorithm 1 of PerfTracker §4.2: the critical execution duration L(e).

/// Fraction of the total mass S that the critical execution duration must hold
/// (Algorithm 1, condition (1): `Σ U ≥ 0.8 × S`).
pub const CRITICAL_MASS_FRACTION: f64 = 0.8;

/// Finds the critical execution duration L(e) = [l_c, r_c] of one execution
/// from its utilization samples `u` (PerfTracker §4.2, Algorithm 1, Figure 10).
///
/// Binary search over g, the largest number of *consecutive* zero samples the
/// interval may contain, for the smallest g such that some sub-interval
/// [l', r'] with at most g consecutive zeros holds at least 80 % of the total
/// mass S = Σ U_i. For a given g the check is O(n): zero runs longer than g
/// split the series into pieces; since U ≥ 0 the heaviest interval inside a
/// piece is the piece itself, so g is feasible iff some piece holds ≥ 0.8 S.
/// The whole search is O(n log n).
///
/// **Which interval** (the paper does not say): for the smallest feasible g we
/// return the interval of *largest mass*, and among those the shortest. It is
/// unique: at most one piece can hold ≥ 0.8 S > S / 2, and the shortest
/// interval with that piece's whole mass is the piece with its leading and
/// trailing zeros cut off. So the result starts and ends on non-zero samples,
/// and a uniformly busy execution keeps its whole duration.
///
/// Returns **inclusive** sample indices `(l_c, r_c)` (as in the paper), or
/// `None` when `u` is empty or holds no mass (all zeros). Samples that are NaN,
/// infinite or ≤ 0 count as zeros; values above 1 count with their value.
/// Never panics.
pub fn critical_execution_duration(u: &[f32]) -> Option<(usize, usize)> {
    // Run-length encode: alternating runs of non-zero samples (with their mass)
    // and zero samples. Summing S over the same runs in the same order as the
    // pieces keeps the g = max-run check exactly feasible.
    let mut runs: Vec<Run> = Vec::new();
    let mut total = 0.0f64;
    let mut longest_zero = 0usize;
    let mut i = 0usize;
    while i < u.len() {
        let start = i;
        if mass(u[i]) > 0.0 {
            let mut m = 0.0f64;
            while i < u.len() && mass(u[i]) > 0.0 {
                m += mass(u[i]);
                i += 1;
            }
            total += m;
            runs.push(Run {
                start,
                end: i,
                mass: m,
            });
        } else {
            while i < u.len() && mass(u[i]) <= 0.0 {
                i += 1;
            }
            longest_zero = longest_zero.max(i - start);
            runs.push(Run {
                start,
                end: i,
                mass: -1.0,
            });
        }
    }
    if total <= 0.0 || !total.is_finite() {
        return None;
    }
    let need = CRITICAL_MASS_FRACTION * total;

    // Algorithm 1, lines 2–10. g ≥ longest_zero is always feasible (one piece
    // holding every non-zero sample), so the right bound can start there
    // instead of n without changing the result.
    let mut g_left = 0usize;
    let mut g_right = longest_zero.min(u.len());
    let mut best = None;
    while g_left <= g_right {
        let g = g_left + (g_right - g_left) / 2;
        match feasible(&runs, g, need) {
            Some(iv) => {
                best = Some(iv);
                if g == 0 {
                    break;
                }
                g_right = g - 1;
            }
            None => g_left = g + 1,
        }
    }
    best
}

/// A maximal run of non-zero samples (`mass > 0`) or of zeros (`mass < 0`),
/// half-open sample indices.
#[derive(Clone, Copy)]
struct Run {
    start: usize,
    end: usize,
    mass: f64,
}

/// The mass one sample contributes: its value when finite and positive, else 0.
#[inline]
fn mass(v: f32) -> f64 {
    if v.is_finite() && v > 0.0 {
        v as f64
    } else {
        0.0
    }
}

/// The piece (trimmed of edge zeros) holding ≥ `need`, if zero runs longer
/// than `g` split the series so that one does.
fn feasible(runs: &[Run], g: usize, need: f64) -> Option<(usize, usize)> {
    // Current piece: first and last non-zero sample and its mass.
    let mut piece: Option<(usize, usize, f64)> = None;
    for r in runs {
        if r.mass >= 0.0 {
            piece = Some(match piece {
                Some((l, _, m)) => (l, r.end - 1, m + r.mass),
                None => (r.start, r.end - 1, r.mass),
            });
        } else if r.end - r.start > g {
            if let Some((l, rr, m)) = piece.take() {
                if m >= need {
                    return Some((l, rr));
                }
            }
        }
    }
    match piece {
        Some((l, r, m)) if m >= need => Some((l, r)),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn empty_and_all_zero_have_no_critical_duration() {
        assert_eq!(critical_execution_duration(&[]), None);
        assert_eq!(critical_execution_duration(&[0.0; 17]), None);
        assert_eq!(
            critical_execution_duration(&[f32::NAN, -1.0, 0.0, f32::NEG_INFINITY]),
            None
        );
    }

    #[test]
    fn uniform_busy_keeps_whole_execution() {
        assert_eq!(critical_execution_duration(&[0.5; 10]), Some((0, 9)));
    }

    #[test]
    fn figure10_idle_prefix_is_cut() {
        // PerfTracker §4.2, Figure 10: early arrival, sporadic bursts, then the
        // real transfer.
        let u = [
            0.0, 0.0, 0.1, 0.0, 0.0, 0.0, 0.0, 0.1, 0.0, 0.0, 0.0, 0.0, 0.9, 0.8, 0.9, 0.0, 0.9,
            0.9, 0.0, 0.0,
        ];
        assert_eq!(critical_execution_duration(&u), Some((12, 17)));
    }

    #[test]
    fn nan_counts_as_zero() {
        let u = [f32::NAN, 1.0, 1.0, f32::NAN, f32::INFINITY];
        assert_eq!(critical_execution_duration(&u), Some((1, 2)));
    }
}
