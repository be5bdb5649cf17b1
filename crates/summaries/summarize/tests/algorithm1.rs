//! Algorithm 1 (PerfTracker §4.2, critical execution duration) against a
//! brute-force search over every (l', r', g).

mod common;

use common::Rng;
use whyslow_summarize::critical_execution_duration;

/// Literal reading of Algorithm 1 + whyslow's tie rule: the smallest g for
/// which some [l', r'] with ≤ g consecutive zeros holds ≥ 0.8 S; among those
/// intervals the largest mass, then the shortest, then the leftmost.
fn brute(u: &[f32]) -> Option<(usize, usize)> {
    let n = u.len();
    let m: Vec<f64> = u
        .iter()
        .map(|&v| {
            if v.is_finite() && v > 0.0 {
                v as f64
            } else {
                0.0
            }
        })
        .collect();
    let s: f64 = m.iter().sum();
    if s <= 0.0 {
        return None;
    }
    // For each interval: mass and longest zero run (O(n^2) with running values).
    let mut ivs = Vec::new();
    for l in 0..n {
        let (mut mass, mut run, mut longest) = (0.0f64, 0usize, 0usize);
        for (r, &v) in m.iter().enumerate().skip(l) {
            mass += v;
            if v == 0.0 {
                run += 1;
                longest = longest.max(run);
            } else {
                run = 0;
            }
            ivs.push((l, r, mass, longest));
        }
    }
    for g in 0..=n {
        let valid: Vec<_> = ivs
            .iter()
            .filter(|iv| iv.2 >= 0.8 * s && iv.3 <= g)
            .collect();
        if valid.is_empty() {
            continue;
        }
        let best = valid
            .iter()
            .min_by(|a, b| {
                b.2.total_cmp(&a.2)
                    .then((a.1 - a.0).cmp(&(b.1 - b.0)))
                    .then(a.0.cmp(&b.0))
            })
            .unwrap();
        // The chosen interval is unique: no other valid one has its mass and length.
        let ties = valid
            .iter()
            .filter(|iv| iv.2 == best.2 && iv.1 - iv.0 == best.1 - best.0)
            .count();
        assert_eq!(ties, 1, "tie for {u:?}");
        return Some((best.0, best.1));
    }
    unreachable!("g = n is always feasible")
}

/// Random series of dyadic values (exact in f32 and in f64 sums, so the 0.8 S
/// comparisons are the same in both implementations), with many zeros.
fn series(rng: &mut Rng) -> Vec<f32> {
    let n = rng.below(40) as usize;
    let p_zero = [0.0, 0.3, 0.6, 0.9, 0.97][rng.below(5) as usize];
    let runs = rng.chance(0.5);
    let mut u = Vec::with_capacity(n);
    while u.len() < n {
        let v = if rng.chance(p_zero) {
            0.0
        } else {
            (1 + rng.below(64)) as f32 / 64.0
        };
        let reps = if runs { 1 + rng.below(6) as usize } else { 1 };
        for _ in 0..reps.min(n - u.len()) {
            u.push(v);
        }
    }
    u
}

#[test]
fn perftracker_4_2_algorithm1_matches_brute_force() {
    let mut rng = Rng(7);
    let mut found = 0;
    for _ in 0..5000 {
        let u = series(&mut rng);
        let got = critical_execution_duration(&u);
        assert_eq!(got, brute(&u), "{u:?}");
        found += got.is_some() as usize;
    }
    assert!(found > 3000);
}

#[test]
fn perftracker_4_2_algorithm1_invariants_on_long_noisy_series() {
    // Non-dyadic values and NaNs: check the definition's invariants directly.
    let mut rng = Rng(99);
    for _ in 0..300 {
        let n = 1 + rng.below(3000) as usize;
        let u: Vec<f32> = (0..n)
            .map(|_| match rng.below(10) {
                0..=5 => 0.0,
                6 => f32::NAN,
                _ => (rng.below(1000) as f32) / 999.0,
            })
            .collect();
        let m = |v: f32| {
            if v.is_finite() && v > 0.0 {
                v as f64
            } else {
                0.0
            }
        };
        let s: f64 = u.iter().map(|&v| m(v)).sum();
        match critical_execution_duration(&u) {
            None => assert_eq!(s, 0.0),
            Some((l, r)) => {
                assert!(l <= r && r < n);
                assert!(m(u[l]) > 0.0 && m(u[r]) > 0.0, "trimmed to non-zero ends");
                let inside: f64 = u[l..=r].iter().map(|&v| m(v)).sum();
                assert!(inside >= 0.8 * s * (1.0 - 1e-9));
            }
        }
    }
}

#[test]
fn algorithm1_large_input_is_fast_enough() {
    let mut rng = Rng(3);
    let u: Vec<f32> = (0..1_000_000)
        .map(|_| if rng.chance(0.5) { 0.0 } else { 0.5 })
        .collect();
    let t = std::time::Instant::now();
    assert!(critical_execution_duration(&u).is_some());
    assert!(t.elapsed().as_secs_f64() < 5.0);
}
