//! Our BOCD (Adams-MacKay model) against the `changepoint` crate's `Bocpd` with the same
//! Normal-Gamma prior and hazard: same run-length posteriors, same MAP change points.

use changepoint::{utils::map_changepoints, Bocpd, BocpdLike};
use rv::prelude::NormalGamma;
use whyslow_flows::bocd::{change_points, Bocd, BocdConfig, CpModel, NormalGammaPrior};

fn data() -> Vec<f64> {
    let mut s = 11u64;
    let mut xs = Vec::new();
    for (seg, (mean, sd)) in [(0.0, 1.0), (4.0, 0.5), (-2.0, 1.0), (1.0, 2.0)]
        .iter()
        .enumerate()
    {
        for _ in 0..(30 + 5 * seg) {
            // Sum of uniforms ≈ normal.
            let mut u = 0.0;
            for _ in 0..6 {
                s = s
                    .wrapping_mul(6364136223846793005)
                    .wrapping_add(1442695040888963407);
                u += (s >> 11) as f64 / (1u64 << 53) as f64;
            }
            xs.push(mean + sd * (u - 3.0));
        }
    }
    xs
}

fn cfg() -> BocdConfig {
    BocdConfig {
        hazard_lambda: 100.0,
        prune_eps: 0.0,
        max_run_lengths: 0,
        prior: NormalGammaPrior {
            mu: 0.0,
            kappa: 1.0,
            alpha: 1.0,
            beta: 1.0,
        },
        model: CpModel::AdamsMacKay,
        ..Default::default()
    }
}

#[test]
fn run_length_posteriors_match_changepoint_crate() {
    let xs = data();
    let c = cfg();
    // rv's NormalGamma(m, r, s, v): r = κ, s = 2β, v = 2α.
    let prior = NormalGamma::new_unchecked(
        c.prior.mu,
        c.prior.kappa,
        2.0 * c.prior.beta,
        2.0 * c.prior.alpha,
    );
    let mut theirs: Bocpd<f64, rv::dist::Gaussian, NormalGamma> =
        Bocpd::new(c.hazard_lambda, prior);
    let mut ours = Bocd::new(c);
    let mut all_r = Vec::new();
    let mut worst: f64 = 0.0;
    for &x in &xs {
        let r: Vec<f64> = theirs.step(&x).to_vec();
        ours.step(x);
        let mut mine = vec![0.0; r.len()];
        for (len, p) in ours.run_lengths() {
            if len < mine.len() {
                mine[len] = p;
            }
        }
        let l1: f64 = r.iter().zip(&mine).map(|(a, b)| (a - b).abs()).sum();
        worst = worst.max(l1);
        // MAP run lengths agree.
        let argmax = |v: &[f64]| {
            v.iter()
                .enumerate()
                .max_by(|a, b| a.1.total_cmp(b.1))
                .map(|x| x.0)
                .unwrap()
        };
        assert_eq!(
            argmax(&r),
            argmax(&mine),
            "MAP run length at t={}",
            all_r.len()
        );
        all_r.push(r);
    }
    // The crate stops updating run lengths once the remaining mass is < 1e-3, so the
    // posteriors agree to that order, not to machine precision.
    eprintln!("max L1 distance to the changepoint crate: {worst:e}");
    assert!(worst < 5e-3, "max L1 distance {worst}");
    // Same change points from the backward MAP walk (the crate reports the index of
    // the last point before each change; we report the first point after it).
    let theirs_cp: Vec<usize> = map_changepoints(&all_r)
        .into_iter()
        .filter(|&c| c > 0)
        .collect();
    let ours_cp = change_points(
        &xs,
        &BocdConfig {
            threshold: 0.0,
            ..c
        },
    );
    let near = |a: usize, b: usize| a.abs_diff(b) <= 1;
    assert_eq!(
        theirs_cp.len(),
        ours_cp.len(),
        "theirs {theirs_cp:?} ours {ours_cp:?}"
    );
    assert!(
        theirs_cp.iter().zip(&ours_cp).all(|(&a, &b)| near(a, b)),
        "theirs {theirs_cp:?} ours {ours_cp:?}"
    );
    // And they are the true boundaries 30, 65, 105.
    for (&want, &got) in [30usize, 65, 105].iter().zip(&ours_cp) {
        assert!(want.abs_diff(got) <= 2, "ours {ours_cp:?}");
    }
}

#[test]
fn pruning_keeps_the_posterior_close() {
    let xs = data();
    let exact = cfg();
    let pruned = BocdConfig {
        prune_eps: 1e-5,
        max_run_lengths: 64,
        ..exact
    };
    let (mut a, mut b) = (Bocd::new(exact), Bocd::new(pruned));
    for &x in &xs {
        a.step(x);
        b.step(x);
        assert_eq!(a.map_run_length().0, b.map_run_length().0);
        assert!(b.run_lengths().count() <= 64);
    }
}
